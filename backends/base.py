"""The small interface every runtime implements.

One Backend object is one loaded copy of one model version on one instance. The scheduler's
instance pool calls `load`, `execute` and `unload` on that instance's own thread (never on the
event loop), one call at a time, so a backend needs no locking of its own. The one exception is
`begin_requests`, which a backend may offer to start a batch from the loop itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import asyncio

    from protocol.proto.model_config_pb2 import ModelConfig
    from protocol.stream import StreamItem
    from protocol.types import InferRequest


# What `begin_requests` answers with: one result per request (outputs or the exception that
# fails it), or a function the instance thread runs to get them.
RequestResults = list[dict[str, np.ndarray] | BaseException]
RequestsOutcome = RequestResults | Callable[[], RequestResults]


class BackendHost(Protocol):
    """What the server lends a backend whose models call back into it (BLS): the loop its
    infer path runs on, and that path (server/core/inference_path.py)."""

    loop: asyncio.AbstractEventLoop | None

    def is_decoupled(self, name: str, version: str) -> bool:
        """Whether the version a request for (name, version) goes to is decoupled."""

    def stream(self, request: InferRequest) -> AsyncIterator[StreamItem]:
        """Every answer to `request` (one, final, for a model that is not decoupled)."""

    def custom_metric(self, update: dict) -> None:
        """A new value of a model's custom metric series (pb_utils.Metric)."""

    def declare_metric(self, update: dict) -> str | None:
        """A model's custom metric family or series (pb_utils.MetricFamily, its `Metric`),
        from any thread: None when accepted, else the reason it is refused."""


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """Where one instance runs: its name (`<group>_<index>`), kind and device."""

    name: str
    kind: str  # "KIND_CPU", "KIND_GPU" (an NPU for the ascend backend) or "KIND_MODEL"
    device_id: int
    index: int


class BackendError(Exception):
    """A runtime failure. `fatal` marks the instance unhealthy (device lost, worker died)."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.fatal = fatal


@dataclass(frozen=True)
class ParameterBound:
    """The range a numeric config `parameters` entry of a backend must lie in (checked when
    the config loads, repository/bounds.py): `setting` names the server setting that replaces
    `high` (a bound an operator may need to raise), and `flag` the flag that sets it."""

    low: float
    high: float
    integer: bool = False
    setting: str = ""
    flag: str = ""


class Backend(ABC):
    """One loaded model copy. Subclasses set the class attributes and implement the methods."""

    # Value of config `backend` that selects this runtime, and the `platform` values that do too.
    backend_name: ClassVar[str]
    platforms: ClassVar[tuple[str, ...]] = ()
    default_model_filename: ClassVar[str]
    # True when execute_requests should get the requests one by one (Python models) instead of
    # one concatenated batch.
    takes_request_lists: ClassVar[bool] = False
    # True when the backend joins a batch's requests itself (`gather`), into memory of its own
    # (the NPU executor's shared arena), instead of the scheduler's concatenation.
    gathers_batches: ClassVar[bool] = False
    # True (per loaded model) when the model answers through each request's stream, any number
    # of times (`model_transaction_policy { decoupled: true }`): execute_decoupled is called.
    decoupled: bool = False
    # True when execute_requests also wants the InferRequests (ids, parameters, outputs asked).
    wants_request_details: ClassVar[bool] = False
    # True when the backend's constructor takes `host` (a BackendHost, for BLS).
    uses_host: ClassVar[bool] = False
    # Numeric config `parameters` the backend allocates, waits or starts threads by: checked
    # against these ranges before anything loads.
    parameter_bounds: ClassVar[Mapping[str, ParameterBound]] = {}

    def __init__(
        self, config: ModelConfig, model_dir: Path, version_dir: Path, instance: InstanceSpec
    ) -> None:
        self.config = config
        self.model_dir = model_dir
        self.version_dir = version_dir
        self.instance = instance

    @classmethod  # noqa: B027  (an optional hook: most backends have nothing to fill in)
    def auto_complete(cls, config: ModelConfig, model_dir: Path, version_dir: Path) -> None:
        """Fill in what the config leaves out (inputs, outputs, max_batch_size) from the model
        file itself. Called before validation unless auto-complete is disabled."""

    @classmethod  # noqa: B027  (an optional hook: most backends read instance_group as it is)
    def place_instances(cls, config: ModelConfig) -> None:
        """Turn backend-specific placement settings (the Ascend backend's `device_ids`
        parameter) into `instance_group`, before auto-complete: one place says where instances
        run. Raise BackendError on a setting that cannot be read."""

    def model_path(self) -> Path:
        filename = self.config.default_model_filename or self.default_model_filename
        return self.version_dir / filename

    @abstractmethod
    def load(self) -> None:
        """Load the model onto this instance's device. Raise BackendError with a clear reason."""

    @abstractmethod
    def execute(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch. Inputs and outputs carry the batch dimension when the model batches."""

    def gather(self, requests: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Join the requests' inputs along dim 0 for `execute`; only called when
        `gathers_batches` is True (one copy, where the backend's device reads them)."""
        raise BackendError(f"backend '{self.backend_name}' does not gather batches")

    def execute_requests(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        details: Sequence[InferRequest] | None = None,
    ) -> list[dict[str, np.ndarray] | BaseException]:
        """Run several requests at once; only called when `takes_request_lists` is True.
        An entry may be an exception, which fails that request alone. `details` (the requests
        themselves) come only to a backend that `wants_request_details`."""
        raise BackendError(f"backend '{self.backend_name}' does not take request lists")

    def begin_requests(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        details: Sequence[InferRequest],
        done: Callable[[RequestsOutcome], None],
    ) -> bool:
        """Start `execute_requests` from the event loop without the instance thread, for a
        backend whose work happens elsewhere (a Python model's worker process): it sends the
        work, the loop watches for the answer and calls `done` there, so a batch costs no
        thread hop. `done` gets the results, or a function the instance thread must run for
        them (the rest may wait, e.g. on a worker's restart). False (the default): not now;
        the caller runs `execute_requests` on the instance thread as usual."""
        return False

    def execute_decoupled(self, requests: Sequence[InferRequest]) -> list[None | BaseException]:
        """Start several requests of a decoupled model; their answers go to each request's
        `stream`. An entry is None (taken) or the exception that fails that request."""
        raise BackendError(f"backend '{self.backend_name}' does not serve decoupled models")

    def unload(self) -> None:  # noqa: B027  (an optional hook: not every backend holds anything)
        """Release everything `load` acquired."""

    def healthy(self) -> bool:
        """False once the instance can no longer run (device lost, worker gone for good)."""
        return True

    @classmethod
    def end_child_processes(cls) -> int:
        """Kill the processes this backend started that still run, and start no more: the
        server's exit deadline has passed. Returns how many were killed."""
        return 0
