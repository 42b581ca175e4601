"""Connections and request memory bounded (issue 13, items 3 and 4), against a server subprocess.

HTTP, over raw sockets: a client that connects and says nothing, one that drips its headers
(slowloris) or blank lines, and a kept-alive one that goes quiet are all closed after their
timeouts (set small by flags here); past --http-max-connections new connections are closed at
once and the refusals logged rate-limited, while the health-check reserve still answers
/v2/health/live (and refuses anything else with 503). gRPC: a silent TCP client is closed by
the handshake timeout, an idle channel gets GOAWAY, and a gzip request that would inflate past
--grpc-max-input-size is refused while the server's resident memory stays small.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from examples.build_repository import build_simple
from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

TIMEOUT_SECS = 1.0  # the idle, header and keep-alive timeouts of the `timeouts` server
MAX_CONNECTIONS = 6
RESERVE = 2
MIB = 1024 * 1024
GRPC_INPUT_LIMIT = 4 * MIB
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    build_simple(root)
    return root


@pytest.fixture(scope="module")
def timeouts(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    secs = str(TIMEOUT_SECS)
    with running_server(
        [repository],
        [
            "--http-idle-timeout-secs",
            secs,
            "--http-header-timeout-secs",
            secs,
            "--http-keep-alive-timeout-secs",
            secs,
            "--grpc-handshake-timeout",
            "500",
            "--grpc-max-connection-idle",
            "500",
        ],
        log_dir=tmp_path_factory.mktemp("logs"),
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def bounded(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Its own server, with the default idle timeout: the client gzips 64 MiB before its call's
    first frame leaves, which on a slow machine outlasted the 500 ms idle GOAWAY of `timeouts`."""
    with running_server(
        [repository],
        ["--grpc-max-input-size", str(GRPC_INPUT_LIMIT)],
        log_dir=tmp_path_factory.mktemp("logs"),
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def limited(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(
        [repository],
        [
            "--http-max-connections",
            str(MAX_CONNECTIONS),
            "--http-health-reserved-connections",
            str(RESERVE),
            "--grpc-max-connections",
            "2",
        ],
        log_dir=tmp_path_factory.mktemp("logs"),
    ) as proc:
        yield proc


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10.0)


def closed_after(sock: socket.socket, limit: float, drip: bytes = b"", every: float = 0.1) -> float:
    """Seconds until the server closes `sock` (sending `drip` every `every` s meanwhile);
    fails if it is still open after `limit` s. Responses the server sends are skipped."""
    start = time.monotonic()
    sock.settimeout(every)
    while time.monotonic() - start < limit:
        if drip:
            try:
                sock.sendall(drip)
            except OSError:  # reset: closed
                return time.monotonic() - start
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - start
    pytest.fail(f"connection still open after {limit} s")


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """Status and everything up to the close or the end of a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    match = re.search(rb"content-length: (\d+)", head, re.I)
    while match and len(body) < int(match.group(1)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(head.split(b" ", 2)[1]), head + b"\r\n\r\n" + body


# ----- HTTP timeouts ----------------------------------------------------------------------


def test_silent_client_is_closed(timeouts: ServerProcess) -> None:
    with connect(timeouts.http_port) as sock:
        assert TIMEOUT_SECS * 0.5 < closed_after(sock, 10.0) < TIMEOUT_SECS + 3


def test_header_dripping_client_is_closed(timeouts: ServerProcess) -> None:
    """Slowloris: a header line every 0.1 s (each read restarts nothing)."""
    with connect(timeouts.http_port) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        assert closed_after(sock, 10.0, drip=b"X-Drip: 1\r\n") < TIMEOUT_SECS + 3


def test_byte_dripping_request_line_is_closed(timeouts: ServerProcess) -> None:
    with connect(timeouts.http_port) as sock:
        assert closed_after(sock, 10.0, drip=b"G") < TIMEOUT_SECS + 3


def test_blank_line_dripping_client_is_closed(timeouts: ServerProcess) -> None:
    """Blank lines before a request start no request, and do not restart the idle timeout."""
    with connect(timeouts.http_port) as sock:
        assert closed_after(sock, 10.0, drip=b"\r\n") < TIMEOUT_SECS + 3


def test_keep_alive_connection_closed_after_its_timeout(timeouts: ServerProcess) -> None:
    with connect(timeouts.http_port) as sock:
        for _ in range(3):  # each request restarts the wait
            sock.sendall(LIVE)
            status, _ = read_response(sock)
            assert status == 200
            time.sleep(TIMEOUT_SECS / 3)
        assert closed_after(sock, 10.0) < TIMEOUT_SECS + 3


def test_slow_but_steady_requests_are_served(timeouts: ServerProcess) -> None:
    """Headers that arrive in pieces within the header timeout are fine."""
    with connect(timeouts.http_port) as sock:
        for piece in (b"GET /v2/health/live HTTP/1.1\r\n", b"Host: x\r\n", b"\r\n"):
            sock.sendall(piece)
            time.sleep(TIMEOUT_SECS / 5)
        status, _ = read_response(sock)
        assert status == 200


def test_metrics_listener_has_the_same_timeouts(timeouts: ServerProcess) -> None:
    with connect(timeouts.metrics_port) as sock:
        assert closed_after(sock, 10.0, drip=b"X") < TIMEOUT_SECS + 3


# ----- HTTP connection limit --------------------------------------------------------------


def test_connection_limit_keeps_health_answering(limited: ServerProcess) -> None:
    held = []
    try:
        for _ in range(MAX_CONNECTIONS):  # each answered once, so the server holds it
            sock = connect(limited.http_port)
            sock.sendall(LIVE)
            assert read_response(sock)[0] == 200
            held.append(sock)

        # The reserve: health checks answer (then the connection closes), the rest get 503.
        for path in (b"/v2/health/live", b"/v2/health/ready"):
            with connect(limited.http_port) as sock:
                sock.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                status, raw = read_response(sock)
                assert status == 200, raw
                assert b"connection: close" in raw.lower()
                assert closed_after(sock, 5.0) < 5.0
        with connect(limited.http_port) as sock:
            sock.sendall(b"GET /v2/models/simple HTTP/1.1\r\nHost: x\r\n\r\n")
            status, raw = read_response(sock)
            assert status == 503, raw
            assert b"--http-max-connections" in raw
            assert closed_after(sock, 5.0) < 5.0

        # Past the reserve too: closed at once, and logged once however many there are.
        reserve = [connect(limited.http_port) for _ in range(RESERVE)]
        held += reserve
        time.sleep(0.3)
        for _ in range(20):
            with connect(limited.http_port) as sock:
                assert closed_after(sock, 2.0) < 2.0
        assert limited.log().count("closed at once") == 1
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    with connect(limited.http_port) as sock:  # room again: anything is served
        sock.sendall(b"GET /v2/models/simple HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock)[0] == 200


# ----- gRPC -------------------------------------------------------------------------------


def test_grpc_connection_limit(limited: ServerProcess) -> None:
    """Two gRPC connections are served (their HTTP/2 settings arrive); the third is closed."""
    socks = [connect(limited.grpc_port) for _ in range(3)]
    try:
        time.sleep(0.3)
        for sock in socks[:2]:
            sock.settimeout(5.0)
            assert sock.recv(100)  # the server's SETTINGS frame
        assert closed_after(socks[2], 5.0) < 5.0
    finally:
        for sock in socks:
            sock.close()


def test_grpc_silent_client_is_closed(timeouts: ServerProcess) -> None:
    with connect(timeouts.grpc_port) as sock:
        assert closed_after(sock, 10.0) < 5.0


def test_grpc_idle_connection_gets_goaway(timeouts: ServerProcess) -> None:
    states: list[grpc.ChannelConnectivity] = []
    idle = threading.Event()

    def watch(state: grpc.ChannelConnectivity) -> None:
        states.append(state)
        if state is grpc.ChannelConnectivity.IDLE and grpc.ChannelConnectivity.READY in states:
            idle.set()

    with grpcclient.InferenceServerClient(timeouts.grpc_url) as client:
        client._channel.subscribe(watch, try_to_connect=False)
        assert client.is_server_live()
        assert idle.wait(10.0), states  # GOAWAY after --grpc-max-connection-idle (500 ms)
        assert client.is_server_live()  # and the next call reconnects


def _rss_peak_kib(pid: int) -> int:
    """Peak resident memory since the last reset (`clear_refs` 5), else the current one."""
    status = Path(f"/proc/{pid}/status").read_text()
    field = "VmHWM" if _reset_peak(pid, dry=True) else "VmRSS"
    return int(re.search(field + r":\s+(\d+)", status).group(1))


def _reset_peak(pid: int, dry: bool = False) -> bool:
    path = Path(f"/proc/{pid}/clear_refs")
    try:
        if not dry:
            path.write_text("5")
        return path.exists() and bool(path.stat().st_mode & 0o200)
    except OSError:
        return False


def test_grpc_compressed_request_cannot_inflate_past_the_bound(bounded: ServerProcess) -> None:
    """64 MiB of zeros compress to about 64 KiB; the server stops inflating at 4 MiB."""
    request = service_pb2.ModelInferRequest(model_name="simple")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16 * MIB])
    request.raw_input_contents.append(bytes(64 * MIB))
    payload = request.SerializeToString()
    del request
    _reset_peak(bounded.pid)
    before = _rss_peak_kib(bounded.pid)
    with grpc.insecure_channel(
        bounded.grpc_url, options=[("grpc.max_send_message_length", -1)]
    ) as channel:
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=None,
            response_deserializer=None,
        )
        with pytest.raises(grpc.RpcError) as failure:
            infer(payload, compression=grpc.Compression.Gzip, timeout=30)
    assert failure.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, failure.value.details()
    grown = _rss_peak_kib(bounded.pid) - before
    assert grown < 32 * 1024, f"server peak RSS grew {grown} KiB for a refused request"

    # Under the bound, compressed requests are served as before.
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    with grpcclient.InferenceServerClient(bounded.grpc_url) as client:
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        result = client.infer("simple", inputs, compression_algorithm="gzip")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
