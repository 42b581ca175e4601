"""Large infer bodies received straight into their own buffer (server/http/receive.py).

A body with a declared Content-Length over 64 KiB bypasses the HTTP parser once its headers
are read: the reads go into an array of exactly that size, and the connection gets a fresh
parser when the body is complete. What a client must see is unchanged: the same values back at
every size and framing (one write, many small writes, chunked), pipelined requests behind a
large body answered in order, limits and budget refusals with their texts, and the budget given
back when a client gives up half-way. Raw sockets, against a server subprocess.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from examples.common import finish_model, write_model_dir
from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

KIB = 1024
MIB = 1024 * KIB
INFER = "/v2/models/bytes_id/infer"
MAX_INPUT = 5 * MIB
BUDGET = 12 * MIB
TIMEOUT = 20.0


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`bytes_id`: ONNX Identity over UINT8 [-1], unbatched, so a body may have any size."""
    root = tmp_path_factory.mktemp("repo")
    graph = onnx.GraphProto(
        name="bytes_id",
        node=[onnx.NodeProto(op_type="Identity", input=["INPUT0"], output=["OUTPUT0"])],
        input=[_uint8_vector("INPUT0")],
        output=[_uint8_vector("OUTPUT0")],
    )
    config = (
        'name: "bytes_id"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [{ name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] }]\n'
        'output [{ name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] }]\n'
    )
    write_model_dir(root, "bytes_id", finish_model(graph, "UINT8 passthrough."), config)
    return root


def _uint8_vector(name: str) -> onnx.ValueInfoProto:
    value = onnx.ValueInfoProto(name=name)
    value.type.tensor_type.elem_type = onnx.TensorProto.UINT8
    value.type.tensor_type.shape.dim.add().dim_param = "n"
    return value


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(
        [repository],
        [
            "--http-max-input-size",
            str(MAX_INPUT),
            "--http-max-inflight-body-size",
            str(BUDGET),
            "--http-body-timeout-secs",
            "30",
        ],
        log_dir=tmp_path_factory.mktemp("logs"),
    ) as proc:
        yield proc


# ----- requests and answers ---------------------------------------------------------------


def tensor(size: int, seed: int) -> bytes:
    """`size` bytes no other test request repeats."""
    return ((np.arange(size, dtype=np.int64) * 7 + seed) % 251).astype(np.uint8).tobytes()


def infer_body(data: bytes) -> tuple[bytes, int]:
    """A JSON+binary request carrying `data` as INPUT0, asking for OUTPUT0 in binary."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [len(data)],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return header + data, len(header)


def head(header_length: int, content_length: int | None) -> bytes:
    framing = (
        "Transfer-Encoding: chunked"
        if content_length is None
        else f"Content-Length: {content_length}"
    )
    return (
        f"POST {INFER} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Inference-Header-Content-Length: {header_length}\r\n{framing}\r\n\r\n"
    ).encode()


def request(data: bytes) -> bytes:
    body, header_length = infer_body(data)
    return head(header_length, len(body)) + body


class Connection:
    """A client socket reading Content-Length framed answers one at a time."""

    def __init__(self, server: ServerProcess) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=TIMEOUT)
        self.buffer = bytearray()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buffer += data

    def read(self) -> tuple[int, dict[str, str], bytes]:
        """(status, headers in lower case, body) of the next answer."""
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        end = self.buffer.index(b"\r\n\r\n")
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        del self.buffer[: end + 4]
        headers = {}
        for line in lines[1:]:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        size = int(headers["content-length"])
        while len(self.buffer) < size:
            self._fill()
        body = bytes(self.buffer[:size])
        del self.buffer[:size]
        return int(lines[0].split(" ")[1]), headers, body

    def closed_by_server(self) -> bool:
        self.sock.settimeout(5.0)
        try:
            return not self.buffer and self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def output_of(answer: tuple[int, dict[str, str], bytes]) -> bytes:
    """OUTPUT0's bytes from a 200 answer with a binary output."""
    status, headers, body = answer
    assert status == 200, body[:500]
    length = int(headers["inference-header-content-length"])
    (entry,) = json.loads(body[:length])["outputs"]
    assert entry["name"] == "OUTPUT0" and entry["datatype"] == "UINT8"
    assert entry["parameters"]["binary_data_size"] == len(body) - length
    return body[length:]


def error_of(answer: tuple[int, dict[str, str], bytes], status: int) -> str:
    assert answer[0] == status, answer[2][:500]
    return str(json.loads(answer[2])["error"])


# ----- values -----------------------------------------------------------------------------

SIZES = [4 * KIB, 64 * KIB - 300, 64 * KIB + 1, 300 * KIB, 4 * MIB]


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size}B")
@pytest.mark.parametrize("framing", ["one-write", "7KiB-pieces", "chunked"])
def test_every_size_and_framing_comes_back_exact(
    server: ServerProcess, size: int, framing: str
) -> None:
    """The output is the input, byte for byte, however the body arrives; the connection then
    serves the next request (its parser is in step again)."""
    data = tensor(size, seed=size % 97)
    body, header_length = infer_body(data)
    with Connection(server) as conn:
        if framing == "chunked":
            conn.send(head(header_length, None))
            piece = 100 * KIB
            for start in range(0, len(body), piece):
                chunk = body[start : start + piece]
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.send(b"0\r\n\r\n")
        elif framing == "7KiB-pieces":
            conn.send(head(header_length, len(body)))
            for start in range(0, len(body), 7 * KIB):
                conn.send(body[start : start + 7 * KIB])
        else:
            conn.send(head(header_length, len(body)) + body)
        assert output_of(conn.read()) == data
        small = tensor(100, seed=3)
        conn.send(request(small))
        assert output_of(conn.read()) == small


def test_requests_pipelined_behind_large_bodies_answer_in_order(server: ServerProcess) -> None:
    """A 300 KiB, a 4 MiB and a 100-byte request in one write: three answers, in order."""
    tensors = [tensor(300 * KIB, 1), tensor(4 * MIB, 2), tensor(100, 4), tensor(70 * KIB, 5)]
    with Connection(server) as conn:
        conn.send(b"".join(request(data) for data in tensors))
        for data in tensors:
            assert output_of(conn.read()) == data
        assert not conn.closed_by_server()


# ----- limits -----------------------------------------------------------------------------


def test_a_declared_length_over_the_limit_is_refused_before_its_body(
    server: ServerProcess,
) -> None:
    with Connection(server) as conn:
        conn.send(head(10, MAX_INPUT + 1))
        text = error_of(conn.read(), 413)
        assert text == (
            f"request body size exceeds the maximum allowed input size of {MAX_INPUT} bytes. "
            "Use --http-max-input-size to increase the limit."
        )
        assert conn.closed_by_server()


def test_a_large_body_past_the_budget_is_refused_mid_way(server: ServerProcess) -> None:
    """Bodies in flight past --http-max-inflight-body-size: the large body being received is
    refused with 503 and its connection closed; once the others are gone it fits again."""
    stalled = []
    try:
        for _ in range(2):  # 2 x 4.5 MiB held by chunked bodies that stop
            sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=TIMEOUT)
            sock.sendall(head(10, None) + b"%x\r\n" % (5 * MIB) + b"x" * (4 * MIB + MIB // 2))
            stalled.append(sock)
        data = tensor(4 * MIB, 6)
        deadline = time.monotonic() + 15
        while True:  # until the server has taken in the stalled bodies
            answer = _attempt(server, request(data))
            if (answer is not None and answer[0] != 200) or time.monotonic() > deadline:
                break
        assert answer is not None
        text = error_of(answer, 503)
        assert "--http-max-inflight-body-size" in text
        assert answer[1]["connection"] == "close"
    finally:
        for sock in stalled:
            sock.close()
    deadline = time.monotonic() + 15
    while True:  # the stalled bodies' bytes are given back as their connections close
        answer = _attempt(server, request(data))
        if (answer is not None and answer[0] == 200) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert answer is not None and output_of(answer) == data


def _attempt(server: ServerProcess, data: bytes) -> tuple[int, dict[str, str], bytes] | None:
    """One request on a new connection; its answer, or None when the connection broke first.
    The body is sent from a thread: a body refused part-way is never read to its end, so the
    sender may block, then fail, while the answer is already there to read."""

    def send() -> None:
        try:
            conn.send(data)
        except OSError:
            pass

    with Connection(server) as conn:
        sender = threading.Thread(target=send)
        sender.start()
        try:
            return conn.read()
        except OSError:
            return None
        finally:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)  # unblocks the sender
            except OSError:  # already reset by the server
                pass
            sender.join()


def test_clients_that_leave_mid_body_give_the_budget_back(server: ServerProcess) -> None:
    """Ten clients leave 4 of their declared 5 MiB in (40 MiB, over three times the budget);
    the server then still takes the largest body it allows."""
    for _ in range(10):
        with Connection(server) as conn:
            body, header_length = infer_body(tensor(5 * MIB - 300, 7))
            conn.send(head(header_length, len(body)) + body[: 4 * MIB])
            time.sleep(0.05)
    data = tensor(5 * MIB - 300, 8)
    deadline = time.monotonic() + 15
    while True:  # the server notices each leaving client when it reads again
        with Connection(server) as conn:
            conn.send(request(data))
            answer = conn.read()
        if answer[0] == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert output_of(answer) == data
    assert server.alive
