"""Fixtures for the scheduler tests: `batcher` builds started dynamic batchers (batcher_harness)."""

from __future__ import annotations

import pytest
from batcher_harness import AddOneModel, Harness, make_config


@pytest.fixture
async def batcher():
    made: list[Harness] = []

    async def make(
        batching: str = "", model: type[AddOneModel] = AddOneModel, **config_kwargs
    ) -> Harness:
        harness = Harness(make_config(batching, **config_kwargs), model)
        await harness.scheduler.start()
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.recorder.release_all()
        await harness.scheduler.drain(0)
        await harness.scheduler.stop()
