"""The only API the frontends call: health, metadata, config, statistics, repository, infer.

Everything here speaks the internal types and raises ServerError subclasses; each frontend maps
them to its wire form through protocol/errors.py.
"""
from __future__ import annotations

import logging
from typing import AsyncIterator, Optional

from protocol.config_json import ConfigJsonError, config_from_json
from protocol.errors import (HTTP_ENDPOINT, InvalidArgument, PermissionDenied, ServerError,
                             Unavailable)
from protocol.stream import StreamItem
from protocol.model_config_pb2 import ModelConfig
from protocol.traffic_json import TrafficSpec
from protocol.types import (IndexEntry, InferRequest, InferResponse, ModelMetadata,
                            StatisticsSnapshot, TensorMetadata)
from protocol import datatypes
from repository.manager import UNLOADED, ModelManager
from repository.registry import (ModelRecord, ModelRegistry, ModelState, VersionRecord,
                                 parse_version)
from scheduler.interface import LoadError
from server.inference import InferencePath
from server.settings import ServerSettings

log = logging.getLogger(__name__)

SERVER_NAME = "ascend-serve"
SERVER_VERSION = "0.1.0"
# Only what really works end to end.
EXTENSIONS = [
    "classification",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "sequence",
    "sequence(string_id)",
]
POLLING_REFUSAL = "explicit model load / unload is not allowed if polling is enabled"
FILE_OVERRIDE_FLAG = "--allow-model-load-file-override"


class InferenceCore:
    def __init__(self, settings: ServerSettings, registry: ModelRegistry,
                 manager: ModelManager, path: InferencePath) -> None:
        self.settings = settings
        self.registry = registry
        self.manager = manager
        self.path = path
        self.started = False
        # Set at startup when a --model-repository path does not exist and --exit-on-error is
        # off: the server keeps answering metadata but is not live, as Triton is not.
        self.repository_failure = ""

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
        serve. Not strict: live, as Triton (an explicit-mode server that starts empty and loads
        later is ready)."""
        if not self.live():
            return False
        if not self.settings.strict_readiness:
            return True
        if not self.registry.serving_versions():
            return False
        return all(_model_counts_as_ready(model) for model in self.registry.models.values())

    # ----- metadata and config -----------------------------------------------------------
    def server_metadata(self) -> dict:
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}

    def _config_for(self, name: str, version: str) -> tuple[ModelConfig, list[str]]:
        model = self.registry.get(name)
        number = parse_version(version, name)
        if number == -1:
            ready = model.ready_versions()
            if not ready:
                raise Unavailable(f"Request for unknown model: '{name}' has no available versions")
            record = model.versions[ready[-1]]
            return record.spec.config, [str(v) for v in ready]  # type: ignore[union-attr]
        record = self.registry.resolve(name, version)
        return record.spec.config, [str(number)]  # type: ignore[union-attr]

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        config, versions = self._config_for(name, version)
        batch = [-1] if config.max_batch_size > 0 else []

        def describe(tensors) -> list[TensorMetadata]:  # type: ignore[no-untyped-def]
            return [TensorMetadata(t.name, datatypes.config_to_wire(_type_name(t.data_type)),
                                   batch + [int(d) for d in t.dims]) for t in tensors]

        platform = config.platform or config.backend
        return ModelMetadata(name, versions, platform, describe(config.input), describe(config.output))

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self._config_for(name, version)[0]

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.live() and self.registry.is_ready(name, version)

    # ----- statistics --------------------------------------------------------------------
    def statistics(self, name: str = "", version: str = "") -> list[StatisticsSnapshot]:
        """A consistent copy of each serving version's counters (all models when no name)."""
        if not name:
            return [r.scheduler.statistics.snapshot()  # type: ignore[union-attr]
                    for _, r in self.registry.serving_versions()]
        try:
            model = self.registry.get(name)
            number = parse_version(version, name)
        except ServerError:
            raise InvalidArgument(f"requested model '{name}' is not available") from None
        records = [r for v, r in sorted(model.versions.items())
                   if r.serving and (number == -1 or v == number)]
        if not records:
            raise InvalidArgument(f"requested model '{name}' is not available")
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

    async def load_model(self, name: str, config_json: Optional[str] = None,
                         files: Optional[dict[str, bytes]] = None) -> None:
        """Load or hot-reload `name`; `config_json` replaces config.pbtxt, and `files` (which
        need it) make up the whole model directory, written to a private temporary one.
        Files are refused unless the server was started with --allow-model-load-file-override:
        they are code the server would run (a Python model) sent by any network client."""
        self._check_explicit()
        if files and not self.settings.allow_model_load_file_override:
            raise PermissionDenied(f"load failed for model '{name}': file overrides ('file:' "
                                   f"parameters) are not allowed; start the server with "
                                   f"{FILE_OVERRIDE_FLAG} to allow them")
        override = None
        if config_json is not None:
            try:
                override = config_from_json(config_json)
            except ConfigJsonError as exc:
                raise InvalidArgument(f"load failed for model '{name}': {exc}") from None
        try:
            await self.manager.load_model(name, override, files=files or None)
        except LoadError as exc:
            raise InvalidArgument(str(exc)) from None

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check_explicit()
        await self.manager.unload_model(name, unload_dependents)

    # ----- inference ---------------------------------------------------------------------
    def resolve(self, name: str, version: str = "") -> VersionRecord:
        """The version an inference request for (name, version) goes to."""
        return self.path.resolve(name, version)

    async def infer(self, request: InferRequest, record: Optional[VersionRecord] = None,
                    endpoint: str = HTTP_ENDPOINT) -> InferResponse:
        """The one in-process infer (server/inference.py); `record` when already resolved;
        `endpoint` names the caller when a decoupled model must be refused."""
        return await self.path.infer(request, record, endpoint)

    def infer_stream(self, request: InferRequest, record: Optional[VersionRecord] = None
                     ) -> AsyncIterator[StreamItem]:
        """Every answer to a client's request (any number for a decoupled model)."""
        return self.path.stream(request, record, admitted=False)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no inference is in flight; False if the timeout passed first."""
        return await self.path.wait_idle(timeout)

    # ----- gray release (server/traffic.py) ------------------------------------------------
    def traffic_policy(self, name: str) -> dict:
        """The GET /v2/models/M/traffic body; NOT_FOUND for an unknown model."""
        return self.path.traffic.status(name)

    def set_traffic_policy(self, name: str, spec: TrafficSpec) -> dict:
        return self.path.traffic.replace(name, spec)

    def delete_traffic_policy(self, name: str) -> dict:
        return self.path.traffic.delete(name)


def _type_name(value: int) -> str:
    from protocol.model_config_pb2 import DataType

    return DataType.Name(value)


def _model_counts_as_ready(model: ModelRecord) -> bool:
    """Strict readiness for one model: its serving versions are healthy, no version its policy
    wants failed to load (even while an older one keeps serving, as Triton counts it), and it
    serves unless it was unloaded, was never loaded, or is still on its first load."""
    if any(record.serving and not record.healthy() for record in model.versions.values()):
        return False
    if model.ready_versions() or model.reason == UNLOADED:
        # UNAVAILABLE versions are failed loads the policy wants, or retired ("unloaded") ones.
        return not any(record.state is ModelState.UNAVAILABLE and record.reason != UNLOADED
                       for record in model.versions.values())
    if not model.versions:
        return model.state is ModelState.UNKNOWN
    return all(record.state is ModelState.LOADING for record in model.versions.values())
