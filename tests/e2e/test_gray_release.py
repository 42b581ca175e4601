"""Gray release (issue 15) against a server subprocess with tritonclient over HTTP and gRPC:
the traffic API's shapes and errors, the split within binomial bounds, sticky keys across
protocols, a canary promoted and one rolled back, shadows that never touch the client's answer,
traffic.json at startup, and zero failed requests while weighted versions unload and load."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_repository import simple_config
from examples.variants import write_version
from harness.procutil import wait_for
from harness.serverproc import ServerProcess, running_server
from harness.testmodels import write_python_model

pytestmark = pytest.mark.e2e

ALL_VERSIONS = "\nversion_policy: { all { } }\n"
OFFSETS = {1: 100, 2: 200, 3: 300}  # simple version v answers INPUT0 + INPUT1 + 100 v

# Version 1 answers X + 1, version 2 fails every request, version 3 holds each request until
# the file `release` appears in the model directory (then answers X + 3).
PYVER_MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])
        self.release = os.path.join(args["model_repository"], "release")

    def execute(self, requests):
        if self.version == 2:
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("candidate is broken"))
                    for _ in requests]
        if self.version == 3:
            deadline = time.monotonic() + 60
            while not os.path.exists(self.release) and time.monotonic() < deadline:
                time.sleep(0.02)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            y = (x + self.version).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
"""
PYVER_CONFIG = """
name: "pyver"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
version_policy: { all { } }
"""


def build_repo(root: Path) -> Path:
    for name in ("simple", "filed"):
        for version, offset in OFFSETS.items():
            write_version(root / name, version, offset)
        (root / name / "config.pbtxt").write_text(simple_config(name, 8) + ALL_VERSIONS)
    (root / "filed" / "traffic.json").write_text(
        json.dumps({"weights": {"1": 3, "2": 1}, "shadow": {"version": "3", "fraction": 0.5}})
    )
    write_python_model(root, "pyver", PYVER_MODEL, PYVER_CONFIG)
    for version in (2, 3):
        (root / "pyver" / str(version)).mkdir()
        (root / "pyver" / str(version) / "model.py").write_text(
            (root / "pyver" / "1" / "model.py").read_text()
        )
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = build_repo(tmp_path_factory.mktemp("gray") / "repo")
    with running_server([root], log_dir=root.parent) as process:
        process.repo = root  # type: ignore[attr-defined]
        yield process


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


@pytest.fixture
def grpc(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def traffic(
    server: ServerProcess, model: str, method: str = "GET", body: object = None
) -> httpx.Response:
    return httpx.request(
        method,
        f"{server.base}/v2/models/{model}/traffic",
        timeout=10,
        content=None if body is None else json.dumps(body),
    )


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    text = httpx.get(server.metrics_url, timeout=10).text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{name}\{{{re.escape(wanted)}\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def simple_inputs(module, start: int = 0) -> list:  # type: ignore[no-untyped-def]
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(np.arange(start, start + 16, dtype=np.int32).reshape(1, 16))
    inputs[1].set_data_from_numpy(np.ones((1, 16), np.int32))
    return inputs


def simple_version(result, start: int = 0) -> str:  # type: ignore[no-untyped-def]
    """The version that answered, checked against what its outputs say."""
    response = result.get_response()
    version = response["model_version"] if isinstance(response, dict) else response.model_version
    offset = int(result.as_numpy("OUTPUT0")[0, 0]) - (start + 1)
    assert offset == OFFSETS[int(version)], (version, offset)
    return version


def pyver_inputs(module, value: float = 1.0) -> list:  # type: ignore[no-untyped-def]
    x = module.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return [x]


# ----- the API ------------------------------------------------------------------------------
def test_the_traffic_api_shapes_errors_and_replace(server: ServerProcess) -> None:
    empty = {"model": "simple", "weights": None, "shadow": None, "canary": None}
    assert traffic(server, "simple").json() == empty
    policy = {
        "weights": {"1": 90, "2": 10},
        "shadow": {"version": "3", "fraction": 0.25},
        "canary": None,
    }
    reply = traffic(server, "simple", "PUT", policy)
    assert reply.status_code == 200 and reply.json() == {"model": "simple", **policy}
    refused = [
        ({"weights": {"1": -1}}, "traffic policy: weight of version '1' is negative (-1)"),
        ({"weights": {"1": 0, "2": 0}}, "traffic policy: 'weights' are all zero"),
        ({"weights": {"7": 1}}, "traffic policy for model 'simple': version '7' is not READY"),
        (
            {"shadow": {"version": "3", "fraction": 1.5}},
            "traffic policy: shadow 'fraction' must be a number in [0, 1], got 1.5",
        ),
        ({"weights": {"1": 1}, "colour": "blue"}, "traffic policy: unknown key 'colour'"),
        (
            {"canary": {"baseline": "1", "candidate": "2", "step": 1}},
            "canary 'step' is reported by the server and cannot be set",
        ),
    ]
    for body, message in refused:
        reply = traffic(server, "simple", "PUT", body)
        assert reply.status_code == 400 and message in reply.json()["error"], reply.text
        assert traffic(server, "simple").json() == {"model": "simple", **policy}
    reply = httpx.put(f"{server.base}/v2/models/simple/traffic", content=b"{not json", timeout=10)
    assert reply.status_code == 400 and "error" in reply.json()
    for method in ("GET", "PUT", "DELETE"):
        reply = traffic(server, "nope", method, {} if method == "PUT" else None)
        assert reply.status_code == 404
        assert reply.json() == {"error": "Request for unknown model: 'nope' is not found"}
    # PUT replaces the whole policy: what is left out is null afterwards.
    assert traffic(server, "simple", "PUT", {"weights": {"2": 1}}).json() == {
        "model": "simple",
        "weights": {"2": 1},
        "shadow": None,
        "canary": None,
    }
    assert traffic(server, "simple", "DELETE").status_code == 200
    assert traffic(server, "simple", "DELETE").status_code == 200  # none set: still 200
    assert traffic(server, "simple").json() == empty


def test_traffic_json_holds_from_startup(
    server: ServerProcess, http: httpclient.InferenceServerClient
) -> None:
    assert traffic(server, "filed").json() == {
        "model": "filed",
        "weights": {"1": 3, "2": 1},
        "shadow": {"version": "3", "fraction": 0.5},
        "canary": None,
    }
    seen = {simple_version(http.infer("filed", simple_inputs(httpclient))) for _ in range(40)}
    assert seen == {"1", "2"}


# ----- routing ------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_split_is_within_binomial_bounds_and_a_named_version_wins(
    server: ServerProcess, protocol: str, request: pytest.FixtureRequest
) -> None:
    client = request.getfixturevalue(protocol)
    module = httpclient if protocol == "http" else grpcclient
    traffic(server, "simple", "PUT", {"weights": {"1": 80, "2": 20, "3": 0}})
    try:
        n = 400
        before = metric(
            server, "ascend_traffic_requests_total", model="simple", version="2", route="split"
        )
        named_before = metric(
            server, "ascend_traffic_requests_total", model="simple", version="3", route="named"
        )
        versions = [
            simple_version(client.infer("simple", simple_inputs(module, i)), i) for i in range(n)
        ]
        twos = versions.count("2")
        # Binomial(400, 0.2): mean 80, standard deviation 8; five of them either side.
        assert versions.count("3") == 0 and abs(twos - 80) <= 40, twos
        assert (
            metric(
                server, "ascend_traffic_requests_total", model="simple", version="2", route="split"
            )
            - before
            == twos
        )
        named = client.infer("simple", simple_inputs(module), model_version="3")
        assert simple_version(named) == "3"
        assert (
            metric(
                server, "ascend_traffic_requests_total", model="simple", version="3", route="named"
            )
            == named_before + 1
        )
    finally:
        traffic(server, "simple", "DELETE")
    assert simple_version(client.infer("simple", simple_inputs(module))) == "3"


def test_a_key_lands_on_one_version_whatever_the_protocol(
    server: ServerProcess,
    http: httpclient.InferenceServerClient,
    grpc: grpcclient.InferenceServerClient,
) -> None:
    traffic(server, "simple", "PUT", {"weights": {"1": 50, "2": 50}})
    try:
        keys = [f"user-{i}" for i in range(40)]
        over_http = {
            key: simple_version(
                http.infer("simple", simple_inputs(httpclient), parameters={"traffic_key": key})
            )
            for key in keys
        }
        over_grpc = {
            key: simple_version(
                grpc.infer("simple", simple_inputs(grpcclient), parameters={"traffic_key": key})
            )
            for key in keys
        }
        raw_json = {
            key: httpx.post(
                f"{server.base}/v2/models/simple/infer",
                timeout=10,
                json={
                    "inputs": [
                        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [0] * 16},
                        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                    ],
                    "parameters": {"traffic_key": key},
                },
            ).json()["model_version"]
            for key in keys
        }
        assert over_http == over_grpc == raw_json
        assert set(over_http.values()) == {"1", "2"}
        assert (
            metric(
                server, "ascend_traffic_requests_total", model="simple", version="1", route="sticky"
            )
            > 0
        )
    finally:
        traffic(server, "simple", "DELETE")


# ----- canary -------------------------------------------------------------------------------
def test_a_healthy_candidate_is_promoted(
    server: ServerProcess, grpc: grpcclient.InferenceServerClient
) -> None:
    canary = {
        "baseline": "1",
        "candidate": "2",
        "steps": [30, 100],
        "step_seconds": 0.3,
        "min_requests": 10,
        "max_error_rate": 0.0,
        "max_p99_ms": 60000.0,
    }
    status = traffic(server, "simple", "PUT", {"canary": canary}).json()
    assert status["weights"] == {"1": 70, "2": 30}
    assert status["canary"] == {**canary, "state": "running", "step": 0, "reason": ""}
    try:

        def promoted() -> bool:
            for _ in range(10):
                simple_version(grpc.infer("simple", simple_inputs(grpcclient)))
            return traffic(server, "simple").json()["canary"]["state"] == "promoted"

        wait_for(promoted, "the canary to be promoted", timeout=120)
        status = traffic(server, "simple").json()
        assert status["weights"] == {"2": 100} and status["canary"]["step"] == 1
        assert {
            simple_version(grpc.infer("simple", simple_inputs(grpcclient))) for _ in range(20)
        } == {"2"}
        assert metric(server, "ascend_canary_transitions_total", model="simple", to="step") == 1
        assert metric(server, "ascend_canary_transitions_total", model="simple", to="promoted") == 1
        assert "model 'simple': canary promoted: version 2 now takes all traffic" in server.log()
    finally:
        traffic(server, "simple", "DELETE")


def test_a_failing_candidate_is_rolled_back(
    server: ServerProcess, http: httpclient.InferenceServerClient
) -> None:
    canary = {
        "baseline": "1",
        "candidate": "2",
        "steps": [50, 100],
        "step_seconds": 3600,
        "min_requests": 10,
        "max_error_rate": 0.1,
    }
    traffic(server, "pyver", "PUT", {"canary": canary})
    try:
        failed = 0

        def rolled_back() -> bool:
            nonlocal failed
            try:
                result = http.infer("pyver", pyver_inputs(httpclient))
                assert result.get_response()["model_version"] == "1"
            except InferenceServerException as exc:
                assert "candidate is broken" in str(exc)
                failed += 1
            return traffic(server, "pyver").json()["canary"]["state"] == "rolled_back"

        wait_for(rolled_back, "the canary to roll back", timeout=60, interval=0.0)
        assert failed >= 10  # every failed answer counted towards min_requests
        status = traffic(server, "pyver").json()
        assert status["weights"] == {"1": 100}
        assert status["canary"]["reason"].startswith("error rate 1.0000 > max_error_rate 0.1")
        for _ in range(20):
            result = http.infer("pyver", pyver_inputs(httpclient, 5.0))
            assert result.as_numpy("Y").tolist() == [6.0]
        assert (
            metric(server, "ascend_canary_transitions_total", model="pyver", to="rolled_back") == 1
        )
        assert "model 'pyver': canary rolled back: all traffic back on version 1" in server.log()
    finally:
        traffic(server, "pyver", "DELETE")


# ----- shadow -------------------------------------------------------------------------------
def test_a_failing_shadow_changes_nothing_for_the_client(
    server: ServerProcess, grpc: grpcclient.InferenceServerClient
) -> None:
    traffic(
        server, "pyver", "PUT", {"weights": {"1": 1}, "shadow": {"version": "2", "fraction": 1.0}}
    )
    try:
        for i in range(10):
            result = grpc.infer("pyver", pyver_inputs(grpcclient, float(i)))
            assert result.get_response().model_version == "1"
            assert result.as_numpy("Y").tolist() == [i + 1.0]
        wait_for(
            lambda: metric(server, "ascend_shadow_errors_total", model="pyver", version="2") == 10,
            "ten shadow failures counted",
        )
        assert (
            metric(
                server, "ascend_traffic_requests_total", model="pyver", version="2", route="shadow"
            )
            == 10
        )
    finally:
        traffic(server, "pyver", "DELETE")


def test_a_stuck_shadow_never_holds_the_client(
    server: ServerProcess, http: httpclient.InferenceServerClient
) -> None:
    release = server.repo / "pyver" / "release"  # type: ignore[attr-defined]
    traffic(
        server, "pyver", "PUT", {"weights": {"1": 1}, "shadow": {"version": "3", "fraction": 1.0}}
    )
    try:
        for i in range(8):
            result = http.infer("pyver", pyver_inputs(httpclient, float(i)))
            assert result.get_response()["model_version"] == "1"
            assert result.as_numpy("Y").tolist() == [i + 1.0]
        # Every client answer came back while version 3 had not finished a single shadow.
        stats = http.get_inference_statistics("pyver", "3")["model_stats"][0]
        assert stats["inference_count"] == 0
        assert (
            metric(
                server, "ascend_traffic_requests_total", model="pyver", version="3", route="shadow"
            )
            == 8
        )
    finally:
        release.write_text("go")
        traffic(server, "pyver", "DELETE")
    wait_for(
        lambda: (
            http.get_inference_statistics("pyver", "3")["model_stats"][0]["inference_count"] == 8
        ),
        "the shadows to finish once released",
    )
    assert metric(server, "ascend_shadow_errors_total", model="pyver", version="3") == 0


# ----- versions coming and going ------------------------------------------------------------
SIMPLE_JSON = {
    "backend": "onnxruntime",
    "max_batch_size": 8,
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]},
        {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]},
    ],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]},
        {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [16]},
    ],
}


def load_versions(server: ServerProcess, *versions: int) -> None:
    config = {**SIMPLE_JSON, "version_policy": {"specific": {"versions": list(versions)}}}
    reply = httpx.post(
        f"{server.base}/v2/repository/models/simple/load",
        timeout=60,
        json={"parameters": {"config": json.dumps(config)}},
    )
    assert reply.status_code == 200, reply.text


def test_zero_failed_requests_while_weighted_versions_unload_and_load(tmp_path: Path) -> None:
    root = build_repo(tmp_path / "repo")
    args = ["--model-control-mode", "explicit", "--load-model", "simple"]
    with running_server([root], args, log_dir=tmp_path) as server:
        traffic(server, "simple", "PUT", {"weights": {"1": 50, "2": 50, "3": 0}})
        stop = threading.Event()
        outcomes: list[tuple[int, str]] = []

        def client(index: int) -> None:
            with httpx.Client(timeout=30) as session:
                n = 0
                while not stop.is_set():
                    n += 1
                    reply = session.post(
                        f"{server.base}/v2/models/simple/infer",
                        json={
                            "inputs": [
                                {
                                    "name": "INPUT0",
                                    "shape": [1, 16],
                                    "datatype": "INT32",
                                    "data": [0] * 16,
                                },
                                {
                                    "name": "INPUT1",
                                    "shape": [1, 16],
                                    "datatype": "INT32",
                                    "data": [1] * 16,
                                },
                            ],
                            "parameters": {"traffic_key": f"c{index}-{n % 7}"},
                        },
                    )
                    outcomes.append(
                        (
                            reply.status_code,
                            reply.json().get("model_version", "")
                            if reply.status_code == 200
                            else reply.text,
                        )
                    )

        threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: len(outcomes) > 30, "traffic to flow")
            load_versions(server, 1, 3)  # version 2 unloads: its weight drops out
            wait_for(
                lambda: traffic(server, "simple").json()["weights"] == {"1": 50, "3": 0},
                "version 2's weight to drop out",
            )
            mark = len(outcomes)
            wait_for(lambda: len(outcomes) > mark + 30, "more traffic")
            assert {v for _, v in outcomes[mark + 3 :]} == {"1"}
            load_versions(server, 1, 2, 3)  # a hot swap of the others: the policy stays
            assert traffic(server, "simple").json()["weights"] == {"1": 50, "3": 0}
            traffic(server, "simple", "PUT", {"weights": {"2": 1}})
            load_versions(server, 3)  # no weighted version left: the version policy routes
            wait_for(
                lambda: traffic(server, "simple").json()["weights"] is None,
                "the last weight to drop out",
            )
            mark = len(outcomes)
            wait_for(lambda: len(outcomes) > mark + 30, "more traffic")
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert [o for o in outcomes if o[0] != 200] == []
        assert {v for _, v in outcomes[mark + 3 :]} == {"3"}
        assert "model 'simple': traffic weights of version(s) 2 dropped" in server.log()


# ----- gRPC: ascend.traffic.v1.TrafficService -------------------------------------------------
def test_the_traffic_service_over_grpc(
    server: ServerProcess, grpc: grpcclient.InferenceServerClient
) -> None:
    import grpc as grpclib

    from protocol.proto import traffic_service_pb2 as tpb
    from protocol.proto.traffic_service_pb2_grpc import TrafficServiceStub

    with grpclib.insecure_channel(server.grpc_url) as channel:
        stub = TrafficServiceStub(channel)
        policy = tpb.TrafficPolicy(
            weights={"1": 50, "2": 50}, shadow=tpb.Shadow(version="3", fraction=0.5)
        )
        reply = stub.SetTraffic(tpb.SetTrafficRequest(model="simple", policy=policy))
        assert dict(reply.weights) == {"1": 50, "2": 50} and reply.shadow.fraction == 0.5
        assert traffic(server, "simple").json() == {
            "model": "simple",
            "weights": {"1": 50, "2": 50},
            "shadow": {"version": "3", "fraction": 0.5},
            "canary": None,
        }
        # A key set over gRPC's API routes the same for HTTP and gRPC inference.
        key = {"traffic_key": "user-7"}
        assert (
            simple_version(grpc.infer("simple", simple_inputs(grpcclient), parameters=key))
            == httpx.post(
                f"{server.base}/v2/models/simple/infer",
                timeout=10,
                json={
                    "inputs": [
                        {"name": n, "shape": [1, 16], "datatype": "INT32", "data": [0] * 16}
                        for n in ("INPUT0", "INPUT1")
                    ],
                    "parameters": key,
                },
            ).json()["model_version"]
        )
        with pytest.raises(grpclib.RpcError) as refused:
            stub.SetTraffic(
                tpb.SetTrafficRequest(model="simple", policy=tpb.TrafficPolicy(weights={"1": -1}))
            )
        assert refused.value.code() == grpclib.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == "traffic policy: weight of version '1' is negative (-1)"
        with pytest.raises(grpclib.RpcError) as unknown:
            stub.GetTraffic(tpb.TrafficRequest(model="nope"))
        assert unknown.value.code() == grpclib.StatusCode.NOT_FOUND
        canary = tpb.Canary(
            baseline="1", candidate="2", steps=[50, 100], step_seconds=3600, no_latency_gate=True
        )
        reply = stub.SetTraffic(
            tpb.SetTrafficRequest(model="simple", policy=tpb.TrafficPolicy(canary=canary))
        )
        assert dict(reply.weights) == {"1": 50, "2": 50} and not reply.HasField("shadow")
        assert reply.canary.state == "running" and reply.canary.min_requests == 50
        assert traffic(server, "simple").json()["canary"]["max_p99_ms"] is None
        reply = stub.DeleteTraffic(tpb.TrafficRequest(model="simple"))
        assert not reply.weights and not reply.HasField("canary")


# ----- several frontend processes: the owner routes, every process answers the same -----------
def test_policies_with_frontend_processes(tmp_path: Path) -> None:
    root = build_repo(tmp_path / "repo")
    with running_server([root], ["--frontend-processes", "2"], log_dir=tmp_path) as server:
        policy = {
            "weights": {"1": 50, "2": 50},
            "shadow": {"version": "3", "fraction": 1.0},
            "canary": None,
        }
        reply = traffic(server, "simple", "PUT", {k: v for k, v in policy.items() if v})
        assert reply.status_code == 200 and reply.json() == {"model": "simple", **policy}
        # Fresh connections land on different processes; each reads the owner's policy.
        for _ in range(12):
            assert traffic(server, "simple").json() == {"model": "simple", **policy}
            reply = traffic(server, "simple", "PUT", {"weights": {"1": -1}})
            assert reply.status_code == 400
            assert reply.json() == {
                "error": "traffic policy: weight of version '1' is negative (-1)"
            }
            assert traffic(server, "nope").status_code == 404
        body = {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32", "data": [0] * 16}
                for n in ("INPUT0", "INPUT1")
            ]
        }
        for i in range(20):
            key = {"traffic_key": f"user-{i}"}
            answers = {
                httpx.post(
                    f"{server.base}/v2/models/simple/infer",
                    timeout=10,
                    json={**body, "parameters": key},
                ).json()["model_version"]
                for _ in range(4)
            }
            with grpcclient.InferenceServerClient(server.grpc_url) as client:
                answers.add(
                    simple_version(
                        client.infer("simple", simple_inputs(grpcclient), parameters=key)
                    )
                )
            assert len(answers) == 1
        split = sum(
            metric(
                server, "ascend_traffic_requests_total", model="simple", version=v, route="sticky"
            )
            for v in ("1", "2")
        )
        assert split == 100
        wait_for(
            lambda: (
                metric(
                    server,
                    "ascend_traffic_requests_total",
                    model="simple",
                    version="3",
                    route="shadow",
                )
                == 100
            ),
            "a shadow of each request",
        )
        assert traffic(server, "simple", "DELETE").status_code == 200


def test_a_version_removed_in_poll_mode_drops_out_and_a_new_one_gets_nothing(
    tmp_path: Path,
) -> None:
    import shutil

    root = build_repo(tmp_path / "repo")
    poll = [
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "0.2",
        "--repository-settle-secs",
        "0",
    ]
    with (
        running_server([root], poll, log_dir=tmp_path) as server,
        httpclient.InferenceServerClient(server.http_url) as client,
    ):
        traffic(server, "simple", "PUT", {"weights": {"1": 1, "2": 3}})
        shutil.rmtree(root / "simple" / "2")
        wait_for(
            lambda: traffic(server, "simple").json()["weights"] == {"1": 1},
            "version 2's weight to drop out",
        )
        write_version(root / "simple", 4, 400, config=False)
        wait_for(
            lambda: (
                httpx.post(f"{server.base}/v2/repository/index", timeout=10)
                .json()
                .count({"name": "simple", "version": "4", "state": "READY"})
                == 1
            ),
            "version 4 to load",
        )
        # The policy still routes everything to version 1; 4 answers only when named.
        assert {
            client.infer("simple", simple_inputs(httpclient)).get_response()["model_version"]
            for _ in range(20)
        } == {"1"}
        assert (
            client.infer("simple", simple_inputs(httpclient), model_version="4").get_response()[
                "model_version"
            ]
            == "4"
        )
