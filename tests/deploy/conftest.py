"""tests/deploy: the deployment files checked offline (no cluster, no docker daemon), and one
real server started the way the image and the chart start it."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import httpx
import pytest

# om_fixtures (the pyACL emulator's model files) lives with the NPU tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "npu"))

import om_fixtures as omf  # noqa: E402
from entrypoint import console_script, entrypoint_env, fake_cann, start_entrypoint  # noqa: E402
from examples.build_repository import build_simple  # noqa: E402
from manifests import chart_manifests, chart_values, one  # noqa: E402
from procutil import wait_for  # noqa: E402
from serverproc import ServerProcess, free_port  # noqa: E402

CHART_PORTS = {"--http-port": "http", "--grpc-port": "grpc", "--metrics-port": "metrics"}


def chart_args(repository: Path, ports: dict[str, int]) -> list[str]:
    """The chart's container args (Ascend values) with the repository and ports swapped for
    this machine's, and the listeners on 127.0.0.1."""
    pod = one(chart_manifests(chart_values("values-ascend.yaml")), "Deployment")
    args = []
    for arg in pod["spec"]["template"]["spec"]["containers"][0]["args"]:
        flag = arg.split("=", 1)[0]
        if flag == "--model-repository":
            arg = f"{flag}={repository}"
        elif flag in CHART_PORTS:
            arg = f"{flag}={ports[CHART_PORTS[flag]]}"
        args.append(arg)
    return args + ["--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                   "--metrics-address=127.0.0.1"]


@pytest.fixture(scope="module")
def entrypoint_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The Ascend image's start, run directly: entrypoint.sh (variant ascend) sources a stand-in
    set_env.sh and execs the console script with the chart's args; the repository holds an ONNX
    model and an Ascend model (on the emulator), each asked once so every series exists."""
    root = tmp_path_factory.mktemp("entrypoint")
    repo = root / "models"
    build_simple(repo)
    omf.write_model_repository(repo, "npu_scale", max_queue_delay_us=100)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    console_script(bin_dir)
    env = entrypoint_env(bin_dir, "ascend", fake_cann(root / "Ascend"))
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    process = start_entrypoint(chart_args(repo, ports), env, root / "server.log")
    server = ServerProcess(process, ports["http"], ports["grpc"], ports["metrics"],
                           root / "server.log")

    def ready() -> bool:
        assert server.alive(), f"server exited:\n{server.log()}"
        try:
            return httpx.get(server.base + "/v2/health/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, "the entrypoint's server to be ready", timeout=60, interval=0.1)
        for model, inputs in (
                ("simple", [{"name": f"INPUT{i}", "shape": [1, 16], "datatype": "INT32",
                             "data": list(range(16))} for i in (0, 1)]),
                ("npu_scale", [{"name": "INPUT0", "shape": [2, 4], "datatype": "FP32",
                                "data": [1.0] * 8}])):
            response = httpx.post(f"{server.base}/v2/models/{model}/infer",
                                  json={"inputs": inputs}, timeout=10)
            assert response.status_code == 200, response.text
        yield server
    finally:
        server.stop()
