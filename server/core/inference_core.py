"""The only API the frontends call: health, metadata, config, statistics, repository, infer.

Everything here speaks the internal types and raises ServerError subclasses; each frontend maps
them to its wire form through protocol/errors.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from protocol import datatypes
from protocol.config_json import ConfigJsonError, config_from_json
from protocol.errors import (
    HTTP_ENDPOINT,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ServerError,
    Unavailable,
)
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.stream import StreamItem
from protocol.text import shown
from protocol.traffic import TrafficSpec
from protocol.types import (
    IndexEntry,
    InferRequest,
    InferResponse,
    ModelMetadata,
    StatisticsSnapshot,
    TensorMetadata,
)
from repository.manager import UNLOADED, ModelManager
from repository.registry import ModelRecord, ModelRegistry, ModelState, VersionRecord, parse_version
from scheduler.interface import LoadError
from scheduler.validation import RequestRules
from server.core.api import Resolved
from server.core.client_shm import Binding, SharedMemoryRegistry
from server.core.inference_path import InferencePath
from server.observability.runtime_settings import RuntimeSettings
from server.observability.tracing import Trace, Tracer, may_trace
from server.settings import ServerSettings

log = logging.getLogger(__name__)

SERVER_VERSION = "0.1.0"
# Only what really works end to end.
EXTENSIONS = [
    "classification",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "sequence",
    "sequence(string_id)",
    "trace",
    "logging",
]
POLLING_REFUSAL = "explicit model load / unload is not allowed if polling is enabled"
FILE_OVERRIDE_FLAG = "--allow-model-load-file-override"


class InferenceCore:
    """The core in the process that owns the models (server/core/api.py's CoreAPI)."""

    def __init__(
        self,
        settings: ServerSettings,
        registry: ModelRegistry,
        manager: ModelManager,
        path: InferencePath,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.manager = manager
        self.path = path
        self.started = False
        # Set at startup when a --model-repository path does not exist and --exit-on-error is
        # off: the server keeps answering metadata but is not live, as Triton is not.
        self.repository_failure = ""
        self.shared_memory = SharedMemoryRegistry(
            settings.max_shared_memory_regions,
            # What a request may take from regions: as much as the larger body limit allows
            # (the core does not know which frontend a forwarded request came through).
            max(settings.http_max_input_size, settings.grpc_max_input_size or 0),
            min(settings.http_offload_threshold, settings.grpc_offload_threshold),
        )
        # Trace and log settings: one state, read and changed over both protocols.
        self.runtime = RuntimeSettings.create(settings.log_verbose, settings.trace_config)
        self.tracer = _tracer(settings, self.runtime)  # server/observability/tracing.py, otel.py
        # OpenTelemetry mode: the frontends read each request's W3C traceparent.
        self.propagates_trace = settings.trace_config.get("trace_mode") == ["opentelemetry"]
        # Whether a request may ever be traced (a trace file, or OpenTelemetry, at startup):
        # only then do the frontends take receive timestamps.
        self.may_trace = may_trace(settings)

    @property
    def exiting(self) -> bool:
        """Shutdown has begun: readiness is off and new requests are refused."""
        return self.path.exiting

    @exiting.setter
    def exiting(self, value: bool) -> None:
        self.path.exiting = value

    @property
    def inflight(self) -> int:
        return self.path.inflight

    # ----- health --------------------------------------------------------------------------
    def live(self) -> bool:
        return self.started and not self.exiting and not self.repository_failure

    def ready(self) -> bool:
        """Kubernetes readiness. Strict (the default): live, at least one model serving, and
        every model the server is meant to serve has a healthy ready version; a model on its
        first load does not count against it (Triton #7014), an unloaded one is not meant to
        serve; with no model at all not ready, unless --ready-with-no-models. Not strict: live,
        as Triton (an explicit-mode server that starts empty and loads later is ready)."""
        if not self.live():
            return False
        if not self.settings.strict_readiness:
            return True
        if not self.registry.serving_versions() and not self.settings.ready_with_no_models:
            return False
        return all(_model_counts_as_ready(model) for model in self.registry.models.values())

    # ----- metadata and config -----------------------------------------------------------
    def server_metadata(self) -> dict:
        return {
            "name": self.settings.server_id,
            "version": SERVER_VERSION,
            "extensions": list(EXTENSIONS),
        }

    def _config_for(self, name: str, version: str) -> tuple[ModelConfig, list[str]]:
        model = self.registry.get(name)
        number = parse_version(version, name)
        if number == -1:
            ready = model.ready_versions()
            if not ready:
                raise Unavailable(
                    f"Request for unknown model: '{shown(name)}' has no available versions"
                )
            record = model.versions[ready[-1]]
            return record.spec.config, [str(v) for v in ready]  # type: ignore[union-attr]
        record = self.registry.resolve(name, version)
        return record.spec.config, [str(number)]  # type: ignore[union-attr]

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        config, versions = self._config_for(name, version)
        batch = [-1] if config.max_batch_size > 0 else []

        def describe(tensors: Any) -> list[TensorMetadata]:  # a repeated ModelInput or ModelOutput
            return [
                TensorMetadata(
                    t.name,
                    datatypes.config_to_wire(_type_name(t.data_type)),
                    batch + [int(d) for d in t.dims],
                )
                for t in tensors
            ]

        platform = config.platform or config.backend
        return ModelMetadata(
            name, versions, platform, describe(config.input), describe(config.output)
        )

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self._config_for(name, version)[0]

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.live() and self.registry.is_ready(name, version)

    # ----- statistics --------------------------------------------------------------------
    def statistics(self, name: str = "", version: str = "") -> list[StatisticsSnapshot]:
        """A consistent copy of each serving version's counters (all models when no name)."""
        if not name:
            return [
                r.scheduler.statistics.snapshot()  # type: ignore[union-attr]
                for _, r in self.registry.serving_versions()
            ]
        try:
            model = self.registry.get(name)
            number = parse_version(version, name)
        except ServerError:
            raise InvalidArgument(f"requested model '{shown(name)}' is not available") from None
        records = [
            r
            for v, r in sorted(model.versions.items())
            if r.serving and (number == -1 or v == number)
        ]
        if not records:
            raise InvalidArgument(f"requested model '{shown(name)}' is not available")
        return [r.scheduler.statistics.snapshot() for r in records]  # type: ignore[union-attr]

    # ----- repository ---------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        entries: list[IndexEntry] = []
        names = set(self.registry.models) | set(self.manager.model_names())
        for name in sorted(names):
            model = self.registry.models.get(name)
            if model is None or (not model.versions and model.state is ModelState.UNKNOWN):
                if not ready_only:
                    entries.append(IndexEntry(name))
                continue
            if not model.versions:
                if not ready_only:
                    entries.append(IndexEntry(name, "", model.state.value, model.reason))
                continue
            for number, record in sorted(model.versions.items()):
                if ready_only and not record.healthy():
                    continue
                reason = record.reason or (model.reason if not record.serving else "")
                state = record.state.value
                if record.serving and not record.healthy():
                    state = ModelState.UNAVAILABLE.value
                    reason = getattr(record.scheduler, "failure_reason", "") or "not ready"
                entries.append(IndexEntry(name, str(number), state, reason))
        return entries

    def _check_explicit(self) -> None:
        if self.settings.model_control_mode != "explicit":
            raise Unavailable(POLLING_REFUSAL)

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """Load or hot-reload `name`; `config_json` replaces config.pbtxt, and `files` (which
        need it) make up the whole model directory, written to a private temporary one.
        Files are refused unless the server was started with --allow-model-load-file-override:
        they are code the server would run (a Python model) sent by any network client."""
        self._check_explicit()
        if files and not self.settings.allow_model_load_file_override:
            raise PermissionDenied(
                f"load failed for model '{name}': file overrides ('file:' "
                f"parameters) are not allowed; start the server with "
                f"{FILE_OVERRIDE_FLAG} to allow them"
            )
        override = None
        if config_json is not None:
            try:
                override = config_from_json(config_json)
            except ConfigJsonError as exc:
                raise InvalidArgument(f"load failed for model '{shown(name)}': {exc}") from None
        try:
            await self.manager.load_model(name, override, files=files or None)
        except LoadError as exc:
            raise InvalidArgument(str(exc)) from None

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check_explicit()
        await self.manager.unload_model(name, unload_dependents)

    # ----- shared memory (server/core/client_shm.py) ------------------------------------------
    def register_system_shared_memory(
        self, name: str, key: str, offset: int, byte_size: int
    ) -> None:
        self.shared_memory.register(name, key, offset, byte_size)

    def system_shared_memory_status(self, name: str = "") -> list[dict]:
        return self.shared_memory.status(name)

    def unregister_system_shared_memory(self, name: str = "") -> None:
        self.shared_memory.unregister(name)

    def cuda_shared_memory_status(self, name: str = "") -> list[dict]:
        """No CUDA here: nothing is registered, as Triton built without GPU support answers."""
        if name:
            raise NotFound(f"Unable to find cuda shared memory region: '{shown(name)}'")
        return []

    # ----- trace and log settings (server/observability/runtime_settings.py) -----------------
    def trace_settings(
        self, model: str = "", changes: dict[str, list[str] | None] | None = None
    ) -> dict[str, list[str]]:
        """The settings of `model` (or the global ones), after applying `changes` if any."""
        if model and not self.registry.is_ready(model, ""):  # Triton's check, code and text
            raise InvalidArgument(f"Request for unknown model : {model}")
        if changes:
            self.runtime.trace.update(changes, model)
        return self.runtime.trace.current(model)

    def log_settings(self, changes: dict | None = None) -> dict:
        """The log settings, after applying `changes` (all or nothing) if any."""
        if changes:
            self.runtime.log.update(changes)
        return dict(self.runtime.log.values)

    # ----- inference ---------------------------------------------------------------------
    def resolve(self, name: str, version: str = "") -> VersionRecord:
        """The version an inference request for (name, version) goes to."""
        return self.path.resolve(name, version)

    def input_rules(self, resolved: Resolved) -> RequestRules:
        """The input rules of a version `resolve` gave (a VersionRecord: this core's own)."""
        return _record(resolved).scheduler.rules  # type: ignore[union-attr]

    def _begin(self, request: InferRequest) -> tuple[Binding | None, Trace | None]:
        """What every in-process infer opens with: the request's shared-memory regions bound
        (raises at once for a bad reference), and its trace when it is sampled."""
        binding = self.shared_memory.bind(request)
        trace = self.tracer.sample(request) if self.runtime.trace.active else None
        return binding, trace

    async def infer(
        self,
        request: InferRequest,
        record: Resolved | None = None,
        endpoint: str = HTTP_ENDPOINT,
    ) -> InferResponse:
        """The one in-process infer (server/core/inference_path.py); `record` when already resolved;
        `endpoint` names the caller when a decoupled model must be refused. Tensors in
        registered shared memory are read and written here, where the regions are, and
        sampled requests are traced here."""
        binding, trace = self._begin(request)
        if binding is None and trace is None:
            return await self.path.infer(request, _record(record), endpoint)
        return await self._infer_bound(request, record, endpoint, binding, trace)

    async def _infer_bound(
        self,
        request: InferRequest,
        record: Resolved | None,
        endpoint: str,
        binding: Binding | None,
        trace: Trace | None,
    ) -> InferResponse:
        try:
            if binding is not None and binding.deferred:
                await asyncio.to_thread(binding.read_deferred)  # large inputs: off the loop
            response = await self.path.infer(request, _record(record), endpoint)
            return await self._finish_async(response, binding, trace)
        except BaseException:
            if trace is not None and not trace.finished:
                self.tracer.finish(trace, None, request.model_version)
            raise
        finally:
            if binding is not None:
                binding.release()

    def infer_stream(
        self, request: InferRequest, record: Resolved | None = None
    ) -> AsyncIterator[StreamItem]:
        """Every answer to a client's request (any number for a decoupled model); each answer
        with outputs in shared memory writes them there (the next one overwrites them)."""
        binding, trace = self._begin(request)
        if binding is None and trace is None:
            return self.path.stream(request, _record(record), admitted=False)
        if binding is not None and binding.deferred:
            return self._read_then_stream(request, record, binding, trace)
        try:
            answers = self.path.stream(request, _record(record), admitted=False)
        except BaseException:
            self._end(request, None, binding, trace)
            raise
        return self._bound_answers(request, answers, binding, trace)

    async def _read_then_stream(
        self, request: InferRequest, record: Resolved | None, binding: Binding, trace: Trace | None
    ) -> AsyncIterator[StreamItem]:
        """infer_stream for a request with large shared-memory inputs: read them in a thread
        first."""
        try:
            await asyncio.to_thread(binding.read_deferred)
            answers = self.path.stream(request, _record(record), admitted=False)
        except BaseException:
            self._end(request, None, binding, trace)
            raise
        async for item in self._bound_answers(request, answers, binding, trace):
            yield item

    async def _bound_answers(
        self,
        request: InferRequest,
        answers: AsyncIterator[StreamItem],
        binding: Binding | None,
        trace: Trace | None,
    ) -> AsyncIterator[StreamItem]:
        last: InferResponse | None = None
        try:
            async for item in answers:
                if item.response is not None:
                    last = item.response
                    if binding is not None:
                        item.response = await _write_outputs(binding, item.response)
                yield item
        finally:
            self._end(request, last, binding, trace)

    def _end(
        self,
        request: InferRequest,
        response: InferResponse | None,
        binding: Binding | None,
        trace: Trace | None,
    ) -> None:
        if trace is not None and not trace.finished:
            self.tracer.finish(
                trace, response, response.model_version if response else request.model_version
            )
        if binding is not None:
            binding.release()

    def infer_nowait(
        self,
        request: InferRequest,
        on_done: Callable[[InferResponse | None, BaseException | None], None],
        endpoint: str = HTTP_ENDPOINT,
    ) -> asyncio.Future | None:
        """`infer` for the owner answering a frontend process (InferencePath.infer_nowait:
        no task per request). Raises at once for a bad shared-memory reference."""
        binding, trace = self._begin(request)
        if binding is None and trace is None:
            return self.path.infer_nowait(request, on_done, endpoint)
        if binding is not None and binding.deferred:  # large inputs: read in a thread first
            return asyncio.ensure_future(
                self._answer_later(request, on_done, endpoint, binding, trace)
            )

        def done(response: InferResponse | None, error: BaseException | None) -> None:
            if error is None and response is not None and binding and binding.heavy(response):
                asyncio.ensure_future(
                    self._finish_later(request, response, on_done, binding, trace)
                )
                return
            if error is None and response is not None:
                try:
                    response = self._finish(response, binding, trace)
                except Exception as exc:
                    response, error = None, exc
            self._end(request, None, binding, trace)
            on_done(response, error)

        future = self.path.infer_nowait(request, done, endpoint)
        if future is not None and binding is not None:  # a cancelled request calls no `done`
            future.add_done_callback(lambda _: binding.release())
        return future

    async def _answer_later(
        self,
        request: InferRequest,
        on_done: Callable[[InferResponse | None, BaseException | None], None],
        endpoint: str,
        binding: Binding,
        trace: Trace | None,
    ) -> None:
        """infer_nowait for a request whose inputs are read in a thread (a cancel of the task
        answers nothing, as a cancelled request does)."""
        try:
            response = await self._infer_bound(request, None, endpoint, binding, trace)
        except Exception as exc:
            on_done(None, exc)
        else:
            on_done(response, None)

    async def _finish_later(
        self,
        request: InferRequest,
        response: InferResponse,
        on_done: Callable[[InferResponse | None, BaseException | None], None],
        binding: Binding,
        trace: Trace | None,
    ) -> None:
        """infer_nowait's answer when its shared-memory outputs are written in a thread."""
        error: BaseException | None = None
        try:
            answer: InferResponse | None = await self._finish_async(response, binding, trace)
        except Exception as exc:
            answer, error = None, exc
        self._end(request, None, binding, trace)
        on_done(answer, error)

    def _finish(
        self, response: InferResponse, binding: Binding | None, trace: Trace | None
    ) -> InferResponse:
        if trace is not None:
            self.tracer.finish(trace, response, response.model_version)
        return response if binding is None else binding.finish(response)

    async def _finish_async(
        self, response: InferResponse, binding: Binding | None, trace: Trace | None
    ) -> InferResponse:
        """_finish, with large shared-memory outputs serialized and written in a thread."""
        if trace is not None:
            self.tracer.finish(trace, response, response.model_version)
        return response if binding is None else await _write_outputs(binding, response)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no inference is in flight; False if the timeout passed first."""
        return await self.path.wait_idle(timeout)

    # ----- gray release (server/traffic/policy.py) ------------------------------------------------
    def traffic_policy(self, name: str) -> dict:
        """The GET /v2/models/M/traffic body; NOT_FOUND for an unknown model."""
        return self.path.traffic.status(name)

    def set_traffic_policy(self, name: str, spec: TrafficSpec) -> dict:
        return self.path.traffic.replace(name, spec)

    def delete_traffic_policy(self, name: str) -> dict:
        return self.path.traffic.delete(name)


async def _write_outputs(binding: Binding, response: InferResponse) -> InferResponse:
    """binding.finish, in a thread when the outputs are over the offload threshold."""
    if binding.heavy(response):
        return await asyncio.to_thread(binding.finish, response)
    return binding.finish(response)


def _record(resolved: Resolved | None) -> VersionRecord | None:
    """A Resolved handed back to this core is one its `resolve` gave: a VersionRecord."""
    return cast("VersionRecord | None", resolved)


def _tracer(settings: ServerSettings, runtime: RuntimeSettings) -> Tracer:
    if settings.trace_config.get("trace_mode") == ["opentelemetry"]:
        from server.observability.otel import OtelTracer, build_provider

        return OtelTracer(runtime.trace, build_provider(settings.otel_config))
    return Tracer(runtime.trace)


def _type_name(value: int) -> str:
    from protocol.proto.model_config_pb2 import DataType

    return DataType.Name(value)


def _model_counts_as_ready(model: ModelRecord) -> bool:
    """Strict readiness for one model: its serving versions are healthy, no version its policy
    wants failed to load (even while an older one keeps serving, as Triton counts it), and it
    serves unless it was unloaded, was never loaded, or is still on its first load."""
    if any(record.serving and not record.healthy() for record in model.versions.values()):
        return False
    if model.ready_versions() or model.reason == UNLOADED:
        # UNAVAILABLE versions are failed loads the policy wants, or retired ("unloaded") ones.
        return not any(
            record.state is ModelState.UNAVAILABLE and record.reason != UNLOADED
            for record in model.versions.values()
        )
    if not model.versions:
        return model.state is ModelState.UNKNOWN
    return all(record.state is ModelState.LOADING for record in model.versions.values())
