"""Loads, swaps and unloads model versions.

A (re)load builds, starts and warms the new version's scheduler in the background while whatever
was serving keeps serving, publishes it in one assignment, then drains the old copy (its queued
and running requests finish, bounded by the drain timeout) and unloads it on its instance
threads. Versions the new load no longer selects retire only when every selected version
loaded, so a failed load never takes anything down; its reason shows in the repository index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from protocol.proto.model_config_pb2 import ModelConfig
from protocol.text import shown
from repository import layout
from repository.bounds import DEFAULT_BOUNDS, ModelBounds
from repository.config import ConfigError, normalize, read_config, registry_backend_class
from repository.dependents import ensembles_using, ready_to_reload
from repository.overrides import (
    OverrideError,
    checked_path,
    create_override_directory,
    remove_override_directory,
)
from repository.registry import ModelRecord, ModelRegistry, ModelState, VersionRecord
from repository.reload_plan import same_but_versions, snapshot, unchanged_versions
from repository.version_builder import build_version
from scheduler.ensemble import Infer
from scheduler.factory import create_scheduler
from scheduler.interface import LoadError, Scheduler, VersionSpec
from scheduler.stats import MetricsObserver, VersionStatistics

log = logging.getLogger(__name__)

UNLOADED = "unloaded"
RELOAD_FAILED = "reload failed, still serving the previous copy: "


class VersionHooks(Protocol):
    """Told when a version starts or stops serving (the metrics module binds its series)."""

    def version_loaded(
        self, name: str, version: int, load_seconds: float
    ) -> MetricsObserver | None: ...

    def version_unloaded(self, name: str, version: int) -> None: ...


@dataclass
class ManagerSettings:
    repositories: list[Path]
    auto_complete: bool = True
    drain_timeout: float = 30.0
    config_name: str | None = None
    # Explicit mode: loading an ensemble also loads the models its steps use (Triton does).
    load_dependencies: bool = False
    # Tries after a version's first failed load (Triton's --model-load-retry-count).
    load_retries: int = 0
    # What a config's numbers may ask for (repository/bounds.py), checked before any work.
    bounds: ModelBounds = DEFAULT_BOUNDS


def not_in_repository(name: str) -> str:
    return f"failed to load '{shown(name)}', failed to poll from model repository"


def load_failed(name: str, reason: str) -> str:
    """Triton's wording for a model that was found but did not load (clients match on it)."""
    return f"load failed for model '{shown(name)}': {reason}"


def plausible_name(name: str) -> bool:
    """A name that could be a model directory. Others get the unknown-model answer, so a
    client learns nothing about the filesystem from the reply."""
    return (
        bool(name)
        and name not in (".", "..")
        and not name.startswith(".")
        and not any(c in name for c in "/\\\x00")
        and len(name.encode()) <= 255
    )


SchedulerFactory = Callable[..., Scheduler]


class CopyCache(Protocol):
    """What the manager needs of a loaded copy's response cache: to close it when the copy
    stops serving (its entries go; server/core/response_cache.py VersionCache)."""

    def close(self) -> None: ...


# (model name, whether its config enables response_cache) -> that copy's cache, or None.
CacheBinder = Callable[[str, bool], CopyCache | None]


class ModelManager:
    """`infer` is the server's in-process infer (server/core/inference_path.py), which the ensembles
    this manager builds send their steps through; `scheduler_factory(spec, stats, infer=...)` builds
    each version's scheduler (tests hand in fakes). `host` is what backends whose models call other
    models (BLS) get (backends/base.py BackendHost)."""

    def __init__(
        self,
        settings: ManagerSettings,
        registry: ModelRegistry,
        hooks: VersionHooks | None = None,
        *,
        infer: Infer | None = None,
        scheduler_factory: SchedulerFactory = create_scheduler,
        host: Any | None = None,
        response_cache: CacheBinder | None = None,
        refresh: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.hooks = hooks
        self._infer = infer
        self._host = host
        self._scheduler_factory = scheduler_factory
        self._response_cache = response_cache  # None: the server has no --cache-config
        # Explicit mode with mirrored repositories: bring a model's folder up to date before
        # a load looks for it (blocking; repository/s3_mirror.py).
        self._refresh = refresh
        # One load or unload at a time per model; different models load concurrently. A name's
        # lock lives only while someone holds or waits for it, so that load requests for any
        # number of unknown names leave nothing behind.
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        # Private directories built from load requests' file overrides, per model.
        self._private: dict[str, set[Path]] = {}
        # Ensemble -> the members that loading it loaded (unload_dependents unloads them).
        self._dependents: dict[str, set[str]] = {}
        # Ensembles unloaded because a model they use was (reloaded when it is loaded again).
        self._taken_along: set[str] = set()
        # Ensembles being loaded -> the models they run (an unload of one of those waits).
        self._building: dict[str, set[str]] = {}
        self._retiring: dict[int, asyncio.Task] = {}
        self._closing = False

    @contextlib.asynccontextmanager
    async def _lock(self, name: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(name) or (asyncio.Lock(), 0)
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)

    def lock_count(self) -> int:
        """Names whose load lock is held or awaited now (0 when nothing is loading)."""
        return len(self._locks)

    def model_names(self) -> list[str]:
        unique, duplicates = layout.scan_repositories(self.settings.repositories, quiet=True)
        return sorted(set(unique) | set(duplicates))

    # ----- startup ------------------------------------------------------------------------
    async def load_all(self) -> dict[str, str]:
        """Load every model in the repositories concurrently; returns name -> failure reason."""
        return await self.load_models(self.model_names())

    async def load_models(self, names: Collection[str]) -> dict[str, str]:
        """Load the named models concurrently; returns name -> failure reason."""
        ordered = sorted(set(names))
        results = await asyncio.gather(*(self._load_reporting(name) for name in ordered))
        return {name: reason for name, reason in zip(ordered, results, strict=False) if reason}

    async def _load_reporting(self, name: str) -> str:
        try:
            await self.load_model(name)
        except LoadError as exc:
            return str(exc)
        return ""

    # ----- load ---------------------------------------------------------------------------
    def _locate(self, name: str) -> Path:
        unique, duplicates = layout.scan_repositories(self.settings.repositories)
        if name in duplicates:
            raise ConfigError(layout.DUPLICATE_REASON)
        if name not in unique:
            # Triton's log line for it (qa's L0_lifecycle looks for it).
            log.error(
                "failed to poll model '%s': model not found in any model repository.", shown(name)
            )
            raise LoadError(not_in_repository(name))
        return unique[name].path

    def _prepare(
        self, name: str, model_dir: Path, override: ModelConfig | None, only: Collection[int] | None
    ) -> tuple[ModelConfig, dict[int, Path], list[int]]:
        """Blocking part of a load (file reads, auto-complete opening the model): off the loop."""
        config = (
            read_config(model_dir, self.settings.config_name)
            if override is None
            else _copy(override)
        )
        available = layout.version_directories(model_dir)
        if only is not None:
            available = {v: path for v, path in available.items() if v in only}
        config.name = config.name or name  # normalize refuses a name other than the folder's
        versions = layout.select_versions(config, available)
        # Auto-complete reads the newest version the policy serves (as Triton's backends read
        # the version they load): a newer folder the policy skips may hold no model at all.
        selected_dirs = [available[v] for v in (versions or sorted(available))]
        normalize(
            config,
            name,
            model_dir,
            selected_dirs,
            auto_complete=self.settings.auto_complete,
            bounds=self.settings.bounds,
        )
        if not versions:
            raise ConfigError(
                f"at least one version must be available under the version policy of model '{name}'"
            )
        return config, available, versions

    async def load_model(
        self,
        name: str,
        override: ModelConfig | None = None,
        *,
        versions: Collection[int] | None = None,
        keep: Collection[int] = (),
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load (or reload) `name` with a hot swap. Raises LoadError when anything failed.

        `versions` limits the version directories considered (the poller passes the complete
        ones); versions in `keep` that serve with an identical config are left as they are.
        `files` builds a private model directory from override contents (needs `override`)."""
        async with self._lock(name):
            await self._load_locked(name, override, versions, keep, files, ())
        await self._reload_ensembles()

    async def _reload_ensembles(self) -> None:
        """Load again the ensembles an unload took along, once all their members serve."""
        for ensemble in sorted(self._taken_along):
            if ready_to_reload(self.registry, ensemble):
                self._taken_along.discard(ensemble)
                try:
                    await self.load_model(ensemble)
                except LoadError as exc:
                    log.error("reloading ensemble '%s': %s", ensemble, exc)

    async def _load_locked(
        self,
        name: str,
        override: ModelConfig | None,
        only: Collection[int] | None,
        keep: Collection[int],
        files: Mapping[str, bytes] | None,
        chain: tuple[str, ...],
    ) -> None:
        try:
            await self._load_held(name, override, only, keep, files, chain)
        finally:
            self._building.pop(name, None)

    async def _load_held(
        self,
        name: str,
        override: ModelConfig | None,
        only: Collection[int] | None,
        keep: Collection[int],
        files: Mapping[str, bytes] | None,
        chain: tuple[str, ...],
    ) -> None:
        if self._closing:
            raise LoadError(load_failed(name, "the server is shutting down"))
        try:
            model_dir = await asyncio.to_thread(self._source, name, override, files)
        except ConfigError as exc:  # found in two repositories
            self._fail_model(self.registry.record(name), str(exc))
            raise LoadError(load_failed(name, str(exc))) from None
        record = self.registry.record(name)
        # A load request (not the poller's, which says what changed itself) reloads only what
        # changed on disk since the last load, as Triton (repository/reload_plan.py).
        now = (
            None
            if model_dir is None or only is not None or keep
            else await asyncio.to_thread(snapshot, model_dir)
        )
        if now is not None:
            if override is None and record.loaded_files == now and record.ready_versions():
                log.info("successfully loaded '%s'", shown(name))  # nothing changed: as it serves
                return
            keep = unchanged_versions(record.loaded_files, now)
        record.loaded_files = None
        private: Path | None = None
        try:
            if model_dir is None:
                # (a name of its own: as `model_dir` the call's type would be inferred Optional)
                created = await asyncio.to_thread(create_override_directory, files or {})
                private = model_dir = created
            config, available, versions = await asyncio.to_thread(
                self._prepare, name, model_dir, override, only
            )
            if self.settings.load_dependencies:
                await self._load_dependencies(name, config, chain)
        except Exception as exc:
            wanted = (
                []
                if model_dir is None
                else await asyncio.to_thread(self._wanted_versions, name, model_dir, override, only)
            )
            if private is not None:
                await asyncio.to_thread(remove_override_directory, private)
            reason = getattr(exc, "message", None) or str(exc)
            self._fail_model(record, reason, wanted)
            log.error("%s", load_failed(name, reason))
            raise LoadError(load_failed(name, reason)) from None
        if private is not None:
            self._private.setdefault(name, set()).add(private)
        record.path = model_dir
        record.config = config
        record.state = ModelState.UNKNOWN
        record.reason = ""
        failures = await self._swap(record, config, model_dir, available, versions, keep)
        await self._release_private(name)
        if failures:
            raise LoadError(load_failed(name, "".join(failures)))
        record.loaded_files = now
        log.info("successfully loaded '%s'", shown(name))  # Triton's line; qa scripts count it

    def _source(
        self, name: str, override: ModelConfig | None, files: Mapping[str, bytes] | None
    ) -> Path | None:
        """The model's repository directory, or None when `files` make up the model. A request
        refused here (unknown name, bad override path) changes nothing, not even the index."""
        if not plausible_name(name):
            raise LoadError(not_in_repository(name))
        if not files:
            if self._refresh is not None:
                self._refresh(name)
            return self._locate(name)
        if override is None:
            raise LoadError(not_in_repository(name))
        try:
            for key in files:
                checked_path(key)
        except OverrideError as exc:  # nothing was written: Triton's words for a refusal
            raise LoadError(f"failed to load '{shown(name)}': {exc}") from None
        return None

    async def _swap(
        self,
        record: ModelRecord,
        config: ModelConfig,
        model_dir: Path,
        available: dict[int, Path],
        versions: list[int],
        keep: Collection[int],
    ) -> list[str]:
        """Load the selected versions next to what serves; retire the rest only if all loaded.
        Returns the failures."""
        kept = [v for v in versions if v in keep and _same(record.versions.get(v), config)]
        for version in kept:
            record.versions[version].reason = ""
        outcomes = await asyncio.gather(
            *(
                self._load_version(record, config, model_dir, version, available[version])
                for version in versions
                if version not in kept
            )
        )
        failures = [reason for reason in outcomes if reason]
        if not failures:
            retired = [
                v
                for v in list(record.versions)
                if v not in versions and record.versions[v].state is not ModelState.UNAVAILABLE
            ]
            await asyncio.gather(*(self._retire(record, v) for v in retired))
            for version in [
                v
                for v, r in record.versions.items()
                if r.state is ModelState.UNAVAILABLE
                and (v not in available or (v not in versions and r.reason != UNLOADED))
            ]:
                # Gone from disk, or a failed version the policy no longer wants.
                del record.versions[version]
        return failures

    def _wanted_versions(
        self, name: str, model_dir: Path, override: ModelConfig | None, only: Collection[int] | None
    ) -> list[int]:
        """After a load failed before building any version: the versions it was for, by the
        version policy of the config as written (none when that does not parse either)."""
        try:
            config = (
                read_config(model_dir, self.settings.config_name)
                if override is None
                else _copy(override)
            )
            available = layout.version_directories(model_dir, quiet=True)
        except Exception:
            return []
        if only is not None:
            available = {v: path for v, path in available.items() if v in only}
        config.name = name
        return layout.select_versions(config, available)

    def _fail_model(self, record: ModelRecord, reason: str, wanted: Collection[int] = ()) -> None:
        """A load failed before any version was built: show why, keep what serves. Versions
        the load was for that do not serve (a new version whose model file auto-complete
        cannot read) show as UNAVAILABLE with the reason, as in Triton, beside the previous
        version that stays READY; strict readiness counts them."""
        serving = [r for r in record.versions.values() if r.serving]
        for version in serving:
            version.reason = RELOAD_FAILED + reason
        if not serving:
            record.state = ModelState.UNAVAILABLE
            record.reason = reason
            if all(r.state is ModelState.UNAVAILABLE for r in record.versions.values()):
                record.versions.clear()  # the model-level reason is the one to show
            return
        for number in wanted:
            current = record.versions.get(number)
            if current is None or current.state is ModelState.UNAVAILABLE:
                record.versions[number] = VersionRecord(number, ModelState.UNAVAILABLE, reason)

    async def _load_dependencies(
        self, name: str, config: ModelConfig, chain: tuple[str, ...]
    ) -> None:
        if config.platform != "ensemble":
            return
        members = sorted({step.model_name for step in config.ensemble_scheduling.step})
        self._building[name] = set(members)
        for member in members:
            if member == name or member in chain:
                raise ConfigError(f"circular dependency between ensemble '{name}' and '{member}'")
            async with self._lock(member):
                current = self.registry.models.get(member)
                if current is not None and current.ready_versions():
                    continue
                try:
                    await self._load_locked(member, None, None, (), None, chain + (name,))
                except LoadError as exc:
                    raise ConfigError(f"ensemble '{name}' depends on '{member}': {exc}") from None
            self._dependents.setdefault(name, set()).add(member)

    async def _load_version(
        self,
        record: ModelRecord,
        config: ModelConfig,
        model_dir: Path,
        version: int,
        version_dir: Path,
    ) -> str:
        name = record.name
        old = record.versions.get(version)
        replacing = old is not None and old.serving
        if not replacing:
            record.versions[version] = VersionRecord(version, ModelState.LOADING)
        started = time.monotonic()
        try:
            # An ensemble has no runtime of its own; its scheduler runs the member models.
            backend_cls = (
                None
                if config.platform == "ensemble"
                else registry_backend_class(config.backend, name)
            )
            spec = VersionSpec(
                name,
                version,
                _copy(config),
                model_dir,
                version_dir,
                backend_cls,  # type: ignore[arg-type]  # None for an ensemble: it runs no backend
                self._host,
            )
            if config.response_cache.enable and config.platform == "ensemble":
                self._check_cached_ensemble(config)
            stats = VersionStatistics(name, str(version))
            scheduler, labels = await build_version(
                spec,
                stats,
                self._scheduler_factory,
                self._infer,
                self.settings.load_retries,
                lambda: self._closing,
            )
        except Exception as exc:
            reason = getattr(exc, "message", None) or str(exc)
            log.error("failed to load '%s' version %d: %s", shown(name), version, reason)
            if replacing:
                old.reason = RELOAD_FAILED + reason  # type: ignore[union-attr]  # replacing: set
            else:
                record.versions[version] = VersionRecord(version, ModelState.UNAVAILABLE, reason)
            return f"version {version} is at UNAVAILABLE state: {reason};"
        seconds = time.monotonic() - started
        cache = self._bind_cache(name, config)
        stats.caching = cache is not None
        if self.hooks is not None:
            if replacing:
                self.hooks.version_unloaded(name, version)
            stats.attach(self.hooks.version_loaded(name, version, seconds))
        if replacing and old.cache is not None:  # type: ignore[union-attr]  # replacing: set
            old.cache.close()  # type: ignore[union-attr]
        record.versions[version] = VersionRecord(
            version, ModelState.READY, "", spec, scheduler, seconds, labels, cache
        )
        log.info("loaded '%s' version %d in %.2fs", shown(name), version, seconds)
        if replacing:
            await self._drain_and_stop(name, version, old)  # type: ignore[arg-type]  # replacing: set
        return ""

    def _check_cached_ensemble(self, config: ModelConfig) -> None:
        """An ensemble caches its one answer: a decoupled step (any number of answers) makes
        that meaningless, and Triton refuses it at load too."""
        for member in sorted({step.model_name for step in config.ensemble_scheduling.step}):
            model = self.registry.models.get(member)
            for record in model.versions.values() if model is not None else ():
                if record.scheduler is not None and record.scheduler.rules.decoupled:
                    raise LoadError(
                        f"response cache does not currently support ensemble '{config.name}' "
                        f"with decoupled step model '{member}'; disable response_cache"
                    )

    def _bind_cache(self, name: str, config: ModelConfig) -> CopyCache | None:
        """A new copy's response cache: None unless its config enables one and the server
        has a cache (a config asking for one without it is served uncached, as Triton)."""
        enabled = bool(config.response_cache.enable)
        if self._response_cache is None:
            if enabled:
                log.warning(
                    "model '%s' enables response_cache but the server has no cache "
                    "(--cache-config local,size=N): its answers are not cached",
                    name,
                )
            return None
        return self._response_cache(name, enabled)

    # ----- retire ---------------------------------------------------------------------------
    async def _drain_and_stop(
        self, name: str, version: int, record: VersionRecord, drain_timeout: float | None = None
    ) -> None:
        scheduler = record.scheduler
        assert scheduler is not None
        # Live sequences finish on this copy: their next requests are routed here meanwhile.
        pinned = scheduler.live_sequences() > 0
        if pinned:
            self.registry.pin_sequences(name, record)
        try:
            await scheduler.drain(
                self.settings.drain_timeout if drain_timeout is None else drain_timeout
            )
        finally:
            if pinned:
                self.registry.unpin_sequences(name, record)
        await scheduler.stop()
        log.info("successfully unloaded '%s' version %d", shown(name), version)  # Triton's line

    async def _retire(
        self, record: ModelRecord, version: int, drain_timeout: float | None = None
    ) -> None:
        """Stop serving one version: new requests are refused at once, admitted ones finish.
        Retiring the same copy twice (an unload meeting shutdown) waits for the first."""
        current = record.versions[version]
        running = self._retiring.get(id(current))
        if running is None:
            running = asyncio.ensure_future(
                self._retire_copy(record, version, current, drain_timeout)
            )
            self._retiring[id(current)] = running
            running.add_done_callback(lambda _: self._retiring.pop(id(current), None))
        await asyncio.shield(running)

    async def _retire_copy(
        self, record: ModelRecord, version: int, current: VersionRecord, drain_timeout: float | None
    ) -> None:
        current.state = ModelState.UNLOADING
        if current.cache is not None:  # a retiring copy answers nothing from the cache again
            current.cache.close()
        if current.scheduler is not None:
            if self.hooks is not None:
                self.hooks.version_unloaded(record.name, version)
            await self._drain_and_stop(record.name, version, current, drain_timeout)
        if record.versions.get(version) is current:  # a newer copy may have been loaded since
            record.versions[version] = VersionRecord(version, ModelState.UNAVAILABLE, UNLOADED)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Unload every version (in-flight requests finish), and every ensemble that uses it
        (loaded again with it later). Unknown names are a no-op."""
        self._taken_along.discard(name)  # unloaded by request: not reloaded behind the user
        for ensemble in [e for e, members in self._building.items() if name in members]:
            async with self._lock(ensemble):  # an ensemble loading on it: let it finish first,
                pass  # so that it is taken along below
        using = ensembles_using(self.registry, name)
        await self.remove_model(name, UNLOADED)
        for ensemble in using:
            log.info("unloading ensemble '%s': it uses '%s'", ensemble, name)
            await self.remove_model(ensemble, UNLOADED)
            self._taken_along.add(ensemble)
        members = self._dependents.pop(name, set())
        if unload_dependents:
            for member in sorted(members):
                await self.remove_model(member, UNLOADED)

    async def remove_model(self, name: str, reason: str) -> None:
        """Retire every version of `name` and mark it UNAVAILABLE with `reason`."""
        async with self._lock(name):
            record = self.registry.models.get(name)
            if record is None:
                if reason == UNLOADED:
                    return
                record = self.registry.record(name)
            record.state = ModelState.UNAVAILABLE
            record.reason = reason
            record.loaded_files = None
            await asyncio.gather(
                *(
                    self._retire(record, v)
                    for v, r in list(record.versions.items())
                    if r.state is not ModelState.UNAVAILABLE or r.reason != UNLOADED
                )
            )
            if reason != UNLOADED:
                record.versions.clear()  # the model-level reason is the one to show
            await self._release_private(name)

    async def _release_private(self, name: str) -> None:
        """Delete override directories no running copy of `name` uses any more."""
        owned = self._private.get(name)
        if not owned:
            return
        record = self.registry.models.get(name)
        in_use = (
            set()
            if record is None
            else {
                r.spec.model_dir
                for r in record.versions.values()
                if r.scheduler is not None and r.spec is not None
            }
        )
        for directory in sorted(owned - in_use):
            owned.discard(directory)
            await asyncio.to_thread(remove_override_directory, directory)

    async def shutdown(self, drain_timeout: float | None = None) -> None:
        """Drain and unload everything (server exit); leftovers past the timeout fail with
        UNAVAILABLE so every admitted request is answered. Loads still running are not
        published."""
        self._closing = True
        retiring = []
        for record in list(self.registry.models.values()):
            retiring += [
                self._retire(record, v, drain_timeout)
                for v, r in list(record.versions.items())
                if r.scheduler is not None
            ]
        await asyncio.gather(*retiring)
        for name in list(self._private):
            await self._release_private(name)


def _same(current: VersionRecord | None, config: ModelConfig) -> bool:
    """A serving copy that an unchanged version may keep (its config is the same but for the
    version policy)."""
    return (
        current is not None
        and current.serving
        and current.spec is not None
        and same_but_versions(current.spec.config, config)
    )


def _copy(config: ModelConfig) -> ModelConfig:
    clone = ModelConfig()
    clone.CopyFrom(config)
    return clone
