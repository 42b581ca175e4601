"""Which executor process each instance of a group on one NPU runs in
(`executor_instances_per_process`): one per instance by default, n per process, or all in one."""

from __future__ import annotations

import pytest

from npu.executor import client
from protocol.proto.model_config_pb2 import ModelConfig


@pytest.fixture
def no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client.Executor, "start", lambda self: None)
    monkeypatch.setattr(client, "_executors", {})


@pytest.mark.parametrize(
    "per_process, expected",
    [(1, [0, 1, 2, 3, 4]), (2, [0, 0, 1, 1, 2]), (0, [0, 0, 0, 0, 0])],
)
def test_instances_fill_processes_in_turn(no_processes, per_process, expected) -> None:
    placed = []
    for n in range(5):
        executor = client._executor_with_room(("m", "/v/1", "m", 1), per_process, ModelConfig())
        executor.instances.append(n)  # type: ignore[arg-type]
        placed.append(executor.key[4])
        assert executor.args()[-4:] == ["--device", "1", "--process", str(executor.key[4])]
    assert placed == expected


def test_the_parameter_has_bounds() -> None:
    bound = client.AscendExecutorBackend.parameter_bounds["executor_instances_per_process"]
    assert (bound.low, bound.high) == (0, client.MAX_INSTANCES_PER_PROCESS)
