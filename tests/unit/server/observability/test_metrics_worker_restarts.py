"""`ascend_python_worker_restarts_total`: read at scrape time from what the backends of each
serving version count (backends import nothing from server/)."""

from __future__ import annotations

from types import SimpleNamespace

from repository.registry import ModelRegistry, ModelState, VersionRecord
from server.observability.metrics import WORKER_RESTARTS, ServerMetrics, worker_restarts


def _scheduler(*backends: object) -> object:
    instances = [SimpleNamespace(backend=backend) for backend in backends]
    return SimpleNamespace(pool=SimpleNamespace(instances=instances), healthy=lambda: True)


def test_restarts_are_summed_over_the_instances_of_each_serving_version() -> None:
    registry = ModelRegistry()
    python = registry.record("py")
    python.versions[1] = VersionRecord(1, ModelState.UNAVAILABLE, "unloaded")
    python.versions[2] = VersionRecord(
        2,
        ModelState.READY,
        scheduler=_scheduler(  # type: ignore[arg-type]
            SimpleNamespace(restarts=2), SimpleNamespace(restarts=1)
        ),
    )
    registry.record("onnx").versions[1] = VersionRecord(  # no restart count: no series
        1, ModelState.READY, scheduler=_scheduler(SimpleNamespace())
    )  # type: ignore[arg-type]
    registry.record("ensemble").versions[1] = VersionRecord(  # no pool at all
        1, ModelState.READY, scheduler=SimpleNamespace(healthy=lambda: True)
    )  # type: ignore[arg-type]
    assert worker_restarts(registry) == [("py", "2", 3)]
    text = ServerMetrics(restarts=lambda: worker_restarts(registry)).render().decode()
    assert f"# TYPE {WORKER_RESTARTS} counter" in text
    assert [line for line in text.splitlines() if line.startswith(WORKER_RESTARTS)] == [
        'ascend_python_worker_restarts_total{model="py",version="2"} 3'
    ]


def test_without_a_reader_there_is_no_family() -> None:
    assert WORKER_RESTARTS not in ServerMetrics().render().decode()
