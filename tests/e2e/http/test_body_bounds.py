"""Unfinished HTTP bodies are bounded in memory and in time (issue 28, item 5).

Over raw sockets against a server subprocess: bodies that stop half-way hold their bytes against
--http-max-inflight-body-size, so further bodies, on the direct infer path and on the routed
(ASGI) endpoints alike, are refused with 503 and Retry-After while a small request still fits;
after --http-body-timeout-secs (set small here) the stalled bodies are answered 408, closed and
their bytes given back. A body that keeps arriving slowly is not cut. The slow test is the
issue's case: 8 connections sending most of a 60 MiB body each must not grow the server past the
budget.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from examples.build_repository import build_simple
from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

KIB = 1024
MIB = 1024 * KIB
MAX_INPUT = 1 * MIB
BUDGET = 2 * MIB
BODY_TIMEOUT = 2.0
STALLED = 1000 * KIB  # what each of two stalled bodies sends of its declared MAX_INPUT
INFER = "/v2/models/simple/infer"
BUDGET_TEXT = "(--http-max-inflight-body-size); retry later"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    build_simple(root)
    return root


@pytest.fixture(scope="module")
def bounded(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(
        [repository],
        [
            "--http-max-input-size",
            str(MAX_INPUT),
            "--http-max-inflight-body-size",
            str(BUDGET),
            "--http-body-timeout-secs",
            str(BODY_TIMEOUT),
        ],
        log_dir=tmp_path_factory.mktemp("logs"),
    ) as proc:
        yield proc


def _infer_body(pad: int = 0) -> bytes:
    """A valid request for `simple`, padded with `pad` spaces."""
    inputs = [
        {"name": name, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
        for name in ("INPUT0", "INPUT1")
    ]
    return json.dumps({"inputs": inputs}).encode() + b" " * pad


def _start_body(server: ServerProcess, path: str, declared: int, sent: bytes) -> socket.socket:
    """A connection that declares `declared` bytes of body and sends only `sent`."""
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n\r\n"
    sock.sendall(head.encode() + sent)
    return sock


def _answer(sock: socket.socket) -> bytes:
    """Everything the server writes until it closes the connection."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def _refused_by_budget(reply: httpx.Response) -> bool:
    return reply.status_code == 503 and BUDGET_TEXT in reply.json()["error"]


def test_stalled_bodies_hold_the_budget_then_time_out(bounded: ServerProcess) -> None:
    stalled = [
        _start_body(bounded, INFER, MAX_INPUT, b"x" * STALLED),
        _start_body(bounded, "/v2/repository/index", MAX_INPUT, b"x" * STALLED),
    ]
    stalled_at = time.monotonic()
    try:
        probe = _infer_body(pad=60 * KIB)  # more than the ~48 KiB the stalled bodies leave
        with httpx.Client(base_url=bounded.base, timeout=30) as http:
            deadline = time.monotonic() + 10
            while True:  # until the server has read both stalled bodies
                reply = http.post(INFER, content=probe)
                if _refused_by_budget(reply) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert _refused_by_budget(reply), reply.text
            assert reply.headers["retry-after"] == "1"
            assert reply.headers["connection"] == "close"
            # the routed (ASGI) endpoints share the budget
            routed = http.post("/v2/repository/index", content=b"{}" + b" " * 60 * KIB)
            assert _refused_by_budget(routed), routed.text
            assert routed.headers["connection"] == "close"
            # a small request still fits, and health answers at once
            assert http.post(INFER, content=_infer_body()).status_code == 200
            start = time.monotonic()
            assert http.get("/v2/health/live").status_code == 200
            assert time.monotonic() - start < 2.0

            for sock in stalled:  # abandoned after the body timeout: 408, then closed
                answer = _answer(sock)
                assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
                assert b"--http-body-timeout-secs" in answer
            waited = time.monotonic() - stalled_at
            assert BODY_TIMEOUT * 0.5 < waited < BODY_TIMEOUT + 10, waited

            # their bytes were given back: the same probe is no longer refused
            reply = http.post(INFER, content=probe)
            assert reply.status_code == 200, reply.text
            assert bounded.alive
    finally:
        for sock in stalled:
            sock.close()


def test_a_body_that_keeps_arriving_slowly_is_not_cut(bounded: ServerProcess) -> None:
    body = _infer_body()
    sock = _start_body(bounded, INFER, len(body), b"")
    try:
        pieces = 6  # spread over 1.5 x the body timeout, never silent for half of it
        step = len(body) // pieces + 1
        for offset in range(0, len(body), step):
            sock.sendall(body[offset : offset + step])
            time.sleep(BODY_TIMEOUT * 1.5 / pieces)
        head = sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 "), head[:200]
    finally:
        sock.close()


def test_a_body_that_stops_before_its_first_byte_times_out(bounded: ServerProcess) -> None:
    sock = _start_body(bounded, "/v2/models/simple/generate", 100, b"")
    try:
        answer = _answer(sock)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"connection: close" in answer.lower()
    finally:
        sock.close()


# ----- the case ------------------------------------------------------------------------
BIG_BUDGET = 128 * MIB
BIG_DECLARED = 60 * MIB
BIG_SENT = 56 * MIB
CONNECTIONS = 8


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))


@pytest.mark.slow
def test_eight_stalled_60_mib_bodies_stay_within_the_budget(
    repository: Path, tmp_path: Path
) -> None:
    with running_server(
        [repository],
        [
            "--http-max-inflight-body-size",
            str(BIG_BUDGET),
            "--http-body-timeout-secs",
            "3",
        ],
        log_dir=tmp_path,
    ) as server:
        with httpx.Client(base_url=server.base, timeout=30) as http:
            assert http.post(INFER, content=_infer_body()).status_code == 200  # warm
        before = _rss_kib(server.pid)
        peak = [before]
        outcomes: list[bytes] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _rss_kib(server.pid))
                time.sleep(0.05)

        def stall() -> None:
            sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
            try:
                head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {BIG_DECLARED}\r\n\r\n"
                try:
                    sock.sendall(head.encode() + bytes(BIG_SENT))
                except OSError:  # refused and closed while sending
                    pass
                outcomes.append(_answer(sock))
            except OSError:
                outcomes.append(b"")
            finally:
                sock.close()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        threads = [threading.Thread(target=stall) for _ in range(CONNECTIONS)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        with httpx.Client(base_url=server.base, timeout=30) as http:
            start = time.monotonic()
            assert http.get("/v2/health/live").status_code == 200
            assert time.monotonic() - start < 2.0
        for thread in threads:
            thread.join(60)
        done.set()
        watcher.join()

        grown = (peak[0] - before) * KIB
        assert grown < BIG_BUDGET + 96 * MIB, f"the server grew {grown / MIB:.0f} MiB"
        refused = [out for out in outcomes if not out.startswith(b"HTTP/1.1 408 ")]
        timed_out = [out for out in outcomes if out.startswith(b"HTTP/1.1 408 ")]
        assert len(outcomes) == CONNECTIONS
        # at most two 56 MiB bodies fit in 128 MiB; the others were refused (503, or reset
        # while still sending), and the ones that fitted were dropped by the body timeout
        assert len(refused) >= CONNECTIONS - 2, outcomes
        assert all(out == b"" or out.startswith(b"HTTP/1.1 503 ") for out in refused), [
            out[:100] for out in refused
        ]
        assert timed_out, [out[:100] for out in outcomes]
        with httpx.Client(base_url=server.base, timeout=30) as http:
            assert http.post(INFER, content=_infer_body()).status_code == 200
        assert server.alive
