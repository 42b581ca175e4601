"""What the repository manager and the server core need from a model version's scheduler."""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from backends.base import Backend, BackendHost
from protocol.errors import ServerError
from protocol.types import InferRequest
from scheduler.stats import FailureReason, VersionStatistics
from scheduler.validation import RequestRules, validate_request

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig


@dataclass(frozen=True)
class VersionSpec:
    """Everything needed to serve one model version: its normalised config and its files."""

    name: str
    version: int
    config: ModelConfig
    model_dir: Path
    version_dir: Path
    backend_cls: type[Backend]
    host: BackendHost | None = None  # lent to backends that call back in (BLS)


class LoadError(Exception):
    """A load that did not (fully) succeed (an instance, a version, a model); `message` is the
    text the repository index and the load API show."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Scheduler(ABC):
    """Admits requests for one model version and answers each through its future.

    Lifecycle: `start()` loads every instance (raising on failure, after unloading whatever did
    load); `submit()` validates and admits requests; `drain()` stops admitting and waits for
    queued and running work; `stop()` unloads the instances on their own threads.

    Admission is the one door for every caller (frontends through the inference path,
    ensembles, warm-up): `submit()` checks the request against the rules read from the config
    once, when the version was built, and only then hands it to the subclass's `_admit()`.
    """

    def __init__(self, spec: VersionSpec, stats: VersionStatistics) -> None:
        self._spec = spec
        self._stats = stats
        self.rules = RequestRules(spec.config)

    @abstractmethod
    async def start(self) -> None: ...

    def submit(self, request: InferRequest) -> asyncio.Future:
        """Validate the request, queue it, and return the future that resolves to its
        InferResponse (or raises its ServerError). Raises InvalidArgument for a request the
        model cannot take and Unavailable at once when the queue is full or the scheduler no
        longer admits requests; either is counted as a failure. Never blocks."""
        try:
            validate_request(request, self.rules)
        except ServerError:
            self._stats.record_failure(
                FailureReason.OTHER, max(0, self._now_ns() - request.arrival_ns)
            )
            raise
        return self._admit(request)

    def validate(self, request: InferRequest) -> None:
        """`submit`'s checks alone (counted as a failure when refused): the response cache
        looks a request up between them and `admit`."""
        try:
            validate_request(request, self.rules)
        except ServerError:
            self._stats.record_failure(
                FailureReason.OTHER, max(0, self._now_ns() - request.arrival_ns)
            )
            raise

    def admit(self, request: InferRequest) -> asyncio.Future:
        """Queue a request `validate` passed (see `submit`)."""
        return self._admit(request)

    @abstractmethod
    def _admit(self, request: InferRequest) -> asyncio.Future:
        """Queue a validated request (see `submit`)."""

    def _now_ns(self) -> int:
        """The clock request arrival times are read against."""
        return time.monotonic_ns()

    @abstractmethod
    async def drain(self, timeout: float) -> None:
        """Stop admitting; let queued and running requests finish, at most `timeout` seconds;
        then fail whatever is left with Unavailable."""

    @abstractmethod
    async def stop(self) -> None:
        """Unload every instance on its own thread. Call after drain()."""

    def continues_sequence(self, request: InferRequest) -> bool:
        """Whether `request` continues a sequence that is live here (no START flag): such a
        request must reach this copy even while it drains (sequence batcher only)."""
        return False

    def live_sequences(self) -> int:
        """Sequences started here and not yet ended or released (sequence batcher only)."""
        return 0

    @abstractmethod
    def healthy(self) -> bool:
        """False when an instance became unusable (device lost, worker gone for good)."""

    @property
    def statistics(self) -> VersionStatistics:
        return self._stats

    @property
    def spec(self) -> VersionSpec:
        return self._spec
