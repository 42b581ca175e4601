"""A scheduler with nothing to start or stop, for tests (and bench/studies/traffic_routing.py)
that drive server/core/inference_path.py over a registry of fake versions: subclasses write
`_admit` only."""

from __future__ import annotations

from scheduler.interface import Scheduler


class InstantScheduler(Scheduler):
    """Validates like every scheduler (Scheduler.submit); lifecycle calls do nothing."""

    async def start(self) -> None: ...

    async def drain(self, timeout: float) -> None: ...

    async def stop(self) -> None: ...

    def healthy(self) -> bool:
        return True
