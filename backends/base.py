"""The small interface every runtime implements.

One Backend object is one loaded copy of one model version on one instance. The scheduler's
instance pool calls `load`, `execute` and `unload` on that instance's own thread (never on the
event loop), one call at a time, so a backend needs no locking of its own.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from protocol.model_config_pb2 import ModelConfig


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


class Backend(ABC):
    """One loaded model copy. Subclasses set the class attributes and implement the methods."""

    # Value of config `backend` that selects this runtime, and the `platform` values that do too.
    backend_name: ClassVar[str]
    platforms: ClassVar[tuple[str, ...]] = ()
    default_model_filename: ClassVar[str]
    # True when execute_requests should get the requests one by one (Python models) instead of
    # one concatenated batch.
    takes_request_lists: ClassVar[bool] = False

    def __init__(self, config: "ModelConfig", model_dir: Path, version_dir: Path,
                 instance: InstanceSpec) -> None:
        self.config = config
        self.model_dir = model_dir
        self.version_dir = version_dir
        self.instance = instance

    @classmethod
    def auto_complete(cls, config: "ModelConfig", model_dir: Path, version_dir: Path) -> None:
        """Fill in what the config leaves out (inputs, outputs, max_batch_size) from the model
        file itself. Called before validation unless auto-complete is disabled."""

    def model_path(self) -> Path:
        filename = self.config.default_model_filename or self.default_model_filename
        return self.version_dir / filename

    @abstractmethod
    def load(self) -> None:
        """Load the model onto this instance's device. Raise BackendError with a clear reason."""

    @abstractmethod
    def execute(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch. Inputs and outputs carry the batch dimension when the model batches."""

    def execute_requests(self, requests: Sequence[Mapping[str, np.ndarray]]
                         ) -> list[dict[str, np.ndarray] | BaseException]:
        """Run several requests at once; only called when `takes_request_lists` is True.
        An entry may be an exception, which fails that request alone."""
        raise BackendError(f"backend '{self.backend_name}' does not take request lists")

    def unload(self) -> None:
        """Release everything `load` acquired."""

    def healthy(self) -> bool:
        """False once the instance can no longer run (device lost, worker gone for good)."""
        return True

    @classmethod
    def end_child_processes(cls) -> int:
        """Kill the processes this backend started that still run, and start no more: the
        server's exit deadline has passed. Returns how many were killed."""
        return 0
