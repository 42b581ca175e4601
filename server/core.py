"""The only API the frontends call: health, metadata, config, statistics, repository, infer.

Everything here speaks the internal types and raises ServerError subclasses; each frontend maps
them to its wire form through protocol/errors.py.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import Optional

from protocol.classification import classify, read_labels
from protocol.errors import InternalError, InvalidArgument, ServerError, Unavailable
from protocol.model_config_pb2 import ModelConfig
from protocol.types import InferRequest, InferResponse, RequestedOutput, Tensor
from protocol import datatypes
from repository.config import ConfigError, config_from_json
from repository.manager import UNLOADED, LoadError, ModelManager
from repository.registry import (ModelRecord, ModelRegistry, ModelState, VersionRecord,
                                 parse_version)
from scheduler.factory import create_scheduler
from scheduler.stats import FailureReason, VersionStatistics
from scheduler.validation import RequestRules, validate_request
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
]
POLLING_REFUSAL = "explicit model load / unload is not allowed if polling is enabled"


@dataclass(frozen=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: list[int]


@dataclass(frozen=True)
class ModelMetadata:
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


@dataclass(frozen=True)
class IndexEntry:
    name: str
    version: str = ""
    state: str = ""
    reason: str = ""


class InferenceCore:
    def __init__(self, settings: ServerSettings, registry: ModelRegistry,
                 manager: ModelManager) -> None:
        self.settings = settings
        self.registry = registry
        self.manager = manager
        self.started = False
        self.exiting = False
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # Ensemble steps go through infer_admitted: their model's own scheduler and batcher.
        manager.create_scheduler = functools.partial(create_scheduler, infer=self.infer_admitted)

    # ----- health --------------------------------------------------------------------------
    def live(self) -> bool:
        return self.started and not self.exiting

    def ready(self) -> bool:
        """Kubernetes readiness: live and at least one model serving. With strict readiness
        also every model the server is meant to serve has a healthy ready version; a model on
        its first load does not count against it (Triton #7014), an unloaded one is not meant
        to serve."""
        if not self.live():
            return False
        if not self.registry.serving_versions():
            return False
        if not self.settings.strict_readiness:
            return True
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
    def statistics(self, name: str = "", version: str = "") -> list[VersionStatistics]:
        if not name:
            return [r.scheduler.statistics for _, r in self.registry.serving_versions()]  # type: ignore[union-attr]
        try:
            model = self.registry.get(name)
            number = parse_version(version, name)
        except ServerError:
            raise InvalidArgument(f"requested model '{name}' is not available") from None
        records = [r for v, r in sorted(model.versions.items())
                   if r.serving and (number == -1 or v == number)]
        if not records:
            raise InvalidArgument(f"requested model '{name}' is not available")
        return [r.scheduler.statistics for r in records]  # type: ignore[union-attr]

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
        need it) make up the whole model directory, written to a private temporary one."""
        self._check_explicit()
        override = None
        if config_json is not None:
            try:
                override = config_from_json(config_json)
            except ConfigError as exc:
                raise InvalidArgument(f"failed to load '{name}': {exc}") from None
        try:
            await self.manager.load_model(name, override, files=files or None)
        except LoadError as exc:
            raise InvalidArgument(str(exc)) from None

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check_explicit()
        await self.manager.unload_model(name, unload_dependents)

    # ----- inference ---------------------------------------------------------------------
    async def infer(self, request: InferRequest) -> InferResponse:
        if self.exiting:
            raise Unavailable("Server exiting")
        return await self.infer_admitted(request)

    async def infer_admitted(self, request: InferRequest) -> InferResponse:
        """infer() without the exiting check: ensemble steps of a request already admitted."""
        record = self.registry.resolve(request.model_name, request.model_version)
        scheduler = record.scheduler
        assert scheduler is not None and record.spec is not None
        rules = record.request_rules
        if rules is None:
            rules = record.request_rules = RequestRules(record.spec.config)
        try:
            validate_request(request, rules)
        except ServerError:
            scheduler.statistics.record_failure(FailureReason.OTHER,
                                                time.monotonic_ns() - request.arrival_ns)
            raise
        self.inflight += 1
        self._idle.clear()
        try:
            response = await scheduler.submit(request)
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()
        return self._select_outputs(response, request.outputs, record)

    def _select_outputs(self, response: InferResponse, requested: Optional[list[RequestedOutput]],
                        record: VersionRecord) -> InferResponse:
        if requested is None:
            return response
        by_name = {t.name: t for t in response.outputs}
        config = record.spec.config  # type: ignore[union-attr]
        outputs: list[Tensor] = []
        for wanted in requested:
            tensor = by_name.get(wanted.name)
            if tensor is None:
                raise InternalError(f"model '{response.model_name}' did not produce the requested "
                                    f"output '{wanted.name}'")
            if wanted.classification > 0:
                labels = self._labels_for(record, wanted.name)
                tensor = classify(tensor, wanted.classification, config.max_batch_size > 0, labels)
            outputs.append(tensor)
        response.outputs = outputs
        return response

    @staticmethod
    def _labels_for(record: VersionRecord, output: str) -> list[str]:
        if output in record.labels:
            return record.labels[output]
        spec = record.spec
        assert spec is not None
        labels: list[str] = []
        for tensor in spec.config.output:
            if tensor.name == output and tensor.label_filename:
                try:
                    labels = read_labels(spec.model_dir / tensor.label_filename)
                except OSError:
                    log.warning("model '%s': cannot read label file '%s'", spec.name,
                                tensor.label_filename)
        record.labels[output] = labels
        return labels

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no inference is in flight; False if the timeout passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


def _type_name(value: int) -> str:
    from protocol.model_config_pb2 import DataType

    return DataType.Name(value)


def _model_counts_as_ready(model: ModelRecord) -> bool:
    """Strict readiness for one model: its serving versions are healthy, and it serves unless
    it was unloaded, was never loaded, or is still on its first load."""
    if any(record.serving and not record.healthy() for record in model.versions.values()):
        return False
    if model.ready_versions() or model.reason == UNLOADED:
        return True
    if not model.versions:
        return model.state is ModelState.UNKNOWN
    return all(record.state is ModelState.LOADING for record in model.versions.values())
