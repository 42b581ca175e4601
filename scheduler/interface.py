"""What the repository manager and the server core need from a model version's scheduler."""
from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from backends.base import Backend
from protocol.types import InferRequest
from scheduler.stats import VersionStatistics

if TYPE_CHECKING:  # pragma: no cover
    from protocol.model_config_pb2 import ModelConfig


@dataclass(frozen=True)
class VersionSpec:
    """Everything needed to serve one model version: its normalised config and its files."""

    name: str
    version: int
    config: "ModelConfig"
    model_dir: Path
    version_dir: Path
    backend_cls: type[Backend]


class Scheduler(ABC):
    """Admits requests for one model version and answers each through its future.

    Lifecycle: `start()` loads every instance (raising on failure, after unloading whatever did
    load); `submit()` admits requests; `drain()` stops admitting and waits for queued and running
    work; `stop()` unloads the instances on their own threads.
    """

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    def submit(self, request: InferRequest) -> "asyncio.Future":
        """Queue a validated request and return the future that resolves to its InferResponse
        (or raises its ServerError). Raises Unavailable at once when the queue is full or the
        scheduler no longer admits requests. Never blocks."""

    @abstractmethod
    async def drain(self, timeout: float) -> None:
        """Stop admitting; let queued and running requests finish, at most `timeout` seconds;
        then fail whatever is left with Unavailable."""

    @abstractmethod
    async def stop(self) -> None:
        """Unload every instance on its own thread. Call after drain()."""

    @abstractmethod
    def healthy(self) -> bool:
        """False when an instance became unusable (device lost, worker gone for good)."""

    @property
    @abstractmethod
    def statistics(self) -> VersionStatistics: ...
