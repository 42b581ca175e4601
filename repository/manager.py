"""Loads, swaps and unloads model versions.

A (re)load builds and starts the new version's scheduler in the background while whatever was
serving keeps serving, publishes it in one assignment, then drains the old copy (its queued and
running requests finish) and unloads it on its instance threads. A failed load never takes the
old copy down; its reason shows in the repository index.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

from backends.base import BackendError
from protocol.model_config_pb2 import ModelConfig
from repository import layout
from repository.config import ConfigError, normalize, read_config, registry_backend_class
from repository.registry import ModelRecord, ModelRegistry, ModelState, VersionRecord
from scheduler.factory import create_scheduler
from scheduler.interface import VersionSpec
from scheduler.stats import MetricsObserver, VersionStatistics

log = logging.getLogger(__name__)


class VersionHooks(Protocol):
    """Told when a version starts or stops serving (the metrics module binds its series)."""

    def version_loaded(self, name: str, version: int, load_seconds: float) -> Optional[MetricsObserver]: ...

    def version_unloaded(self, name: str, version: int) -> None: ...


class LoadError(Exception):
    pass


@dataclass
class ManagerSettings:
    repositories: list[Path]
    auto_complete: bool = True
    drain_timeout: float = 30.0
    config_name: Optional[str] = None


class ModelManager:
    def __init__(self, settings: ManagerSettings, registry: ModelRegistry,
                 hooks: Optional[VersionHooks] = None) -> None:
        self.settings = settings
        self.registry = registry
        self.hooks = hooks
        # One load or unload at a time per model; different models load concurrently.
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def model_names(self) -> list[str]:
        unique, duplicates = layout.scan_repositories(self.settings.repositories)
        return sorted(set(unique) | set(duplicates))

    async def load_all(self) -> dict[str, str]:
        """Load every model in the repositories concurrently; returns name -> failure reason."""
        names = self.model_names()
        results = await asyncio.gather(*(self._load_reporting(name) for name in names))
        return {name: reason for name, reason in zip(names, results) if reason}

    async def _load_reporting(self, name: str) -> str:
        try:
            await self.load_model(name)
        except LoadError as exc:
            return str(exc)
        return ""

    def _locate(self, name: str) -> Path:
        unique, duplicates = layout.scan_repositories(self.settings.repositories)
        if name in duplicates:
            raise LoadError(layout.DUPLICATE_REASON)
        if name not in unique:
            raise LoadError(f"failed to load '{name}', failed to poll from model repository")
        return unique[name].path

    def _prepare(self, name: str, model_dir: Path, override: Optional[ModelConfig]
                 ) -> tuple[ModelConfig, dict[int, Path], list[int]]:
        """Blocking part of a load (file reads, auto-complete opening the model): off the loop."""
        config = ModelConfig() if override is None else _copy(override)
        if override is None:
            config = read_config(model_dir, self.settings.config_name)
        available = layout.version_directories(model_dir)
        selected_dirs = [available[v] for v in sorted(available)]
        normalize(config, name, model_dir, selected_dirs, auto_complete=self.settings.auto_complete)
        versions = layout.select_versions(config, available)
        if not versions:
            raise ConfigError(f"at least one version must be available under the version policy "
                              f"of model '{name}'")
        return config, available, versions

    async def load_model(self, name: str, override: Optional[ModelConfig] = None) -> None:
        """Load (or reload) `name`. Raises LoadError with the reason when nothing new serves."""
        async with self._lock(name):
            record = self.registry.record(name)
            try:
                model_dir = self._locate(name)
                record.path = model_dir
                config, available, versions = await asyncio.to_thread(
                    self._prepare, name, model_dir, override)
            except (LoadError, ConfigError, BackendError, OSError) as exc:
                reason = str(exc)
                record.reason = reason
                if not record.ready_versions():
                    record.state = ModelState.UNAVAILABLE
                log.error("failed to load model '%s': %s", name, reason)
                raise LoadError(reason) from None
            record.config = config
            record.state = ModelState.UNKNOWN
            record.reason = ""
            outcomes = await asyncio.gather(*(
                self._load_version(record, config, model_dir, version, available[version])
                for version in versions))
            failures = [reason for reason in outcomes if reason]
            retired = [v for v in list(record.versions) if v not in versions
                       and record.versions[v].state is not ModelState.UNAVAILABLE]
            await asyncio.gather(*(self._retire(record, v) for v in retired))
            if failures and not record.ready_versions():
                raise LoadError(failures[0])

    async def _load_version(self, record: ModelRecord, config: ModelConfig, model_dir: Path,
                            version: int, version_dir: Path) -> str:
        name = record.name
        backend_cls = registry_backend_class(config.backend, name)
        spec = VersionSpec(name, version, _copy(config), model_dir, version_dir, backend_cls)
        stats = VersionStatistics(name, str(version))
        scheduler = create_scheduler(spec, stats)
        old = record.versions.get(version)
        if old is None or not old.serving:
            record.versions[version] = VersionRecord(version, ModelState.LOADING)
        started = time.monotonic()
        try:
            await scheduler.start()
        except Exception as exc:  # noqa: BLE001 - any failure becomes this version's reason
            reason = getattr(exc, "message", None) or str(exc)
            log.error("failed to load '%s' version %d: %s", name, version, reason)
            if old is not None and old.serving:
                old.reason = f"reload failed, still serving the previous copy: {reason}"
            else:
                record.versions[version] = VersionRecord(version, ModelState.UNAVAILABLE, reason)
            return reason
        seconds = time.monotonic() - started
        if self.hooks is not None:
            if old is not None and old.serving:
                self.hooks.version_unloaded(name, version)
            stats.observer = self.hooks.version_loaded(name, version, seconds)
        record.versions[version] = VersionRecord(version, ModelState.READY, "", spec, scheduler, seconds)
        log.info("loaded '%s' version %d in %.2fs", name, version, seconds)
        if old is not None and old.scheduler is not None:
            await self._drain_and_stop(name, version, old)
        return ""

    async def _drain_and_stop(self, name: str, version: int, record: VersionRecord,
                              drain_timeout: Optional[float] = None) -> None:
        scheduler = record.scheduler
        assert scheduler is not None
        await scheduler.drain(self.settings.drain_timeout if drain_timeout is None else drain_timeout)
        await scheduler.stop()
        log.info("retired the previous copy of '%s' version %d", name, version)

    async def _retire(self, record: ModelRecord, version: int,
                      drain_timeout: Optional[float] = None) -> None:
        """Stop serving one version: new requests are refused at once, admitted ones finish."""
        current = record.versions[version]
        current.state = ModelState.UNLOADING
        if current.scheduler is not None:
            if self.hooks is not None:
                self.hooks.version_unloaded(record.name, version)
            await self._drain_and_stop(record.name, version, current, drain_timeout)
        record.versions[version] = VersionRecord(version, ModelState.UNAVAILABLE, "unloaded")

    async def unload_model(self, name: str) -> None:
        async with self._lock(name):
            record = self.registry.get(name)
            await asyncio.gather(*(self._retire(record, v) for v in list(record.versions)
                                   if record.versions[v].state is not ModelState.UNAVAILABLE
                                   or record.versions[v].reason != "unloaded"))
            record.state = ModelState.UNAVAILABLE
            record.reason = "unloaded"

    async def shutdown(self, drain_timeout: Optional[float] = None) -> None:
        """Drain and unload everything (server exit); leftovers past the timeout fail with
        UNAVAILABLE so every admitted request is answered."""
        retiring = []
        for record in list(self.registry.models.values()):
            retiring += [self._retire(record, v, drain_timeout)
                         for v, r in list(record.versions.items()) if r.scheduler is not None]
        await asyncio.gather(*retiring)


def _copy(config: ModelConfig) -> ModelConfig:
    clone = ModelConfig()
    clone.CopyFrom(config)
    return clone
