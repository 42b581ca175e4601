"""Pick the scheduler a model version's config asks for."""

from __future__ import annotations

from scheduler.batcher import DynamicBatcher
from scheduler.clock import Clock
from scheduler.ensemble import EnsembleScheduler, Infer
from scheduler.interface import Scheduler, VersionSpec
from scheduler.queue_scheduler import DefaultScheduler
from scheduler.rate_limiter import RateLimiter
from scheduler.sequence.batcher import SequenceBatcher
from scheduler.stats import VersionStatistics


def create_scheduler(
    spec: VersionSpec,
    stats: VersionStatistics,
    *,
    clock: Clock | None = None,
    infer: Infer | None = None,
    rate_limiter: RateLimiter | None = None,
) -> Scheduler:
    """The dynamic batcher when the config has `dynamic_batching`, the sequence batcher when it
    has `sequence_batching`, else the default scheduler (one request per execution, instances
    in parallel). Call `start()` on the result to load. `rate_limiter`: the server's, with
    `--rate-limit execution_count` (None: instance groups' `rate_limiter` is ignored)."""
    if spec.config.platform == "ensemble":
        assert infer is not None, "an ensemble needs the core's infer"
        return EnsembleScheduler(spec, stats, infer)
    if spec.config.HasField("dynamic_batching"):
        return DynamicBatcher(spec, stats, clock=clock, rate_limiter=rate_limiter)
    if spec.config.HasField("sequence_batching"):
        return SequenceBatcher(spec, stats, clock=clock, rate_limiter=rate_limiter)
    return DefaultScheduler(spec, stats, clock=clock, rate_limiter=rate_limiter)
