"""The core a frontend process serves from: the same API (server/core/api.py's CoreAPI) as
server/core/inference_core.py, answered by the process that owns the models.

Inference goes over the frontend link (server/multiprocess/link.py: tensors through shared
memory, one message each way per request, no task per request on the frontend side). Everything
else (health, metadata, configuration, statistics, the repository API) is a blocking call to the
owner over a control socket: the frontends call those synchronously from their handlers, they
are rare, and the owner answers them on its event loop, so what a frontend process reports is
exactly what the owner knows. Loads and unloads, which take seconds, use a second control socket
from a thread, so that a health check answered meanwhile never waits behind them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from multiprocessing.connection import Connection
from typing import Any

from protocol.errors import HTTP_ENDPOINT, Unavailable, server_exiting
from protocol.link_codec import pack_request, unpack_response
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.stream import StreamItem
from protocol.traffic import TrafficSpec
from protocol.types import (
    IndexEntry,
    InferRequest,
    InferResponse,
    ModelMetadata,
    StatisticsSnapshot,
)
from server.core.api import InputRule, InputRules, Resolved
from server.multiprocess.arena import Arena
from server.multiprocess.link import CANCEL, ERROR, EXITING, INFER, RESULT, FrontendLink
from server.observability.runtime_settings import apply_log_settings
from server.observability.tracing import may_trace
from server.settings import ServerSettings

OWNER_GONE = "the model owner process is gone; the server is restarting or stopping"
CONTROL_TIMEOUT_S = 30.0  # the longest a frontend waits for the owner to answer a control call
RULES_TTL_S = 1.0  # how long a frontend reuses a model's input rules (raw binary requests)
# A decoupled model streamed over a connection a frontend process accepted is refused so.
FRONTEND_STREAM_ENDPOINT = "A frontend process (--frontend-processes)"


class ControlClient:
    """Blocking calls over one control socket; each answer is matched to its call."""

    def __init__(self, connection: Connection, timeout: float = CONTROL_TIMEOUT_S) -> None:
        self.connection = connection
        self.timeout = timeout
        self.lock = threading.Lock()
        self.sequence = 0

    def call(self, method: str, *args: Any) -> Any:
        with self.lock:
            self.sequence += 1
            ident = self.sequence
            deadline = time.monotonic() + self.timeout
            try:
                self.connection.send((ident, method, args))
                while True:  # an answer to an earlier call that timed out is skipped
                    if not self.connection.poll(max(0.0, deadline - time.monotonic())):
                        raise Unavailable(
                            f"the model owner process did not answer '{method}' "
                            f"within {self.timeout:g} s"
                        )
                    answer, ok, value = self.connection.recv()
                    if answer == ident:
                        break
            except (EOFError, OSError):
                raise Unavailable(OWNER_GONE) from None
        if ok:
            return value
        raise value


class RemoteCore:
    """The CoreAPI (server/core/api.py) in a frontend process. It owns the link to the model
    owner, built here over the two arenas (outgoing, incoming), since the link calls back into
    this core for every answer."""

    def __init__(
        self,
        settings: ServerSettings,
        quick: ControlClient,
        slow: ControlClient,
        loop: asyncio.AbstractEventLoop,
        outgoing: Arena,
        incoming: Arena,
    ) -> None:
        self.settings = settings
        self.quick = quick
        self.slow = slow
        self.loop = loop
        self.link = FrontendLink(outgoing, incoming, self.on_message, self.on_lost)
        self.started = False
        self.exiting = False
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._rules: dict[tuple[str, str], tuple[float, RemoteRules]] = {}
        # OpenTelemetry mode: requests carry the client's traceparent to the owner.
        self.propagates_trace = settings.trace_config.get("trace_mode") == ["opentelemetry"]
        self.may_trace = may_trace(settings)

    # ----- the link's callbacks --------------------------------------------------------
    def on_message(self, message: tuple) -> None:
        tag = message[0]
        if tag == RESULT or tag == ERROR:
            future = self._pending.pop(message[1], None)
            if future is not None and not future.done():
                if tag == RESULT:
                    future.set_result(unpack_response(message[2]))
                else:
                    future.set_exception(message[2])
        elif tag == EXITING:
            self.exiting = True

    def on_lost(self, exc: Exception | None) -> None:
        self.exiting = True
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(Unavailable(OWNER_GONE))

    # ----- health, metadata, configuration, statistics, repository --------------------
    def live(self) -> bool:
        return self.started and not self.exiting

    def ready(self) -> bool:
        return self.live() and bool(self.quick.call("ready"))

    def server_metadata(self) -> dict:
        return self.quick.call("server_metadata")

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        return self.quick.call("model_metadata", name, version)

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        return ModelConfig.FromString(self.quick.call("model_config", name, version))

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.live() and bool(self.quick.call("model_ready", name, version))

    def statistics(self, name: str = "", version: str = "") -> list[StatisticsSnapshot]:
        return self.quick.call("statistics", name, version)

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        return self.quick.call("repository_index", ready_only)

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        await asyncio.to_thread(self.slow.call, "load_model", name, config_json, files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        await asyncio.to_thread(self.slow.call, "unload_model", name, unload_dependents)

    # ----- gray release: the owner holds the policies (server/traffic/policy.py) ----------------
    def traffic_policy(self, name: str) -> dict:
        return self.quick.call("traffic_policy", name)

    def set_traffic_policy(self, name: str, spec: TrafficSpec) -> dict:
        return self.quick.call("set_traffic_policy", name, spec)

    def delete_traffic_policy(self, name: str) -> dict:
        return self.quick.call("delete_traffic_policy", name)

    # ----- trace and log settings: the owner's, applied to this process's logging too ----
    def trace_settings(
        self, model: str = "", changes: dict[str, list[str] | None] | None = None
    ) -> dict[str, list[str]]:
        return self.quick.call("trace_settings", model, changes)

    def log_settings(self, changes: dict | None = None) -> dict:
        values = self.quick.call("log_settings", changes)
        apply_log_settings(values)
        return values

    # ----- shared memory: the regions live in the owner, which reads and writes them ----
    def register_system_shared_memory(
        self, name: str, key: str, offset: int, byte_size: int
    ) -> None:
        self.quick.call("register_system_shared_memory", name, key, offset, byte_size)

    def system_shared_memory_status(self, name: str = "") -> list[dict]:
        return self.quick.call("system_shared_memory_status", name)

    def unregister_system_shared_memory(self, name: str = "") -> None:
        self.quick.call("unregister_system_shared_memory", name)

    def cuda_shared_memory_status(self, name: str = "") -> list[dict]:
        return self.quick.call("cuda_shared_memory_status", name)

    # ----- inference -------------------------------------------------------------------
    def resolve(self, name: str, version: str = "") -> RemoteRules:
        """What a raw binary body needs of the version it goes to: its input rules (the
        owner still picks the version the request runs on), reused for RULES_TTL_S."""
        key = (name, version)
        now = time.monotonic()
        cached = self._rules.get(key)
        if cached is None or now - cached[0] > RULES_TTL_S:
            if len(self._rules) > 1024:
                self._rules.clear()
            cached = self._rules[key] = (now, self.quick.call("resolve", name, version))
        return cached[1]

    def input_rules(self, resolved: Resolved) -> InputRules:
        """In a frontend process a resolved version is its input rules (RemoteRules)."""
        assert isinstance(resolved, RemoteRules)
        return resolved

    async def infer_stream(
        self, request: InferRequest, record: Resolved | None = None
    ) -> AsyncIterator[StreamItem]:
        """The one answer of a model that is not decoupled; decoupled models stream only from
        the model owner's own listeners (the link carries one answer per request)."""
        yield StreamItem(
            final=True, response=await self.infer(request, record, FRONTEND_STREAM_ENDPOINT)
        )

    async def infer(
        self, request: InferRequest, record: Resolved | None = None, endpoint: str = HTTP_ENDPOINT
    ) -> InferResponse:
        """`record` is not sent: the owner picks the version the request runs on."""
        self._check_open()
        ident, future = self._send(request, endpoint)
        try:
            return await future
        except asyncio.CancelledError:
            self._cancel(ident)
            raise
        finally:
            self._ended()

    def infer_nowait(
        self,
        request: InferRequest,
        on_done: Callable[[InferResponse | None, BaseException | None], None],
        endpoint: str = HTTP_ENDPOINT,
    ) -> asyncio.Future | None:
        """`infer` with no task (CoreAPI.infer_nowait): cancelling the returned future tells
        the owner to drop the request, and calls no `on_done`."""
        try:
            self._check_open()
        except Exception as exc:
            on_done(None, exc)
            return None
        ident, future = self._send(request, endpoint)

        def finished(done: asyncio.Future) -> None:
            self._ended()
            if done.cancelled():
                self._cancel(ident)
                return
            error = done.exception()
            on_done(None if error is not None else done.result(), error)

        future.add_done_callback(finished)
        return future

    def _check_open(self) -> None:
        if self.exiting:
            raise server_exiting()
        if self.link.closed:
            raise Unavailable(OWNER_GONE)

    def _send(self, request: InferRequest, endpoint: str) -> tuple[int, asyncio.Future]:
        """Hand the request to the owner; its answer will resolve the future."""
        self._next_id += 1
        ident = self._next_id
        future = self.loop.create_future()
        self._pending[ident] = future
        self.link.send(
            (INFER, ident, pack_request(request))
            if endpoint == HTTP_ENDPOINT
            else (INFER, ident, pack_request(request), endpoint)
        )
        self.inflight += 1
        self._idle.clear()
        return ident, future

    def _cancel(self, ident: int) -> None:
        if self._pending.pop(ident, None) is not None:
            self.link.send((CANCEL, ident))  # the owner drops it if it has not run yet

    def _ended(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


class RemoteRules:
    """The part of a version's RequestRules a frontend reads (scheduler/validation.py): the
    owner's answer to `resolve`, and a frontend process's Resolved."""

    __slots__ = ("max_batch_size", "inputs")

    def __init__(self, max_batch_size: int, inputs: dict[str, InputRule]) -> None:
        self.max_batch_size = max_batch_size
        self.inputs = inputs

    def __reduce__(self) -> tuple:
        return RemoteRules, (self.max_batch_size, self.inputs)
