"""Building one loaded copy of a model version: its scheduler started, warmed up and its
labels read, tried again up to --model-load-retry-count times (as Triton) when that fails."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from protocol.classification import read_labels
from repository.warmup import run_warmup
from scheduler.interface import LoadError, Scheduler, VersionSpec
from scheduler.stats import VersionStatistics

log = logging.getLogger("repository.manager")


async def build_version(
    spec: VersionSpec,
    stats: VersionStatistics,
    create: Callable[..., Scheduler],
    infer: Any,
    retries: int,
    closing: Callable[[], bool],
) -> tuple[Scheduler, dict[str, list[str]]]:
    """A started, warmed-up scheduler for `spec` and its output labels; raises the last
    attempt's error after 1 + `retries` attempts (none once the server is closing)."""
    attempt = 0
    while True:
        scheduler = None
        try:
            scheduler = create(spec, stats, infer=infer)
            labels = await asyncio.to_thread(read_output_labels, spec)
            await scheduler.start()
            await run_warmup(spec, scheduler)
            if closing():
                raise LoadError("the server is shutting down")
            return scheduler, labels
        except Exception as exc:
            if scheduler is not None:
                await stop_quietly(scheduler)
            if attempt >= retries or closing():
                raise
            attempt += 1
            log.warning(
                "loading '%s' version %d failed (%s); retrying (%d of %d)",
                spec.name,
                spec.version,
                getattr(exc, "message", None) or exc,
                attempt,
                retries,
            )


async def stop_quietly(scheduler: Scheduler) -> None:
    try:
        await scheduler.stop()
    except Exception:
        log.exception("stopping a version that failed to load")


def read_output_labels(spec: VersionSpec) -> dict[str, list[str]]:
    """Each output's classification labels (`label_filename`), read once per loaded copy so a
    reload shows changed labels. An unreadable file means no labels, as in Triton."""
    labels: dict[str, list[str]] = {}
    for tensor in spec.config.output:
        if tensor.label_filename:
            try:
                labels[tensor.name] = read_labels(spec.model_dir / tensor.label_filename)
            except OSError:
                log.warning(
                    "model '%s': cannot read label file '%s'", spec.name, tensor.label_filename
                )
    return labels
