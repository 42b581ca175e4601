"""An infer POST served with no task: admitted from the parser's callback, answered from the
scheduler's.

Why: a small request's task costs more than its decode (bench/FINDINGS.md section 35). The task
path creates a task at the request's headers, steps it when its body is in, and awaits through
five coroutines (the protocol's, the frontend's, the core's, the path's, the scheduler's future)
before it answers. Here, once the whole body is in (`on_message_complete`), the request is
decoded and admitted with `core.infer_nowait` at once, and the answer is encoded and written in
that call's callback: the loop runs the request's Python in two callbacks, as the gRPC path
does (server/grpc/loop_bridge.py).

Only requests that need no await on their way take it (`HttpFrontend.nowait_fits`: small,
uncompressed, not raw binary, not `Expect: 100-continue`, not pipelined behind another one).
The rules stay those of the task path: the body budget holds the body until it is answered,
errors go through the one error table, and a client that disconnects drops its queued request
(its future is cancelled, as the task path cancels its task).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from protocol.errors import HTTP_ENDPOINT
from protocol.types import InferRequest, InferResponse
from server.http.receive import receive_stamps
from server.http.responses import JSON

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class Connection(Protocol):
    """What a request served with no task uses of its connection's protocol
    (server/http/fast_path.py's InferHttpProtocol, which imports this module)."""

    frontend: Any  # server.http.routes.HttpFrontend
    loop: asyncio.AbstractEventLoop
    no_task: NoTaskInfer | None

    def take_body(self, cycle: RequestResponseCycle) -> tuple[bytearray, int]: ...

    def error_answer(
        self, cycle: RequestResponseCycle, exc: BaseException
    ) -> tuple[int, dict[str, str], bytes]: ...

    def answer(
        self,
        cycle: RequestResponseCycle,
        status: int,
        media_type: str,
        payload: Any,
        extra: Mapping[str, str],
    ) -> None: ...

    def track(self, task: asyncio.Task) -> None: ...


class NoTaskInfer:
    """One infer request of a connection, from its headers until its answer is written."""

    __slots__ = (
        "protocol",
        "cycle",
        "name",
        "version",
        "headers",
        "start",
        "held",
        "request",
        "future",
        "begun",
        "ended",
    )

    def __init__(
        self,
        protocol: Connection,
        cycle: RequestResponseCycle,
        name: str,
        version: str,
        headers: Mapping[str, str],
    ) -> None:
        self.protocol = protocol
        self.cycle = cycle
        self.name = name
        self.version = version
        self.headers = headers
        self.start = time.monotonic_ns() if protocol.frontend.core.may_trace else 0
        self.held = 0  # body bytes charged to the frontend's budget until answered
        self.request: InferRequest | None = None
        self.future: asyncio.Future | None = None
        self.begun = False
        self.ended = False

    def begin(self) -> None:
        """The whole body is in: decode and admit (a refusal is answered at once)."""
        self.begun = True
        protocol, cycle = self.protocol, self.cycle
        frontend = protocol.frontend
        try:
            body, self.held = protocol.take_body(cycle)
            self.request = frontend.decode_small(
                self.name, self.version, self.headers, body, receive_stamps(self.start)
            )
            self.future = frontend.core.infer_nowait(self.request, self._answered, HTTP_ENDPOINT)
        except Exception as exc:  # undecodable, over a limit, a bad shared-memory reference
            self._answered(None, exc)

    def _answered(self, response: InferResponse | None, error: BaseException | None) -> None:
        if self.ended:
            return
        self._end()
        protocol, cycle = self.protocol, self.cycle
        if cycle.disconnected:
            return
        if error is None:
            assert response is not None and self.request is not None
            try:
                answer = protocol.frontend.encode_small(response, self.request)
            except Exception as exc:
                error = exc
            else:
                if answer is None:  # large outputs: encoded off the loop, in a task
                    protocol.track(protocol.loop.create_task(self._encode_later(response)))
                else:
                    payload, extra, media_type = answer
                    protocol.answer(cycle, 200, media_type, payload, extra)
                return
        status, extra_headers, body = protocol.error_answer(cycle, error)
        protocol.answer(cycle, status, JSON, body, extra_headers)

    async def _encode_later(self, response: InferResponse) -> None:
        protocol, cycle = self.protocol, self.cycle
        assert self.request is not None
        try:
            payload, extra, media_type = await protocol.frontend.encode_answer(
                response, self.request, self.headers
            )
        except Exception as exc:
            status, extra, body = protocol.error_answer(cycle, exc)
            protocol.answer(cycle, status, JSON, body, extra)
            return
        protocol.answer(cycle, 200, media_type, payload, extra)

    def _end(self) -> None:
        """The outcome is in (or nobody waits for it): the body's budget is given back."""
        self.ended = True
        protocol = self.protocol
        if protocol.no_task is self:
            protocol.no_task = None
        if self.held:
            protocol.frontend.body_limit.budget.held -= self.held
            self.held = 0

    def drop(self) -> None:
        """The connection is gone: a queued request is dropped (the scheduler counts it
        cancelled) and nothing is answered."""
        if self.ended:
            return
        future = self.future
        self._end()
        if future is not None:
            future.cancel()
