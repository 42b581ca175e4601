"""Property-based fuzzing of every HTTP route against a real server subprocess (issue #13,
item 6): requests are drawn from the protocol's own shapes, valid ones mutated (datatypes,
shapes, data, binary header lengths, parameters, outputs, compression headers, odd model
names and versions, methods), plus byte-level mutations of whole requests on the wire.

The property (tests/support/fuzzing.py): no 5xx caused by input, the server stays alive, live after
every case, no unexpected error in its log. ASCEND_FUZZ=nightly (`make fuzz`) runs thousands of
cases per test; the default is a short run for `make test`. The request strategies are in
tests/support/fuzzing_http.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given, reject
from hypothesis import strategies as st

from harness.serverproc import running_server
from tests.support.fuzzing import Watch, describe, fuzz_settings
from tests.support.fuzzing_http import RELOADABLE, infer_requests, load_requests, other_requests

# slow as a whole: three fuzzers take about 10 s each, and the last test reads all their counts.
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def watch(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watch]:
    with running_server(
        [example_repository], ["--exit-timeout-secs", "10"], log_dir=tmp_path_factory.mktemp("logs")
    ) as server:
        checker = Watch(server)
        yield checker
        checker.close()


# ----- the properties ----------------------------------------------------------------------------
def send(watch: Watch, case: dict) -> None:
    try:
        headers = {k: v.encode() for k, v in case["headers"].items()}  # non-ASCII too
        reply = watch.client.request(
            case["method"], case["path"], headers=headers, content=case["body"], timeout=30.0
        )
    except httpx.LocalProtocolError:  # httpx will not send it: the wire test covers such bytes
        reject()
    except httpx.HTTPError as exc:
        watch.after(describe(case), f"no answer: {exc!r}")
        return
    problem = None
    if not watch.allowed_http(reply.status_code, reply.text):
        problem = f"answered {reply.status_code}: {reply.text[:500]}"
    watch.after(describe(case), problem, reply.status_code)


@fuzz_settings(3)
@given(case=infer_requests())
def test_infer_requests_mutated_never_answer_5xx(watch: Watch, case: dict) -> None:
    send(watch, case)


@fuzz_settings(1.5)
@given(case=other_requests())
def test_every_route_and_method_never_answers_5xx(watch: Watch, case: dict) -> None:
    send(watch, case)


def render(case: dict) -> bytes:
    lines = [
        f"{case['method']} {case['path']} HTTP/1.1",
        "Host: 127.0.0.1",
        f"Content-Length: {len(case['body'])}",
        "Connection: close",
    ]
    lines += [f"{k}: {v}" for k, v in case["headers"].items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + case["body"]


def complete(received: bytes) -> bool:
    """Whether `received` holds at least one whole response (headers and Content-Length)."""
    head, separator, rest = received.partition(b"\r\n\r\n")
    if not separator:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(rest) >= int(value)
    return False


def exchange(watch: Watch, wire: bytes) -> bytes:
    """Send `wire` on a fresh connection; what came back before the server closed it, or 0.5 s
    of silence (a request that says more is coming is rightly waited for), or 0.1 s after a
    whole response (a mutation may have made the connection keep-alive)."""
    received = b""
    with socket.create_connection(("127.0.0.1", watch.server.http_port), timeout=5) as sock:
        try:
            sock.sendall(wire)
        except OSError:  # closed on us while sending (a refused header, say)
            pass
        while True:
            sock.settimeout(0.1 if complete(received) else 0.5)
            try:
                chunk = sock.recv(65536)
            except OSError:  # silence (socket.timeout) or a reset
                break
            if not chunk:
                break
            received += chunk
    return received


@fuzz_settings(0.5)  # up to 0.5 s a case: a cut request is waited for
@given(case=infer_requests(), data=st.data())
def test_requests_mutated_on_the_wire_never_answer_5xx(
    watch: Watch, case: dict, data: st.DataObject
) -> None:
    wire = bytearray(render(case))
    head_end = wire.find(b"\r\n\r\n")
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.integers(0, 4))
        index = data.draw(
            st.integers(0, max(0, head_end if data.draw(st.booleans()) else len(wire) - 1))
        )
        if kind == 0 and wire:
            wire[min(index, len(wire) - 1)] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == 1:
            wire[index:index] = data.draw(
                st.sampled_from(
                    [
                        b"\r\n",
                        b"\r\nContent-Length: 3",
                        b"\r\nTransfer-Encoding: chunked",
                        b"\r\nExpect: 100-continue",
                        b"\x00",
                        b" ",
                        b":",
                        b"\r\n\r\n",
                        b"\r\nContent-Encoding: gzip",
                        b"\r\nConnection: keep-alive",
                    ]
                )
            )
        elif kind == 2:
            del wire[index : index + data.draw(st.integers(1, 8))]
        elif kind == 3:
            wire[index:index] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            wire = wire[:index]
    received = exchange(watch, bytes(wire))
    problem = None
    status_line = received.split(b"\r\n", 1)[0]
    # Several responses may come back (pipelined requests made by a mutation): check each.
    for part in received.split(b"HTTP/1.1 ")[1:]:
        code = part[:3]
        if code.isdigit() and int(code) >= 500:
            text = part.split(b"\r\n\r\n", 1)[-1].decode("utf-8", "replace")
            if not watch.allowed_http(int(code), text):
                problem = f"answered {part[:600]!r}"
    watch.after(f"{bytes(wire)[:1500]!r}\nfirst line back: {status_line!r}", problem)


# ----- the load API in explicit mode: config overrides mutated -----------------------------------
@pytest.fixture(scope="module")
def explicit(
    example_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Watch, dict[str, dict]]]:
    """A second server, in explicit mode, and the config JSON each reloadable model has."""
    args = [
        "--exit-timeout-secs",
        "10",
        "--model-control-mode",
        "explicit",
        *[f"--load-model={name}" for name in RELOADABLE],
    ]
    with running_server(
        [example_repository], args, log_dir=tmp_path_factory.mktemp("logs")
    ) as server:
        checker = Watch(server)
        configs = {
            name: checker.client.get(f"/v2/models/{name}/config").json() for name in RELOADABLE
        }
        yield checker, configs
        checker.close()


@fuzz_settings(0.5)
@given(data=st.data())
def test_load_and_unload_with_mutated_config_overrides_never_answer_5xx(
    explicit: tuple[Watch, dict[str, dict]], data: st.DataObject
) -> None:
    checker, configs = explicit
    send(checker, data.draw(load_requests(configs)))
    # a model left loaded (or not) by the case still answers (or refuses) an infer correctly
    case = data.draw(infer_requests())
    send(checker, case)


def test_the_fuzzers_reached_the_inference_path_and_the_refusals(watch: Watch) -> None:
    """Runs after the fuzz tests above (pytest keeps file order) on their counts."""
    watch.check_variety(200, {400})
