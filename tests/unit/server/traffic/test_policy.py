"""server/traffic/policy.py: routing by policy, the API's checks, the gate on a fake clock, version
events (unload, traffic.json) and shadows, over fake schedulers in one registry."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from harness.fakescheduler import InstantScheduler
from protocol.errors import InternalError, InvalidArgument, NotFound
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.traffic import decode_traffic
from protocol.types import InferRequest, InferResponse, Tensor
from repository.registry import ModelRegistry, ModelState, VersionRecord
from scheduler.interface import VersionSpec
from scheduler.stats import VersionStatistics
from server.core.inference_path import InferencePath
from server.traffic.policy import TrafficControl, TrafficSettings

CONFIG = """
name: "m" max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


class VersionScheduler(InstantScheduler):
    """Answers with its version number; fails, or holds answers, when told to."""

    def __init__(self, spec: VersionSpec, stats: VersionStatistics) -> None:
        super().__init__(spec, stats)
        self.fail = False
        self.hold = False
        self.held: list[asyncio.Future] = []
        self.seen = 0

    def _admit(self, request: InferRequest) -> asyncio.Future:
        self.seen += 1
        future = asyncio.get_running_loop().create_future()
        version = self.spec.version
        if self.hold:
            self.held.append(future)
        elif self.fail:
            future.set_exception(InternalError(f"version {version} failed"))
        else:
            future.set_result(
                InferResponse(
                    "m",
                    str(version),
                    outputs=[Tensor("Y", "FP32", (1,), np.array([version], np.float32))],
                )
            )
        return future


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def path(clock: Clock, tmp_path: Path) -> InferencePath:
    registry = ModelRegistry()
    model = registry.record("m")
    model.path = tmp_path
    for version in (1, 2, 3):
        add_version(registry, version)
    return InferencePath(registry, TrafficControl(registry, TrafficSettings(), clock))


def add_version(registry: ModelRegistry, version: int) -> VersionScheduler:
    config = text_format.Parse(CONFIG, ModelConfig())
    spec = VersionSpec(
        "m", version, config, Path("/nonexistent"), Path(f"/nonexistent/{version}"), None
    )  # type: ignore[arg-type]
    scheduler = VersionScheduler(spec, VersionStatistics("m", str(version)))
    registry.record("m").versions[version] = VersionRecord(
        version, ModelState.READY, "", spec, scheduler
    )
    return scheduler


def scheduler(path: InferencePath, version: int) -> VersionScheduler:
    return path.registry.models["m"].versions[version].scheduler  # type: ignore[return-value]


def request(version: str = "", key: str | None = None) -> InferRequest:
    return InferRequest(
        "m",
        version,
        inputs=[Tensor("X", "FP32", (1,), np.zeros(1, np.float32))],
        parameters={} if key is None else {"traffic_key": key},
    )


async def answered(path: InferencePath, version: str = "", key: str | None = None) -> str:
    return (await path.infer(request(version, key))).model_version


def put(path: InferencePath, body: dict) -> dict:
    return path.traffic.replace("m", decode_traffic(body))


async def test_without_a_policy_the_latest_answers_and_named_requests_are_counted(
    path: InferencePath,
) -> None:
    assert await answered(path) == "3"
    assert await answered(path, "1") == "1"
    assert path.traffic.counts == {("m", 1, "named"): 1}
    record = path.resolve("m", "2")  # a raw body's version, resolved to decode it
    assert record.version == 2 and ("m", 2, "named") not in path.traffic.counts
    assert (await path.infer(request("2"), record)).model_version == "2"
    assert path.traffic.counts[("m", 2, "named")] == 1


async def test_the_split_and_the_named_version_wins(path: InferencePath) -> None:
    put(path, {"weights": {"1": 70, "2": 30, "3": 0}})
    seen = Counter([await answered(path) for _ in range(2_000)])
    assert set(seen) == {"1", "2"} and abs(seen["2"] - 600) < 5 * 21  # sd of 2,000 x 0.3
    assert await answered(path, "3") == "3"
    counts = path.traffic.counts
    assert counts[("m", 1, "split")] + counts[("m", 2, "split")] == 2_000
    assert counts[("m", 3, "named")] == 1


async def test_a_key_sticks_while_the_weights_are_unchanged(path: InferencePath) -> None:
    put(path, {"weights": {"1": 50, "2": 50}})
    first = {f"user-{i}": await answered(path, key=f"user-{i}") for i in range(100)}
    again = {key: await answered(path, key=key) for key in first}
    assert first == again and set(first.values()) == {"1", "2"}
    assert sum(path.traffic.counts[("m", v, "sticky")] for v in (1, 2)) == 200
    # A raw body is resolved before decoding (no key: a split), and counted once inferred.
    before = dict(path.traffic.counts)
    record = path.resolve("m")
    assert record.version in (1, 2) and path.traffic.counts == before
    assert await path.infer(request(), record) is not None
    assert (
        path.traffic.counts[("m", record.version, "split")]
        == before.get(("m", record.version, "split"), 0) + 1
    )


async def test_a_refused_put_leaves_the_policy_in_force(path: InferencePath) -> None:
    before = put(path, {"weights": {"1": 1}})
    path.registry.models["m"].versions[3].state = ModelState.UNAVAILABLE
    with pytest.raises(InvalidArgument, match="version '3' is not READY \\(UNAVAILABLE\\)"):
        put(path, {"weights": {"1": 1, "3": 1}})
    with pytest.raises(InvalidArgument, match="version '9' is not READY \\(unknown\\)"):
        put(path, {"shadow": {"version": "9", "fraction": 1}})
    with pytest.raises(NotFound):
        path.traffic.replace("nope", decode_traffic({}))
    assert path.traffic.status("m") == before


async def test_put_replaces_and_delete_goes_back_to_the_version_policy(path: InferencePath) -> None:
    put(path, {"weights": {"1": 1}, "shadow": {"version": "2", "fraction": 0.5}})
    assert put(path, {"weights": {"2": 1}}) == {
        "model": "m",
        "weights": {"2": 1},
        "shadow": None,
        "canary": None,
    }
    assert path.traffic.delete("m")["weights"] is None and "m" not in path.traffic.policies
    assert await answered(path) == "3"


async def test_a_canary_promotes_itself_on_the_fake_clock(
    path: InferencePath, clock: Clock
) -> None:
    put(
        path,
        {
            "canary": {
                "baseline": "1",
                "candidate": "2",
                "steps": [50, 100],
                "step_seconds": 30,
                "min_requests": 10,
                "max_p99_ms": None,
            }
        },
    )
    traffic = path.traffic
    while traffic.policies["m"].canary.window.served < 10:  # type: ignore[union-attr]
        await answered(path)
    clock.now = 30.0
    traffic.tick()
    assert traffic.status("m")["weights"] == {"1": 0, "2": 100}
    for _ in range(10):
        assert await answered(path) == "2"
    clock.now = 60.0
    traffic.tick()
    status = traffic.status("m")
    assert status["weights"] == {"2": 100} and status["canary"]["state"] == "promoted"
    assert traffic.transitions == {("m", "step"): 1, ("m", "promoted"): 1}


async def test_a_failing_candidate_is_rolled_back(
    path: InferencePath, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler(path, 2).fail = True
    put(
        path, {"canary": {"baseline": "1", "candidate": "2", "steps": [50, 100], "min_requests": 5}}
    )
    failures = 0
    while path.traffic.policies["m"].canary.window.served < 5:  # type: ignore[union-attr]
        try:
            await answered(path)
        except InternalError:
            failures += 1
    assert failures == 5
    with caplog.at_level(logging.INFO):
        path.traffic.tick()  # no time has to pass for a rollback
    canary = path.traffic.status("m")["canary"]
    assert canary["state"] == "rolled_back"
    assert canary["reason"].startswith("error rate 1.0000 > max_error_rate 0.05")
    assert path.traffic.status("m")["weights"] == {"1": 100}
    assert "model 'm': canary rolled back" in caplog.text
    assert {await answered(path) for _ in range(20)} == {"1"}


async def test_an_unloaded_version_drops_out_and_routing_falls_back(path: InferencePath) -> None:
    put(path, {"weights": {"1": 50, "2": 50}, "shadow": {"version": "3", "fraction": 0.1}})
    versions = path.registry.models["m"].versions
    versions[2].state = versions[3].state = ModelState.UNLOADING
    assert {await answered(path, key=f"k{i}") for i in range(50)} == {"1"}  # before settling
    path.traffic.settle("m")
    assert path.traffic.status("m") == {
        "model": "m",
        "weights": {"1": 50},
        "shadow": None,
        "canary": None,
    }
    versions[3].state = ModelState.READY
    versions[1].state = ModelState.UNAVAILABLE
    path.traffic.settle("m")
    assert "m" not in path.traffic.policies and await answered(path) == "3"


async def test_a_canary_version_that_stops_serving_ends_the_canary(path: InferencePath) -> None:
    put(path, {"canary": {"baseline": "1", "candidate": "2"}})
    path.registry.models["m"].versions[2].state = ModelState.UNLOADING
    path.traffic.settle("m")
    status = path.traffic.status("m")
    assert status["canary"]["state"] == "rolled_back"
    assert status["canary"]["reason"] == "version 2 stopped serving (unloaded or failed)"
    assert status["weights"] == {"1": 100}


async def test_traffic_json_applies_when_the_model_comes_up(
    path: InferencePath, tmp_path: Path
) -> None:
    (tmp_path / "traffic.json").write_text(json.dumps({"weights": {"1": 1, "3": 1}}))
    path.traffic.settle("m")
    assert path.traffic.status("m")["weights"] == {"1": 1, "3": 1}
    path.traffic.delete("m")
    path.traffic.settle("m")  # a hot swap later: the file is not read again
    assert "m" not in path.traffic.policies


async def test_traffic_json_waits_for_a_version_still_loading(
    path: InferencePath, tmp_path: Path
) -> None:
    (tmp_path / "traffic.json").write_text(json.dumps({"weights": {"1": 1, "3": 1}}))
    versions = path.registry.models["m"].versions
    versions[3].state = ModelState.LOADING
    path.traffic.settle("m")
    assert "m" not in path.traffic.policies
    versions[3].state = ModelState.READY
    path.traffic.settle("m")
    assert path.traffic.status("m")["weights"] == {"1": 1, "3": 1}


async def test_a_bad_traffic_json_is_logged_and_ignored(
    path: InferencePath, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "traffic.json").write_text('{"weights": {"1": -1}}')
    path.traffic.settle("m")
    assert "m" not in path.traffic.policies
    assert "traffic.json ignored: traffic policy: weight of version '1' is negative" in caplog.text


async def test_shadow_answers_are_discarded_and_failures_counted(path: InferencePath) -> None:
    shadow = scheduler(path, 3)
    shadow.fail = True
    put(path, {"weights": {"1": 1}, "shadow": {"version": "3", "fraction": 1.0}})
    for _ in range(5):
        assert await answered(path) == "1"
    assert await answered(path, "2") == "2"  # a named request is not shadowed
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert shadow.seen == 5
    assert path.traffic.counts[("m", 3, "shadow")] == 5
    assert path.traffic.shadow.errors == {("m", 3): 5}


async def test_a_held_shadow_never_holds_the_client_and_overflow_is_dropped(
    path: InferencePath,
) -> None:
    shadow = scheduler(path, 3)
    shadow.hold = True
    path.traffic.shadow.max_inflight = 2
    put(path, {"weights": {"1": 1}, "shadow": {"version": "3", "fraction": 1.0}})
    for _ in range(4):
        assert await answered(path) == "1"  # answered while every shadow is held
        await asyncio.sleep(0)
    assert len(shadow.held) == 2 and path.traffic.shadow.errors == {("m", 3): 2}
    for future in shadow.held:
        future.set_result(None)
    await asyncio.sleep(0)
    assert path.traffic.shadow.inflight == 0


async def test_infer_nowait_routes_feeds_the_canary_and_shadows(path: InferencePath) -> None:
    """The path the model owner answers frontend processes by, without a task per request."""
    scheduler(path, 2).fail = True
    put(
        path,
        {
            "canary": {"baseline": "1", "candidate": "2", "steps": [50, 100], "min_requests": 1000},
            "shadow": {"version": "3", "fraction": 1.0},
        },
    )
    answers: list[str] = []
    for i in range(200):
        path.infer_nowait(
            request(key=f"user-{i}"),
            lambda response, error: answers.append(
                response.model_version if response is not None else type(error).__name__
            ),
        )
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(answers) == 200 and set(answers) == {"1", "InternalError"}
    canary = path.traffic.policies["m"].canary
    assert canary.window.served == canary.window.failed == answers.count("InternalError")
    # Every success is shadowed: sent, or dropped over the in-flight limit (all start at once).
    sent, dropped = path.traffic.counts[("m", 3, "shadow")], path.traffic.shadow.errors
    assert sent == path.traffic.shadow.max_inflight
    assert sent + dropped[("m", 3)] == answers.count("1")
    assert path.traffic.counts[("m", 2, "sticky")] == answers.count("InternalError")


async def test_infer_nowait_refusals_under_a_policy_are_answered(path: InferencePath) -> None:
    put(path, {"weights": {"1": 1}})
    errors: list[str] = []
    path.infer_nowait(request("9"), lambda response, error: errors.append(str(error)))
    path.exiting = True
    path.infer_nowait(request(), lambda response, error: errors.append(str(error)))
    assert errors == ["Request for unknown model: 'm' version 9 is not found", "Server exiting"]


async def test_the_gate_task_runs_and_stops(path: InferencePath) -> None:
    put(path, {"canary": {"baseline": "1", "candidate": "2"}})
    gate = path.traffic._gate
    assert gate is not None and not gate.done()
    await path.traffic.stop()
    assert gate.cancelled()


def test_metrics_families(path: InferencePath) -> None:
    path.traffic.count("m", 1, "split")
    path.traffic.transitions[("m", "rolled_back")] = 1
    path.traffic.shadow.errors[("m", 3)] = 2
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in path.traffic.collect()
        for s in family.samples
    }
    assert (
        samples[
            (
                "ascend_traffic_requests_total",
                (("model", "m"), ("route", "split"), ("version", "1")),
            )
        ]
        == 1
    )
    assert (
        samples[("ascend_canary_transitions_total", (("model", "m"), ("to", "rolled_back")))] == 1
    )
    assert samples[("ascend_shadow_errors_total", (("model", "m"), ("version", "3")))] == 2
