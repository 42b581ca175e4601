"""Wire-level tests of the direct (non-ASGI) infer path in server/http/fast_path.py.

`POST /v2/models/{m}[/versions/{v}]/infer` is answered by a subclass of uvicorn's httptools
protocol that reads uvicorn's buffered body itself and writes the whole response in one
`transport.write`. That code takes over parts of HTTP/1.1 that ASGI used to handle for it
(100-continue, chunked and slow bodies, keep-alive after errors, `Connection: close`, pipelining
behind other requests, disconnects), and ordinary clients such as httpx never exercise most of
those. So these tests talk raw HTTP over sockets and check exactly what a client would see:
status lines, headers, output values, error text and whether the connection stays open.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from examples.build_repository import build_identity_bytes, build_simple
from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

SIMPLE = "/v2/models/simple/infer"
IDENTITY = "/v2/models/identity_bytes/infer"
LIMIT = 4096  # --http-max-input-size of the `limited` server
TIMEOUT = 10.0  # seconds any single socket read may take before the test fails


# ----- servers ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`simple` (add/sub, INT32 [batch, 16]) and `identity_bytes` (BYTES [-1]: any body size)."""
    root = tmp_path_factory.mktemp("repo")
    build_simple(root)
    build_identity_bytes(root)
    return root


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server with default settings for every test that does not need a small body limit."""
    with running_server([repository], log_dir=tmp_path_factory.mktemp("logs")) as proc:
        yield proc


@pytest.fixture(scope="module")
def limited(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that refuses bodies over LIMIT bytes."""
    with running_server(
        [repository], ["--http-max-input-size", str(LIMIT)], log_dir=tmp_path_factory.mktemp("logs")
    ) as proc:
        yield proc


# ----- requests ---------------------------------------------------------------------------


def request(
    path: str,
    body: bytes = b"",
    method: str = "POST",
    headers: Mapping[str, str] | None = None,
    version: str = "HTTP/1.1",
    content_length: int | None = None,
) -> bytes:
    """One raw HTTP request. Content-Length is the body's unless given (or chunked is asked)."""
    lines = [f"{method} {path} {version}", "Host: 127.0.0.1"]
    fields = dict(headers or {})
    chunked = fields.get("Transfer-Encoding", "").lower() == "chunked"
    if not chunked and (method == "POST" or content_length is not None):
        fields.setdefault(
            "Content-Length", str(len(body) if content_length is None else content_length)
        )
    lines += [f"{key}: {value}" for key, value in fields.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def simple_inputs(offset: int, batch: int = 1) -> tuple[list[int], list[int]]:
    """Distinct INPUT0 / INPUT1 values per offset, so a response can't pass for another's."""
    count = 16 * batch
    return [offset + i for i in range(count)], [offset * 3 - i for i in range(count)]


def simple_body(offset: int, batch: int = 1, binary_output: bool = False) -> bytes:
    """A JSON infer request for `simple`; outputs in the binary extension when asked."""
    in0, in1 = simple_inputs(offset, batch)
    payload: dict[str, Any] = {
        "inputs": [
            {"name": "INPUT0", "shape": [batch, 16], "datatype": "INT32", "data": in0},
            {"name": "INPUT1", "shape": [batch, 16], "datatype": "INT32", "data": in1},
        ]
    }
    if binary_output:
        payload["parameters"] = {"binary_data_output": True}
    return json.dumps(payload).encode()


def chunked(pieces: Sequence[bytes]) -> list[bytes]:
    """Transfer-Encoding: chunked framing of each piece (the last item is the terminator)."""
    return [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces] + [b"0\r\n\r\n"]


# ----- responses --------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """A client socket that reads HTTP/1.1 responses one at a time (pipelining needs exact
    framing by Content-Length, which no high-level client exposes)."""

    def __init__(self, server: ServerProcess) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=TIMEOUT)
        self.buffer = b""

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError(f"server closed the connection; unparsed: {self.buffer[:200]!r}")
        self.buffer += data

    def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._fill()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._fill()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def read(self) -> Response:
        """The next response, interim (1xx) ones included; bodies framed by Content-Length or
        chunked encoding (the routed FastAPI answers use either)."""
        status_line = self._line().decode("latin-1")
        protocol, status, _ = (status_line + " ").split(" ", 2)
        assert protocol == "HTTP/1.1", status_line
        headers: dict[str, str] = {}
        while line := self._line():
            name, value = line.decode("latin-1").split(":", 1)
            headers[name.strip().lower()] = value.strip()
        code = int(status)
        if 100 <= code < 200 or code in (204, 304):
            return Response(code, headers, b"")
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while size := int(self._line().split(b";")[0], 16):
                parts.append(self._take(size))
                assert self._take(2) == b"\r\n"
            assert self._line() == b""
            return Response(code, headers, b"".join(parts))
        return Response(code, headers, self._take(int(headers["content-length"])))

    def closed_by_server(self) -> bool:
        """True when the server closed its side: nothing buffered and recv returns b"" (an RST
        counts too). A still-open keep-alive connection makes recv time out: False."""
        if self.buffer:
            return False
        self.sock.settimeout(2.0)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        finally:
            self.sock.settimeout(TIMEOUT)


def assert_simple(response: Response, offset: int, batch: int = 1) -> None:
    """A 200 whose OUTPUT0 / OUTPUT1 are exactly INPUT0 + INPUT1 and INPUT0 - INPUT1 (JSON or
    binary outputs)."""
    assert response.status == 200, response.body[:500]
    in0, in1 = simple_inputs(offset, batch)
    outputs = decode_outputs(response)
    assert outputs["OUTPUT0"] == [a + b for a, b in zip(in0, in1, strict=False)]
    assert outputs["OUTPUT1"] == [a - b for a, b in zip(in0, in1, strict=False)]


def assert_simple_roundtrip(conn: Connection, offset: int) -> None:
    """One more request on `conn` gets its correct answer (the connection is healthy)."""
    conn.send(request(SIMPLE, simple_body(offset)))
    assert_simple(conn.read(), offset)


def decode_outputs(response: Response) -> dict[str, Any]:
    """name -> flat data, reading binary INT32 / BYTES outputs after the JSON header."""
    length = response.headers.get("inference-header-content-length")
    header = json.loads(response.body[: int(length)] if length else response.body)
    blob = memoryview(response.body)[int(length) if length else len(response.body) :]
    outputs: dict[str, Any] = {}
    for entry in header["outputs"]:
        size = entry.get("parameters", {}).get("binary_data_size")
        if size is None:
            outputs[entry["name"]] = entry["data"]
            continue
        raw, blob = bytes(blob[:size]), blob[size:]
        if entry["datatype"] == "INT32":
            outputs[entry["name"]] = list(struct.unpack(f"<{size // 4}i", raw))
        else:
            assert entry["datatype"] == "BYTES"
            items, at = [], 0
            while at < len(raw):
                (n,) = struct.unpack_from("<I", raw, at)
                items.append(raw[at + 4 : at + 4 + n])
                at += 4 + n
            outputs[entry["name"]] = items
    assert not blob, "bytes left after the binary outputs"
    return outputs


def identity_body(value: bytes) -> tuple[bytes, int]:
    """A binary-extension request for identity_bytes carrying one BYTES element; the body and
    its JSON header's length (Inference-Header-Content-Length)."""
    element = struct.pack("<I", len(value)) + value
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(element)},
                }
            ],
            "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return header + element, len(header)


# ----- 1. pipelining ----------------------------------------------------------------------


def test_pipelined_infers_come_back_in_order(server: ServerProcess) -> None:
    """Three infers in one write: each answer matches its own request, in request order (the
    second and third wait in uvicorn's pipeline queue, and the versioned path is direct too)."""
    paths = [SIMPLE, "/v2/models/simple/versions/1/infer", SIMPLE]
    with Connection(server) as conn:
        conn.send(
            b"".join(request(path, simple_body(10 * (i + 1))) for i, path in enumerate(paths))
        )
        for i in range(len(paths)):
            assert_simple(conn.read(), 10 * (i + 1))
        assert_simple_roundtrip(conn, 99)  # and the connection is still usable


def test_pipelined_infers_mixed_with_routed_requests(server: ServerProcess) -> None:
    """Direct infers and FastAPI routes share one pipeline: infer, ready, infer, metadata."""
    with Connection(server) as conn:
        conn.send(
            request(SIMPLE, simple_body(1))
            + request("/v2/health/ready", method="GET")
            + request(SIMPLE, simple_body(2, batch=3, binary_output=True))
            + request("/v2/models/simple", method="GET")
        )
        assert_simple(conn.read(), 1)
        ready = conn.read()
        assert (ready.status, ready.body) == (200, b"")
        assert_simple(conn.read(), 2, batch=3)
        metadata = conn.read()
        assert metadata.status == 200 and metadata.json()["name"] == "simple"


# ----- 2. Expect: 100-continue ------------------------------------------------------------


def test_expect_100_continue(server: ServerProcess) -> None:
    """The server sends `100 Continue` before the body exists, then answers the full request."""
    body = simple_body(7)
    with Connection(server) as conn:
        conn.send(request(SIMPLE, headers={"Expect": "100-continue"}, content_length=len(body)))
        interim = conn.read()
        assert interim.status == 100
        conn.send(body)
        assert_simple(conn.read(), 7)
        assert_simple_roundtrip(conn, 8)


def test_expect_100_continue_over_the_limit_is_refused_without_continue(
    limited: ServerProcess,
) -> None:
    """A declared size over the limit answers 413 at once, never inviting the body, and closes
    (the body the client may still send would otherwise be read as the next request)."""
    with Connection(limited) as conn:
        conn.send(request(SIMPLE, headers={"Expect": "100-continue"}, content_length=LIMIT + 1))
        reply = conn.read()
        assert reply.status == 413
        assert "exceeds the maximum allowed input size of 4096 bytes" in reply.json()["error"]
        assert reply.headers.get("connection") == "close"
        assert conn.closed_by_server()


# ----- 3. chunked request body ------------------------------------------------------------


def test_chunked_request_body(server: ServerProcess) -> None:
    """A chunked body sent piece by piece (separate writes, small pauses) is reassembled."""
    body = simple_body(5, batch=2)
    pieces = [body[i : i + 50] for i in range(0, len(body), 50)]
    with Connection(server) as conn:
        conn.send(request(SIMPLE, headers={"Transfer-Encoding": "chunked"}))
        for frame in chunked(pieces):
            time.sleep(0.01)
            conn.send(frame)
        assert_simple(conn.read(), 5, batch=2)
        assert_simple_roundtrip(conn, 6)


# ----- 4. large bodies --------------------------------------------------------------------


@pytest.mark.parametrize(
    "size, piece, pause",
    [
        (300 * 1024, 16 * 1024, 0.005),  # many separate reads, each waking the body loop
        (4 * 1024 * 1024, 4 * 1024 * 1024, 0.0),  # past uvicorn's 64 KiB mark: reading pauses
    ],
    ids=["300KiB-in-16KiB-pieces", "4MiB-in-one-write"],
)
def test_large_binary_body(server: ServerProcess, size: int, piece: int, pause: float) -> None:
    """A binary-extension body far larger than one socket read comes back byte for byte.

    The value is printable ASCII: onnxruntime string tensors hold UTF-8 text."""
    value = bytes(range(32, 127)) * (size // 95) + b"!" * (size % 95)
    body, header_length = identity_body(value)
    with Connection(server) as conn:
        conn.send(
            request(
                IDENTITY,
                headers={"Inference-Header-Content-Length": str(header_length)},
                content_length=len(body),
            )
        )
        for start in range(0, len(body), piece):
            conn.send(body[start : start + piece])
            if pause:
                time.sleep(pause)
        reply = conn.read()
        assert reply.status == 200, reply.body[:500]
        assert reply.headers["content-type"] == "application/octet-stream"
        assert decode_outputs(reply) == {"OUTPUT": [value]}
        assert_simple_roundtrip(conn, 3)


# ----- 5. body size limit -----------------------------------------------------------------


def test_declared_length_over_the_limit(limited: ServerProcess) -> None:
    """Content-Length over --http-max-input-size: 413 before any body is read, then close."""
    with Connection(limited) as conn:
        conn.send(request(SIMPLE, content_length=100_000))
        reply = conn.read()
        assert reply.status == 413
        assert reply.json() == {
            "error": (
                "request body size exceeds the maximum allowed input size of 4096 bytes. "
                "Use --http-max-input-size to increase the limit."
            )
        }
        assert reply.headers.get("connection") == "close"
        assert conn.closed_by_server()


def test_chunked_body_growing_over_the_limit(limited: ServerProcess) -> None:
    """No declared size: the body is refused once it passes the limit, and the connection is
    closed since the rest of the body was never read."""
    with Connection(limited) as conn:
        conn.send(request(SIMPLE, headers={"Transfer-Encoding": "chunked"}))
        for frame in chunked([b" " * 1000] * 5)[:-1]:  # 5000 bytes, no terminating chunk
            conn.send(frame)
            time.sleep(0.01)
        reply = conn.read()
        assert reply.status == 413
        assert "exceeds the maximum allowed input size of 4096 bytes" in reply.json()["error"]
        assert reply.headers.get("connection") == "close"
        assert conn.closed_by_server()


def test_oversize_body_read_in_full_keeps_the_connection(limited: ServerProcess) -> None:
    """An over-size body that had fully arrived (one small write) is refused with 413 but
    nothing is left unread, so the request pipelined behind it is still answered."""
    with Connection(limited) as conn:
        conn.send(request(SIMPLE, b" " * (LIMIT + 904)) + request(SIMPLE, simple_body(4)))
        reply = conn.read()
        assert reply.status == 413
        assert "exceeds the maximum allowed input size of 4096 bytes" in reply.json()["error"]
        assert "connection" not in reply.headers
        assert_simple(conn.read(), 4)
        assert_simple_roundtrip(conn, 5)


# ----- 6. connection close ----------------------------------------------------------------


def test_connection_close_request(server: ServerProcess) -> None:
    """`Connection: close` gets its answer with `connection: close`, then the socket closes."""
    with Connection(server) as conn:
        conn.send(request(SIMPLE, simple_body(11), headers={"Connection": "close"}))
        reply = conn.read()
        assert_simple(reply, 11)
        assert reply.headers["connection"] == "close"
        assert conn.closed_by_server()


def test_http10_request_is_answered_then_closed(server: ServerProcess) -> None:
    """HTTP/1.0 without keep-alive: answered, then the server closes the connection."""
    with Connection(server) as conn:
        conn.send(request(SIMPLE, simple_body(12), version="HTTP/1.0"))
        reply = conn.read()
        assert_simple(reply, 12)
        assert reply.headers["connection"] == "close"
        assert conn.closed_by_server()


# ----- 7. keep-alive ----------------------------------------------------------------------


def test_fifty_sequential_infers_on_one_connection(server: ServerProcess) -> None:
    """One keep-alive socket serves 50 infers; every answer is framed and labelled correctly."""
    with Connection(server) as conn:
        for i in range(50):
            binary = i % 2 == 1
            conn.send(request(SIMPLE, simple_body(i, binary_output=binary)))
            reply = conn.read()
            assert_simple(reply, i)
            assert int(reply.headers["content-length"]) == len(reply.body)
            assert "connection" not in reply.headers
            if binary:
                assert reply.headers["content-type"] == "application/octet-stream"
                header_length = int(reply.headers["inference-header-content-length"])
                assert json.loads(reply.body[:header_length])["model_name"] == "simple"
            else:
                assert reply.headers["content-type"] == "application/json"
                assert "inference-header-content-length" not in reply.headers
        assert not conn.closed_by_server()


# ----- 8. errors keep the connection ------------------------------------------------------


def test_malformed_json_is_400_and_the_connection_survives(server: ServerProcess) -> None:
    """A 400 for a bad body that was read in full leaves the connection usable (and so does a
    404 for an unknown model)."""
    with Connection(server) as conn:
        conn.send(request(SIMPLE, b'{"inputs": [ {"name": "INPUT0", '))
        reply = conn.read()
        assert reply.status == 400
        assert reply.headers["content-type"] == "application/json"
        assert "failed to parse the request JSON buffer" in reply.json()["error"]
        assert "connection" not in reply.headers
        conn.send(request("/v2/models/missing/infer", simple_body(0)))
        missing = conn.read()
        assert missing.status == 404
        assert missing.json() == {"error": "Request for unknown model: 'missing' is not found"}
        assert_simple_roundtrip(conn, 13)


# ----- 9. disconnects ---------------------------------------------------------------------


def test_client_disconnect_mid_body(server: ServerProcess) -> None:
    """A client that leaves in the middle of its body does not hurt the server: the next
    connection is served, and nothing unexpected is logged."""
    for _ in range(3):
        with Connection(server) as conn:
            conn.send(request(SIMPLE, content_length=1000) + b'{"inputs":')
            time.sleep(0.05)  # let the server start waiting for the rest
    with Connection(server) as conn:
        assert_simple_roundtrip(conn, 14)
        conn.send(request("/v2/health/live", method="GET"))
        assert conn.read().status == 200
    assert server.alive()
    assert "Traceback" not in server.log() and "unexpected error" not in server.log()


# ----- 10. text the model cannot take ------------------------------------


def test_bytes_that_are_not_utf8_are_a_400_for_an_onnx_string_input(server: ServerProcess) -> None:
    """ONNX string tensors hold text: a non-UTF-8 BYTES element is the client's error (400,
    naming the input), not a server failure, and the model keeps serving."""
    body, header_length = identity_body(b"ok\x80")
    with Connection(server) as conn:
        conn.send(
            request(IDENTITY, body, headers={"Inference-Header-Content-Length": str(header_length)})
        )
        response = conn.read()
        assert response.status == 400, response.body
        assert "input 'INPUT'" in response.json()["error"]
        assert "not valid UTF-8" in response.json()["error"]
        good, header_length = identity_body(b"fine")
        conn.send(
            request(IDENTITY, good, headers={"Inference-Header-Content-Length": str(header_length)})
        )
        assert decode_outputs(conn.read())["OUTPUT"] == [b"fine"]
