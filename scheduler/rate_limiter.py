"""Triton's rate limiter (`--rate-limit execution_count`): one object per server process that
decides when a model instance may run a batch.

Why: several models on one card share its memory and cores; running them all at once can run it
out of memory. An instance whose instance_group names `rate_limiter { resources [...] }` runs a
batch only while the resources it names are free: per-device resources on its own device,
`global` ones across the process. The resource counts are `--rate-limit-resource` values, or by
default the most any loaded instance asks for. A model asking for more than an explicit count can
ever provide is refused at load.

Turns: instances waiting for resources are served lowest "pass" first. Each execution advances an
instance's pass by its priority (0 counts as 1), so under contention priority 2 gets half the
turns of priority 1 (Triton's `exec_count x priority`). An instance that starts waiting starts no
lower than the pass of the last turn given, so a model loaded late, or idle for a while, gets its
share from then on rather than every turn until it has caught up. A waiter whose resources are
not free blocks the waiters behind it that need any of the same resources (a large request is
not starved by small ones), but not those that need others (another device's).

Everything here runs on the event loop of the process that owns the models: no locks. A turn
given to an instance that did not ask for it at that moment is announced by `schedule` (the
loop's call_soon), never by a call back into the scheduler that is releasing resources.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

GLOBAL = -1  # the device key of `global: true` resources

# Claimant states.
IDLE, WAITING, GRANTED = range(3)

Key = tuple[int, str]  # (device, or GLOBAL; the resource's name in lower case)


@dataclass(frozen=True)
class ResourceLimit:
    """One `--rate-limit-resource <name>:<count>[:<device>]` (device None: every device)."""

    name: str
    count: int
    device: int | None = None


def parse_resource_flag(text: str) -> ResourceLimit:
    """`<name>:<count>[:<device>]`, case-insensitive as in Triton; raises ValueError naming the
    expected form."""
    parts = text.split(":")
    problem = ""
    if len(parts) not in (2, 3) or not parts[0].strip():
        problem = "expected <name>:<count> or <name>:<count>:<device>"
    elif not parts[1].strip().isdigit():
        problem = "the count must be a whole number of 0 or more"
    elif len(parts) == 3 and not parts[2].strip().isdigit():
        problem = "the device must be a device id (0 or more)"
    if problem:
        raise ValueError(f"--rate-limit-resource {text!r}: {problem}, e.g. R1:4 or R1:4:0")
    device = int(parts[2]) if len(parts) == 3 else None
    return ResourceLimit(parts[0].strip().lower(), int(parts[1]), device)


class RateLimitError(Exception):
    """A model whose resources the server can never provide; `message` is the load's reason."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(eq=False)
class Claimant:
    """One model instance's demand on the limiter, and where it stands."""

    label: str  # "<model>/<instance>", for the log and errors
    needs: dict[Key, int]  # resource -> copies one execution holds
    spelled: dict[Key, str]  # resource -> the name as the config spells it
    priority: int
    on_grant: Callable[[], Any]  # told (through `schedule`) that a turn came
    pass_: int = 0
    state: int = IDLE
    order: int = 0  # when it started waiting: ties go to the earlier
    executions: int = 0


def rate_limiter_needs(config: Any, device: int) -> tuple[dict[Key, int], dict[Key, str], int]:
    """(needs, spellings, priority) of an instance_group's `rate_limiter` on `device`."""
    needs: dict[Key, int] = {}
    spelled: dict[Key, str] = {}
    for resource in config.resources:
        if resource.count <= 0:
            continue  # asks for nothing
        key = (GLOBAL if getattr(resource, "global") else device, resource.name.lower())
        needs[key] = needs.get(key, 0) + resource.count
        spelled.setdefault(key, resource.name)
    return needs, spelled, max(1, config.priority)


def _call_soon(callback: Callable[[], Any]) -> None:
    asyncio.get_running_loop().call_soon(callback)


class RateLimiter:
    """The resources of one server process and the instances waiting for them."""

    def __init__(
        self,
        explicit: Sequence[ResourceLimit] = (),
        *,
        schedule: Callable[[Callable[[], Any]], Any] = _call_soon,
    ) -> None:
        self._explicit_names = {limit.name.lower() for limit in explicit}
        self._explicit: dict[tuple[str, int | None], int] = {}
        for limit in explicit:  # a later flag for the same name and device wins
            self._explicit[(limit.name.lower(), limit.device)] = limit.count
        self._schedule = schedule
        self._claimants: list[Claimant] = []
        self._waiting: list[Claimant] = []
        self._in_use: dict[Key, int] = {}
        self._default: dict[Key, int] = {}  # the most any registered claimant asks for
        self._last_pass = 0
        self._order = itertools.count()

    # -- who takes part -------------------------------------------------------------------

    def claimant(
        self, label: str, rate_limiter: Any, device: int, on_grant: Callable[[], Any]
    ) -> Claimant | None:
        """The claimant for an instance with this `rate_limiter` config, or None when it asks
        for no resource (Triton: such an instance is not limited in any way)."""
        needs, spelled, priority = rate_limiter_needs(rate_limiter, device)
        if not needs:
            return None
        return Claimant(label, needs, spelled, priority, on_grant)

    def admit(self, claimants: Sequence[Claimant]) -> None:
        """Take part, all or none; raises RateLimitError with Triton's text when a resource
        is named both global and per-device, or an explicit count is below what one asks."""
        everyone = self._claimants + list(claimants)
        scopes: dict[str, set[bool]] = {}
        for claimant in everyone:
            for device, name in claimant.needs:
                scopes.setdefault(name, set()).add(device == GLOBAL)
        for claimant in claimants:
            for key, count in claimant.needs.items():
                shown = claimant.spelled[key]
                if len(scopes[key[1]]) > 1:
                    raise RateLimitError(
                        f'Resource "{shown}" is present as both global and device-specific '
                        "resource in the model configuration."
                    )
                if key[1] in self._explicit_names:
                    limit = self._explicit_count(key)
                    if limit < count:
                        raise RateLimitError(
                            f'Resource count for "{shown}" is limited to {limit} which will '
                            "prevent scheduling of one or more model instances, the minimum "
                            f"required count is {count}"
                        )
        start = self._last_pass
        for claimant in claimants:
            claimant.pass_ = max(claimant.pass_, start)
            claimant.state = IDLE
        self._claimants = everyone
        self._recount()
        self._grant()  # larger defaults may let a waiter in

    def remove(self, claimants: Iterable[Claimant]) -> None:
        """Leave (an unloaded version): stop their waiting. One that holds a turn keeps its
        resources until `release`: its batch is still running on the device."""
        gone = set(map(id, claimants))
        for claimant in self._claimants:
            if id(claimant) in gone and claimant.state == WAITING:
                claimant.state = IDLE
        self._claimants = [c for c in self._claimants if id(c) not in gone]
        self._waiting = [c for c in self._waiting if id(c) not in gone]
        self._recount()
        self._grant()

    # -- turns ----------------------------------------------------------------------------

    def request(self, claimant: Claimant) -> bool:
        """Wait for a turn; True when it is given at once (nothing is announced then),
        else `on_grant` is scheduled when it comes."""
        if claimant.state == GRANTED:
            return True
        if claimant.state == IDLE:
            self._wait(claimant)
        return claimant in self._grant(quiet=claimant)

    def release(self, claimant: Claimant, executed: bool, again: bool = False) -> None:
        """Give a turn back; `executed`: it ran a batch (its pass advances); `again`: it has
        more work and waits for the next turn at once (before anyone is let in)."""
        if claimant.state != GRANTED:
            return
        self._free(claimant)
        claimant.state = IDLE
        if executed:
            claimant.executions += 1
            claimant.pass_ += claimant.priority
        if again and any(c is claimant for c in self._claimants):
            self._wait(claimant)
        self._grant()

    # -- what there is --------------------------------------------------------------------

    def capacity(self, key: Key) -> int:
        """Copies of a resource: the explicit count, else the most one instance asks for."""
        if key[1] in self._explicit_names:
            return self._explicit_count(key)
        return self._default.get(key, 0)

    def in_use(self, key: Key) -> int:
        return self._in_use.get(key, 0)

    def resources(self) -> list[tuple[str, str, int, int]]:
        """(device or "GLOBAL", name, copies, in use) of every resource a loaded model names."""
        keys = sorted({key for claimant in self._claimants for key in claimant.needs})
        return [
            (
                "GLOBAL" if key[0] == GLOBAL else str(key[0]),
                key[1],
                self.capacity(key),
                self.in_use(key),
            )
            for key in keys
        ]

    # -- inside ---------------------------------------------------------------------------

    def _explicit_count(self, key: Key) -> int:
        device, name = key
        if device == GLOBAL:  # one copy set for the process: the device given is ignored
            return max((count for (n, _), count in self._explicit.items() if n == name), default=0)
        specific = self._explicit.get((name, device))
        if specific is not None:
            return specific
        return self._explicit.get((name, None), 0)

    def _recount(self) -> None:
        default: dict[Key, int] = {}
        for claimant in self._claimants:
            for key, count in claimant.needs.items():
                default[key] = max(default.get(key, 0), count)
        self._default = default

    def _wait(self, claimant: Claimant) -> None:
        claimant.state = WAITING
        claimant.pass_ = max(claimant.pass_, self._last_pass)
        claimant.order = next(self._order)
        self._waiting.append(claimant)

    def _fits(self, claimant: Claimant) -> bool:
        return all(
            self._in_use.get(key, 0) + count <= self.capacity(key)
            for key, count in claimant.needs.items()
        )

    def _free(self, claimant: Claimant) -> None:
        for key, count in claimant.needs.items():
            self._in_use[key] = self._in_use.get(key, 0) - count

    def _grant(self, quiet: Claimant | None = None) -> list[Claimant]:
        """Give turns to waiters in pass order while they fit; a waiter that does not fit
        holds back those behind it that need any of its resources."""
        if not self._waiting:
            return []
        blocked: set[Key] = set()
        granted: list[Claimant] = []
        for claimant in sorted(self._waiting, key=lambda c: (c.pass_, c.order)):
            keys = claimant.needs.keys()
            if blocked.isdisjoint(keys) and self._fits(claimant):
                for key, count in claimant.needs.items():
                    self._in_use[key] = self._in_use.get(key, 0) + count
                claimant.state = GRANTED
                self._last_pass = max(self._last_pass, claimant.pass_)
                granted.append(claimant)
            else:
                blocked.update(keys)
        if granted:
            self._waiting = [c for c in self._waiting if c.state == WAITING]
            for claimant in granted:
                if claimant is not quiet:
                    self._schedule(claimant.on_grant)
        return granted
