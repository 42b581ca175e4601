"""`--model-control-mode=poll`: rescan the repositories and load, reload or unload what changed.

Copying a model into a watched repository is not atomic, so nothing is acted on until it has
settled: a version directory (or the model-level files) loads only once the poller has seen
its files unchanged for at least `settle` seconds (`--repository-settle-secs`, default 10) and
in two polls in a row, and a model's presence must be the same in two polls in a row. A copy
that pauses between two parts (a `model.py` written in halves) is therefore not loaded half
done, unless the pause outlasts the settle time. A deploy tool can say a unit is complete
instead: a `.ready` file written into the version directory (or the model directory) after
everything else makes it load at the next poll, without the wait (repository/fingerprint.py).

What was last handed to the manager is remembered per model as content fingerprints, so only
real changes cause a load, unchanged versions are kept serving, and a load that failed is not
retried until the files change again. Each model's load or unload runs as its own task: a slow
drain never holds up other models or later polls, and no failure stops the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from repository import layout
from repository.fingerprint import MODEL_LEVEL, ContentHasher, Fingerprint, ModelFiles, scan_model
from repository.reload_plan import is_config_file

log = logging.getLogger(__name__)


class PollTarget(Protocol):
    """The part of the model manager the poller drives."""

    async def load_model(
        self,
        name: str,
        override: None = None,
        *,
        versions: Collection[int] | None = None,
        keep: Collection[int] = (),
    ) -> None: ...

    async def remove_model(self, name: str, reason: str) -> None: ...


@dataclass
class Applied:
    """What the manager was last asked to serve for one model."""

    path: Path
    model: Fingerprint
    versions: dict[int, Fingerprint]


@dataclass(frozen=True)
class Action:
    """One thing a poll decided: load `versions` (keeping `keep` as they serve) or remove."""

    name: str
    kind: str  # "load" | "remove"
    versions: frozenset[int] = frozenset()
    keep: frozenset[int] = frozenset()
    reason: str = ""


@dataclass
class Observation:
    """One scan: where each model name was found, and the files of those found once."""

    locations: dict[str, tuple[Path, ...]] = field(default_factory=dict)
    files: dict[str, ModelFiles] = field(default_factory=dict)
    # Content fingerprints of the units that are stable (or of every unit when priming).
    stable: dict[str, dict[int | None, Fingerprint]] = field(default_factory=dict)
    # When each unit was first seen with the files it has now (the poller's clock).
    since: dict[str, dict[int | None, float]] = field(default_factory=dict)


class RepositoryPoller:
    """`settle`: seconds a unit's files must be seen unchanged before it loads (0: two polls
    in a row are enough); `refresh` (blocking) brings mirrored repositories up to date before
    each scan (repository/s3_mirror.py), so a scan never sees a mirror mid-update; `clock` is
    for tests."""

    def __init__(
        self,
        repositories: list[Path],
        target: PollTarget,
        interval: float,
        *,
        settle: float = 0.0,
        refresh: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.repositories = repositories
        self.target = target
        self.interval = interval
        self.settle = settle
        self._refresh = refresh
        self._clock = clock
        self._hasher = ContentHasher()
        self._previous = Observation()
        self._applied: dict[str, Applied] = {}
        self._duplicates: set[str] = set()
        self._running: dict[str, asyncio.Task] = {}
        self._loop_task: asyncio.Task | None = None

    # ----- scanning (off the event loop) --------------------------------------------------
    def _observe(self, previous: Observation, prime: bool) -> Observation:
        unique, duplicates = layout.scan_repositories(self.repositories, quiet=True)
        seen = Observation()
        now = self._clock()
        for name, paths in duplicates.items():
            seen.locations[name] = tuple(paths)
        for name, location in unique.items():
            seen.locations[name] = (location.path,)
            files = seen.files[name] = scan_model(location.path)
            before = previous.files.get(name)
            first_seen = previous.since.get(name, {})
            since = seen.since[name] = {}
            stable: dict[int | None, Fingerprint] = {}
            for unit, stats in files.units.items():
                unchanged = (
                    before is not None
                    and before.path == files.path
                    and before.units.get(unit) == stats
                )
                since[unit] = first_seen.get(unit, now) if unchanged else now
                settled = unchanged and now - since[unit] >= self.settle
                if prime or settled or files.marked_complete(unit):
                    try:
                        stable[unit] = self._hasher.fingerprint(files.path, stats)
                    except OSError as exc:  # vanished or unreadable: not settled, try later
                        log.debug("cannot read model '%s' yet: %s", name, exc)
                    else:
                        if prime:  # what startup loads counts as settled from the start
                            since[unit] = float("-inf")
            seen.stable[name] = stable
        self._hasher.end_round()
        return seen

    # ----- deciding (on the loop; pure bookkeeping) ---------------------------------------
    def _decide(self, seen: Observation) -> list[Action]:
        previous, self._previous = self._previous, seen
        actions: list[Action] = []
        names = (
            set(seen.locations) | set(previous.locations) | set(self._applied) | self._duplicates
        )
        for name in sorted(names):
            if name in self._running:
                continue  # re-examined once its current load or unload is done
            where = seen.locations.get(name, ())
            if where != previous.locations.get(name, ()):
                continue  # appeared, vanished or moved since the last poll: wait
            action = self._decide_model(name, where, seen)
            if action is not None:
                actions.append(action)
        return actions

    def _decide_model(self, name: str, where: tuple[Path, ...], seen: Observation) -> Action | None:
        applied = self._applied.get(name)
        if len(where) > 1:
            if name in self._duplicates:
                return None
            self._duplicates.add(name)
            self._applied.pop(name, None)
            return Action(name, "remove", reason=layout.DUPLICATE_REASON)
        self._duplicates.discard(name)
        if not where:
            if applied is None:
                return None
            del self._applied[name]
            return Action(name, "remove", reason="unloaded")
        files = seen.files[name]
        stable = seen.stable.get(name, {})
        if MODEL_LEVEL not in stable:
            return None  # config or labels still being written
        ready = {v: stable[v] for v in files.versions if v in stable}
        settling = [v for v in files.versions if v not in stable]
        if applied is None:
            if not ready:
                return None  # nothing complete to load yet
        elif any(v in applied.versions for v in settling):
            return None  # a served version is being rewritten in place: wait for the result
        wanted = Applied(files.path, stable[MODEL_LEVEL], ready)
        if wanted == applied:
            return None
        # Unchanged versions may keep serving unless a model-level file they may use changed;
        # a config change is the manager's to judge (the same but for the version policy).
        keep: set[int] = set()
        if (
            applied is not None
            and applied.path == wanted.path
            and _without_config(applied.model) == _without_config(wanted.model)
        ):
            keep = {v for v, fp in ready.items() if applied.versions.get(v) == fp}
        self._applied[name] = wanted
        return Action(name, "load", frozenset(ready), frozenset(keep))

    # ----- acting ---------------------------------------------------------------------------
    async def _act(self, action: Action) -> None:
        try:
            if action.kind == "remove":
                log.info(
                    "model '%s' left the repository (%s): unloading", action.name, action.reason
                )
                await self.target.remove_model(action.name, action.reason)
            else:
                log.info(
                    "model '%s' changed on disk: loading (complete versions %s, unchanged %s)",
                    action.name,
                    sorted(action.versions),
                    sorted(action.keep),
                )
                await self.target.load_model(
                    action.name, versions=action.versions, keep=action.keep
                )
        except Exception as exc:
            log.error("poll: %s of model '%s' failed: %s", action.kind, action.name, exc)

    def _launch(self, action: Action) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._act(action), name=f"poll:{action.name}")
        self._running[action.name] = task
        task.add_done_callback(lambda _: self._running.pop(action.name, None))
        return task

    # ----- public ---------------------------------------------------------------------------
    async def prime(self) -> None:
        """Take what is on disk now as what the startup load serves."""
        seen = await asyncio.to_thread(self._observe, Observation(), True)
        self._previous = seen
        for name, files in seen.files.items():
            stable = seen.stable[name]
            if all(unit in stable for unit in files.units):  # else: treated as new once readable
                self._applied[name] = Applied(
                    files.path, stable[MODEL_LEVEL], {v: stable[v] for v in files.versions}
                )
        self._duplicates = {name for name, where in seen.locations.items() if len(where) > 1}

    async def poll(self) -> list[asyncio.Task]:
        """One pass: scan, decide, start the loads and unloads (returned, to await in tests)."""
        if self._refresh is not None:
            await asyncio.to_thread(self._refresh)
        seen = await asyncio.to_thread(self._observe, self._previous, False)
        return [self._launch(action) for action in self._decide(seen)]

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("poll of the model repositories failed")

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(
            self._run(), name="repository-poll"
        )

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop polling; give loads already started `timeout` seconds, then cancel them."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
            self._loop_task = None
        running = list(self._running.values())
        if running:
            done, pending = await asyncio.wait(running, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)


def _without_config(files: Fingerprint) -> Fingerprint:
    return tuple(entry for entry in files if not is_config_file(entry[0]))
