"""tests/deploy: the deployment files checked offline (no cluster, no docker daemon), and one
real server started the way the image and the chart start it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from examples.build_repository import build_simple
from harness.procutil import wait_for
from harness.serverproc import ServerProcess, free_port
from tests.deploy.entrypoint import console_script, entrypoint_env, fake_cann, start_entrypoint
from tests.deploy.manifests import chart_manifests, chart_values, one
from tests.support import om_fixtures as omf


def pytest_itemcollected(item: pytest.Item) -> None:
    """Every test in tests/deploy is marked `e2e`: the folder belongs with the server it starts
    the image's way. Called only for items under this folder."""
    item.add_marker(pytest.mark.e2e)


CHART_PORTS = {"--http-port": "http", "--grpc-port": "grpc", "--metrics-port": "metrics"}


def chart_args(repository: Path, ports: dict[str, int]) -> list[str]:
    """The chart's container args (Ascend values) with the repository and ports swapped for
    this machine's, the listeners on 127.0.0.1, and no room for shadow copies (so that they
    are counted as dropped)."""
    pod = one(chart_manifests(chart_values("values-ascend.yaml")), "Deployment")
    args = []
    for arg in pod["spec"]["template"]["spec"]["containers"][0]["args"]:
        flag = arg.split("=", 1)[0]
        if flag == "--model-repository":
            arg = f"{flag}={repository}"
        elif flag in CHART_PORTS:
            arg = f"{flag}={ports[CHART_PORTS[flag]]}"
        args.append(arg)
    return args + [
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--traffic-shadow-max-inflight=0",
    ]


SIMPLE_INPUTS = [
    {"name": f"INPUT{i}", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
    for i in (0, 1)
]
# No latency gate: a loaded machine must not roll the canary back.
CANARY = {
    "baseline": "1",
    "candidate": "2",
    "steps": [50, 100],
    "step_seconds": 0.05,
    "min_requests": 1,
    "max_p99_ms": None,
}


def infer(base: str, model: str, inputs: list[dict]) -> None:
    response = httpx.post(f"{base}/v2/models/{model}/infer", json={"inputs": inputs}, timeout=10)
    assert response.status_code == 200, response.text


def traffic(base: str, policy: dict) -> dict:
    response = httpx.put(f"{base}/v2/models/simple/traffic", json=policy, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def exercise_gray_release(base: str) -> None:
    """A canary of simple's version 2 that promotes itself, then a 50/50 split with a shadow
    whose copies the server drops (--traffic-shadow-max-inflight=0): every traffic series the
    dashboard reads gets a sample."""
    traffic(base, {"canary": CANARY})

    def promoted() -> bool:
        infer(base, "simple", SIMPLE_INPUTS)
        state = httpx.get(f"{base}/v2/models/simple/traffic", timeout=10).json()["canary"]
        return state["state"] == "promoted"

    wait_for(promoted, "the canary to promote itself", timeout=30, interval=0.02)
    traffic(base, {"weights": {"1": 50, "2": 50}, "shadow": {"version": "1", "fraction": 1.0}})
    infer(base, "simple", SIMPLE_INPUTS)


@pytest.fixture(scope="module")
def entrypoint_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The Ascend image's start, run directly: entrypoint.sh (variant ascend) sources a stand-in
    set_env.sh and execs the console script with the chart's args; the repository holds an ONNX
    model in two versions under a traffic policy and an Ascend model (on the emulator), each
    asked once so that their series exist."""
    root = tmp_path_factory.mktemp("entrypoint")
    repo = root / "models"
    simple = build_simple(repo)  # two versions, split by a traffic policy below
    shutil.copytree(simple / "1", simple / "2")
    with open(simple / "config.pbtxt", "a") as config:
        config.write("\nversion_policy: { all { } }\n")
    omf.write_model_repository(repo, "npu_scale", max_queue_delay_us=100)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    console_script(bin_dir)
    env = entrypoint_env(bin_dir, "ascend", fake_cann(root / "Ascend"))
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    process = start_entrypoint(chart_args(repo, ports), env, root / "server.log")
    server = ServerProcess(
        process, ports["http"], ports["grpc"], ports["metrics"], root / "server.log"
    )

    def ready() -> bool:
        assert server.alive(), f"server exited:\n{server.log()}"
        try:
            return httpx.get(server.base + "/v2/health/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, "the entrypoint's server to be ready", timeout=60, interval=0.1)
        exercise_gray_release(server.base)
        for model, inputs in (
            ("simple", SIMPLE_INPUTS),
            (
                "npu_scale",
                [{"name": "INPUT0", "shape": [2, 4], "datatype": "FP32", "data": [1.0] * 8}],
            ),
        ):
            infer(server.base, model, inputs)
        yield server
    finally:
        server.stop()
