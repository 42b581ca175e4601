"""server/http/infer_nowait.py: a small infer POST served with no task, driven through the real
protocol and HttpFrontend over a fake transport and a core that answers when told to."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
from typing import Any

import numpy as np
import orjson
import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from protocol.errors import Unavailable
from protocol.types import InferRequest, InferResponse, Tensor
from server.http.fast_path import protocol_class
from server.http.routes import HttpFrontend
from server.settings import ServerSettings


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.protocol: Any = None

    def write(self, data: Any) -> None:
        self.written += data

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.written += part

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def get_protocol(self) -> Any:
        return self.protocol

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _Core:
    """The part of CoreAPI the HTTP frontend reads; infer_nowait keeps its requests."""

    def __init__(self) -> None:
        self.settings = ServerSettings()
        self.may_trace = False
        self.propagates_trace = False
        self.exiting = False
        self.admitted: list[tuple[InferRequest, Any, asyncio.Future]] = []

    def infer_nowait(self, request: InferRequest, on_done: Any, endpoint: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.admitted.append((request, on_done, future))
        return future


def _request(body: bytes, *extra: str) -> bytes:
    head = [
        "POST /v2/models/add/infer HTTP/1.1",
        "Host: x",
        f"Content-Length: {len(body)}",
        *extra,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


BODY = orjson.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2.5]}]}
)


async def _connection() -> tuple[Any, _Transport, _Core, HttpFrontend]:
    core = _Core()
    frontend = HttpFrontend(core)  # type: ignore[arg-type]
    config = Config(app=frontend.build_app(), log_config=None)
    config.load()
    state = ServerState()
    protocol = protocol_class(frontend)(config, state, {}, asyncio.get_running_loop())
    transport = _Transport()
    transport.protocol = protocol
    protocol.connection_made(transport)
    return protocol, transport, core, frontend


def _answer(core: _Core, values: list[float]) -> None:
    request, on_done, future = core.admitted[-1]
    output = Tensor("OUTPUT0", "FP32", (1, 2), np.array([values], dtype=np.float32), {})
    future.set_result(None)
    on_done(InferResponse(model_name="add", model_version="1", outputs=[output]), None)


async def test_a_small_request_is_admitted_from_the_parser_and_answered_with_no_task() -> None:
    protocol, transport, core, frontend = await _connection()
    protocol.data_received(_request(BODY))
    assert not protocol.tasks  # no task was made for it
    ((request, _, _),) = core.admitted
    assert request.model_name == "add" and request.inputs[0].data.tolist() == [[1.5, 2.5]]
    assert frontend.body_limit.budget.held == len(BODY)  # held until answered
    assert transport.written == b""
    _answer(core, [3.0, 4.0])
    head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert orjson.loads(body)["outputs"][0]["data"] == [3.0, 4.0]
    assert frontend.body_limit.budget.held == 0
    assert protocol.no_task is None and not transport.closed
    # the connection serves the next request the same way
    protocol.data_received(_request(BODY))
    assert len(core.admitted) == 2 and not protocol.tasks


async def test_a_body_in_two_reads_is_admitted_when_it_completes() -> None:
    protocol, transport, core, _ = await _connection()
    whole = _request(BODY)
    protocol.data_received(whole[:-10])
    assert not core.admitted
    protocol.data_received(whole[-10:])
    assert len(core.admitted) == 1 and not protocol.tasks


async def test_a_client_gone_drops_its_queued_request_and_its_budget() -> None:
    protocol, transport, core, frontend = await _connection()
    protocol.data_received(_request(BODY))
    ((_, _, future),) = core.admitted
    protocol.connection_lost(None)
    assert future.cancelled()  # the scheduler drops it and counts it cancelled
    assert frontend.body_limit.budget.held == 0
    assert transport.written == b""


async def test_a_refused_request_is_answered_at_once_with_the_error_table() -> None:
    protocol, transport, core, frontend = await _connection()
    protocol.data_received(_request(b'{"inputs": [}'))
    assert not core.admitted
    head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request")
    assert "failed to parse the request JSON buffer" in orjson.loads(body)["error"]
    assert frontend.body_limit.budget.held == 0


async def test_a_failed_inference_is_answered_with_its_status() -> None:
    protocol, transport, core, _ = await _connection()
    protocol.data_received(_request(BODY))
    ((_, on_done, future),) = core.admitted
    future.set_result(None)
    on_done(None, Unavailable("Request for unknown model: 'add' has no available versions"))
    head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable")
    assert "has no available versions" in orjson.loads(body)["error"]


async def test_a_body_over_the_limit_is_refused_before_it_is_read() -> None:
    protocol, transport, core, frontend = await _connection()
    frontend.body_limit.max_bytes = 16
    protocol.data_received(_request(BODY)[:-5])  # the body has not all come
    for task in list(protocol.tasks):
        await task
    head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head
    assert "maximum allowed input size of 16 bytes" in orjson.loads(body)["error"]
    assert not core.admitted and frontend.body_limit.budget.held == 0


@pytest.mark.parametrize(
    "extra",
    [
        ("Content-Encoding: gzip",),
        ("Accept-Encoding: gzip",),
        ("Expect: 100-continue",),
        ("Inference-Header-Content-Length: 0",),
        ("Inference-Header-Content-Length: 00",),
    ],
)
async def test_requests_that_need_an_await_keep_the_task_path(extra: tuple[str, ...]) -> None:
    protocol, transport, core, _ = await _connection()
    body = gzip.compress(BODY) if "gzip" in extra[0] and "Content" in extra[0] else BODY
    protocol.data_received(_request(body, *extra))
    assert protocol.no_task is None
    assert len(protocol.tasks) == 1  # the request's task
    for task in list(protocol.tasks):
        task.cancel()
    await asyncio.sleep(0)


def _raw_request(target: str, body: bytes) -> bytes:
    return (
        f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@pytest.mark.parametrize(
    ("target", "model", "version"),
    [
        ("/v2/models/add/infer", "add", ""),  # started directly from the parser
        ("/v2/models/add/versions/2/infer", "add", "2"),
        ("/v2/models/add/infer?x=1", "add", ""),  # uvicorn's way: a query string
        ("/v2/models/my%20add/infer", "my add", ""),  # uvicorn's way: unquoted
        ("/v2/models/add/infer#part", "add", ""),  # uvicorn's way: a fragment
    ],
)
async def test_an_infer_url_reaches_the_same_request_whichever_way_it_starts(
    target: str, model: str, version: str
) -> None:
    protocol, transport, core, _ = await _connection()
    protocol.data_received(_raw_request(target, BODY))
    ((request, _, _),) = core.admitted
    assert (request.model_name, request.model_version) == (model, version)
    assert protocol.cycle.scope["path"] == target.split("?")[0].split("#")[0].replace("%20", " ")
    assert protocol.cycle.scope["method"] == "POST" and not protocol.tasks
    _answer(core, [3.0, 4.0])
    assert bytes(transport.written).startswith(b"HTTP/1.1 200 OK")


async def test_a_pipelined_infer_request_waits_for_the_answer_before_it() -> None:
    protocol, transport, core, _ = await _connection()
    served: list[InferRequest] = []

    async def infer(request: InferRequest, record: Any) -> InferResponse:  # the task path
        served.append(request)
        output = Tensor("OUTPUT0", "FP32", (1, 2), np.array([[5.0, 6.0]], dtype=np.float32), {})
        return InferResponse(model_name="add", model_version="1", outputs=[output])

    core.infer = infer  # type: ignore[attr-defined]
    protocol.data_received(_request(BODY) + _raw_request("/v2/models/add/versions/1/infer", BODY))
    assert len(core.admitted) == 1 and not served  # the second waits for the first's answer
    _answer(core, [3.0, 4.0])
    for task in list(protocol.tasks):
        await task
    assert [request.model_version for request in served] == ["1"]
    answers = bytes(transport.written).split(b"HTTP/1.1 200 OK")[1:]
    assert len(answers) == 2 and b"[5.0,6.0]" in answers[1]


async def test_a_get_on_an_infer_url_goes_to_the_app() -> None:
    protocol, transport, core, _ = await _connection()
    protocol.data_received(b"GET /v2/models/add/infer HTTP/1.1\r\nHost: x\r\n\r\n")
    for task in list(protocol.tasks):
        await task
    assert not core.admitted
    assert bytes(transport.written).startswith(b"HTTP/1.1 405")


async def test_answers_carry_the_date_uvicorn_renews() -> None:
    protocol, transport, core, _ = await _connection()
    protocol.server_state.default_headers = [(b"date", b"Mon, 07 Dec 2026 10:00:00 GMT")]
    protocol.data_received(_request(BODY))
    _answer(core, [3.0, 4.0])
    protocol.server_state.default_headers = [(b"date", b"Mon, 07 Dec 2026 10:00:01 GMT")]
    protocol.data_received(_request(BODY))
    _answer(core, [3.0, 4.0])
    first, second = bytes(transport.written).split(b"HTTP/1.1 200 OK")[1:]
    assert b"date: Mon, 07 Dec 2026 10:00:00 GMT" in first
    assert b"date: Mon, 07 Dec 2026 10:00:01 GMT" in second


async def test_an_idle_connection_closes_its_keep_alive_wait_after_its_last_answer() -> None:
    protocol, transport, core, _ = await _connection()
    protocol.timeout_keep_alive = 0.3
    protocol.data_received(_request(BODY))
    _answer(core, [3.0, 4.0])
    timer = protocol._idle_timer
    assert timer is not None and protocol.timeout_keep_alive_task is None
    await asyncio.sleep(0.2)
    protocol.data_received(_request(BODY))
    _answer(core, [3.0, 4.0])
    assert protocol._idle_timer is timer  # one timer for the connection, not one per answer
    await asyncio.sleep(0.2)  # past the first answer's deadline, within the second's
    assert not transport.closed and protocol._idle_timer is not None
    await asyncio.sleep(0.25)
    assert transport.closed


async def test_a_partial_request_after_an_answer_in_the_same_read_is_timed_as_headers() -> None:
    protocol, transport, core, _ = await _connection()
    protocol.limits = dataclasses.replace(protocol.limits, header_timeout=0.2)
    protocol.timeout_keep_alive = 30.0
    # refused at once (answered within the read), then the start of the next request
    protocol.data_received(_request(b'{"inputs": [}') + b"POST /v2/models/add/infer HTTP/1.1\r\n")
    assert bytes(transport.written).startswith(b"HTTP/1.1 400")
    assert protocol.timeout_keep_alive_task is not None  # the header wait, not the idle one
    await asyncio.sleep(0.35)
    assert transport.closed
