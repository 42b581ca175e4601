"""CoreAPI: everything the frontends (server/http, server/grpc) may call on the core.

Two classes implement it: InferenceCore (server/core/inference_core.py), in the process that
owns the models, and RemoteCore (server/multiprocess/remote_core.py), in a frontend process,
which answers over the frontend link. Frontends are typed against this Protocol, so mypy checks
that both cores offer what they call and that neither offers it differently.

ControlAPI is the part a frontend process forwards to the owner as control calls; the owner
answers exactly the names CONTROL_METHODS lists, derived from it, so the two sides cannot drift.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

from protocol.errors import HTTP_ENDPOINT
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
from server.settings import ServerSettings


class InputRule(Protocol):
    """One input as a frontend decodes it: its wire datatype and its dims (no batch dim)."""

    @property
    def wire(self) -> str: ...

    @property
    def dims(self) -> tuple[int, ...]: ...


class InputRules(Protocol):
    """What a frontend reads of a version's input rules (scheduler/validation.py's
    RequestRules, or the copy a frontend process receives) to decode a body that names no
    inputs itself: a raw binary body, a generate request."""

    @property
    def max_batch_size(self) -> int: ...

    @property
    def inputs(self) -> Mapping[str, InputRule]: ...


class Resolved(Protocol):
    """The version a request was resolved to before its body was decoded. A frontend reads
    its input rules (CoreAPI.input_rules) and hands it back to `infer` / `infer_stream`, so the
    request runs on the version whose rules decoded it; it reads nothing else of it."""


class ControlAPI(Protocol):
    """The calls a frontend process makes to the model owner (rare, answered there)."""

    def ready(self) -> bool: ...

    def server_metadata(self) -> dict: ...

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata: ...

    def model_config(self, name: str, version: str = "") -> ModelConfig: ...

    def model_ready(self, name: str, version: str = "") -> bool: ...

    def statistics(self, name: str = "", version: str = "") -> list[StatisticsSnapshot]: ...

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]: ...

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None: ...

    def resolve(self, name: str, version: str = "") -> Resolved:
        """The version a request for (name, version) goes to (NOT_FOUND / UNAVAILABLE); a
        frontend process receives its input rules only (the owner picks the version again)."""
        ...

    def traffic_policy(self, name: str) -> dict: ...

    def set_traffic_policy(self, name: str, spec: TrafficSpec) -> dict: ...

    def delete_traffic_policy(self, name: str) -> dict: ...

    def register_system_shared_memory(
        self, name: str, key: str, offset: int, byte_size: int
    ) -> None: ...

    def system_shared_memory_status(self, name: str = "") -> list[dict]: ...

    def unregister_system_shared_memory(self, name: str = "") -> None: ...

    def cuda_shared_memory_status(self, name: str = "") -> list[dict]: ...

    def trace_settings(
        self, model: str = "", changes: dict[str, list[str] | None] | None = None
    ) -> dict[str, list[str]]: ...

    def log_settings(self, changes: dict | None = None) -> dict: ...


class CoreAPI(ControlAPI, Protocol):
    """ControlAPI plus what each core answers itself: its settings and state, and inference."""

    @property
    def settings(self) -> ServerSettings: ...

    @property
    def exiting(self) -> bool:
        """Shutdown has begun: readiness is off and new requests are refused."""
        ...

    @property
    def may_trace(self) -> bool:
        """A request may be traced: only then do frontends take receive timestamps."""
        ...

    @property
    def propagates_trace(self) -> bool:
        """OpenTelemetry mode: frontends read each request's W3C traceparent."""
        ...

    def live(self) -> bool: ...

    def input_rules(self, resolved: Resolved) -> InputRules:
        """The input rules of a version `resolve` gave."""
        ...

    async def infer(
        self,
        request: InferRequest,
        record: Resolved | None = None,
        endpoint: str = HTTP_ENDPOINT,
    ) -> InferResponse: ...

    def infer_nowait(
        self,
        request: InferRequest,
        on_done: Callable[[InferResponse | None, BaseException | None], None],
        endpoint: str = HTTP_ENDPOINT,
    ) -> asyncio.Future | None:
        """`infer` without a task per request, for a caller that keeps none (the model owner
        answering a frontend process, the synchronous gRPC server): `on_done(response, error)`
        runs on the loop once the answer is in. Returns a future whose cancel drops the
        request (and calls no `on_done`), or None when it was refused at once (on_done has
        run). May raise at once (a bad shared-memory reference)."""
        ...

    def infer_stream(
        self, request: InferRequest, record: Resolved | None = None
    ) -> AsyncIterator[StreamItem]: ...


def _methods(protocol: type) -> frozenset[str]:
    """The public methods a Protocol declares, its bases' included."""
    return frozenset(
        name
        for klass in protocol.__mro__
        if klass is not object and klass is not Protocol and klass.__module__ == __name__
        for name, value in vars(klass).items()
        if not name.startswith("_") and callable(value)
    )


# The control calls the owner answers for a frontend process: ControlAPI, nothing else.
CONTROL_METHODS: frozenset[str] = _methods(ControlAPI)
