"""A load whose instance threads cannot start (a process or thread limit) fails with that
reason, stops the threads that did start and releases the model's lock: issue 28 item 3 (the
pool used to record the thread before `start()` succeeded, and the load then hung for ever)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from repository.manager import LoadError, ManagerSettings, ModelManager
from repository.registry import ModelRegistry, ModelState

CONFIG = (
    'backend: "identity"\nmax_batch_size: 4\n'
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    'output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    "instance_group [ { kind: KIND_CPU count: 4 } ]\n"
)


def _instance_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("instance-m_")]


@pytest.fixture
def manager(tmp_path: Path) -> tuple[ModelManager, ModelRegistry]:
    model_dir = tmp_path / "repo" / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(CONFIG)
    registry = ModelRegistry()
    settings = ManagerSettings([tmp_path / "repo"], auto_complete=False, drain_timeout=1.0)
    return ModelManager(settings, registry), registry


async def test_a_thread_that_cannot_start_fails_the_load_and_releases_everything(
    manager: tuple[ModelManager, ModelRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    models, registry = manager
    real_start = threading.Thread.start
    started: list[str] = []

    def start(self: threading.Thread) -> None:
        if self.name.startswith("instance-m_"):
            if len(started) >= 2:  # the third instance thread hits the limit
                raise RuntimeError("can't start new thread")
            started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(LoadError, match="can't start new thread"):
        await asyncio.wait_for(models.load_model("m"), 10)
    entry = registry.models["m"].versions[1]
    assert entry.state is ModelState.UNAVAILABLE
    assert "can't start new thread" in entry.reason
    assert len(started) == 2
    deadline = time.monotonic() + 5
    while _instance_threads() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not _instance_threads(), "the threads that started were not stopped"

    monkeypatch.setattr(threading.Thread, "start", real_start)
    await asyncio.wait_for(models.load_model("m"), 10)  # the lock was released
    assert registry.models["m"].versions[1].state is ModelState.READY
    await models.shutdown(1.0)
