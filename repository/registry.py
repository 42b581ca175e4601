"""Name -> versions of every model the server knows, and what state each is in.

Publishing a version is a plain assignment on the event loop, so a request resolves either the
old or the new version, never a half-built one; the scheduler it was submitted to answers it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protocol.errors import InvalidArgument, NotFound, Unavailable
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.text import shown
from protocol.types import InferRequest
from scheduler.interface import Scheduler, VersionSpec

if TYPE_CHECKING:  # reload_plan imports nothing from here; only the annotation needs it
    from repository.reload_plan import LoadedFiles


class ModelState(str, Enum):
    UNKNOWN = "UNKNOWN"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass
class VersionRecord:
    version: int
    state: ModelState
    reason: str = ""
    spec: VersionSpec | None = None
    scheduler: Scheduler | None = None
    load_seconds: float = 0.0
    # Classification labels per output, read when this copy loaded (a reload re-reads them).
    labels: dict[str, list[str]] = field(default_factory=dict)
    # This copy's response cache (server/core/response_cache.py VersionCache), None when its
    # config does not enable `response_cache` or the server has no cache: the infer path
    # checks this one attribute.
    cache: Any = None

    @property
    def serving(self) -> bool:
        return self.state is ModelState.READY and self.scheduler is not None

    def healthy(self) -> bool:
        return self.serving and self.scheduler.healthy()  # type: ignore[union-attr]  # serving: has one


@dataclass
class ModelRecord:
    name: str
    path: Path | None = None
    # The last config that normalised, shown by /config even when no version is ready.
    config: ModelConfig | None = None
    versions: dict[int, VersionRecord] = field(default_factory=dict)
    # Set when the model failed before any version could be considered (bad config, duplicate).
    state: ModelState = ModelState.UNKNOWN
    reason: str = ""
    # The files as the last complete load request saw them (repository/reload_plan.py); None
    # after anything else changed what serves.
    loaded_files: LoadedFiles | None = None

    def ready_versions(self) -> list[int]:
        return sorted(v for v, record in self.versions.items() if record.serving)


def parse_version(version: str, model: str) -> int:
    """'' or '-1' means the latest ready version (-1); digits give that version."""
    if version in ("", "-1"):
        return -1
    if not version.isdigit():
        raise InvalidArgument(
            f"failed to get model version from specified version string "
            f"'{version}' (for model '{model}')"
        )
    return int(version)


class ModelRegistry:
    def __init__(self) -> None:
        self.models: dict[str, ModelRecord] = {}
        # Copies of sequence models being retired that still have live sequences: requests
        # continuing those sequences go there, not to the version that replaced them.
        self.sequence_drains: dict[str, list[VersionRecord]] = {}

    def route(self, request: InferRequest) -> VersionRecord:
        """The version an inference request goes to: the retiring copy its sequence started
        on, if any (a dict lookup while no sequence model retires), else `resolve`'s."""
        drains = self.sequence_drains
        if drains and request.parameters:
            for record in drains.get(request.model_name, ()):
                if (
                    request.model_version in ("", str(record.version))
                    and record.scheduler is not None
                    and record.scheduler.continues_sequence(request)
                ):
                    return record
        return self.resolve(request.model_name, request.model_version)

    def sequence_home(self, request: InferRequest) -> VersionRecord | None:
        """The copy on which the sequence `request` continues is live (a retiring copy or any
        serving version), or None: for a request without START, where a traffic split or
        shutdown must not send it elsewhere."""
        parameters = request.parameters
        if not parameters or "sequence_id" not in parameters or parameters.get("sequence_start"):
            return None
        candidates = list(self.sequence_drains.get(request.model_name, ()))
        model = self.models.get(request.model_name)
        if model is not None:
            candidates += [record for record in model.versions.values() if record.serving]
        for record in candidates:
            if (
                request.model_version in ("", "-1", str(record.version))
                and record.scheduler is not None
                and record.scheduler.continues_sequence(request)
            ):
                return record
        return None

    def pin_sequences(self, name: str, record: VersionRecord) -> None:
        self.sequence_drains.setdefault(name, []).append(record)

    def unpin_sequences(self, name: str, record: VersionRecord) -> None:
        records = [r for r in self.sequence_drains.get(name, []) if r is not record]
        if records:
            self.sequence_drains[name] = records
        else:
            self.sequence_drains.pop(name, None)

    def get(self, name: str) -> ModelRecord:
        record = self.models.get(name)
        if record is None:
            raise NotFound(f"Request for unknown model: '{shown(name)}' is not found")
        return record

    def record(self, name: str) -> ModelRecord:
        """The record for `name`, created (UNKNOWN) if the server has not seen it yet."""
        if name not in self.models:
            self.models[name] = ModelRecord(name)
        return self.models[name]

    def resolve(self, name: str, version: str = "") -> VersionRecord:
        """The version an inference request goes to: a READY one, or NOT_FOUND/UNAVAILABLE."""
        model = self.get(name)
        number = parse_version(version, name)
        if number == -1:
            latest: VersionRecord | None = None
            for candidate in model.versions.values():  # no sort: this runs per request
                if candidate.serving and (latest is None or candidate.version > latest.version):
                    latest = candidate
            if latest is None:
                if not model.versions and model.state is ModelState.UNKNOWN:
                    raise NotFound(f"Request for unknown model: '{shown(name)}' is not found")
                raise Unavailable(
                    f"Request for unknown model: '{shown(name)}' has no available versions"
                )
            return latest
        record = model.versions.get(number)
        if record is None:
            raise NotFound(
                f"Request for unknown model: '{shown(name)}' version {number} is not found"
            )
        if not record.serving:
            raise Unavailable(
                f"Request for unknown model: '{name}' version {number} is not at ready state"
            )
        return record

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            record = self.resolve(name, version)
        except Exception:
            return False
        return record.healthy()

    def serving_versions(self) -> list[tuple[str, VersionRecord]]:
        return [
            (name, record)
            for name, model in sorted(self.models.items())
            for _, record in sorted(model.versions.items())
            if record.serving
        ]
