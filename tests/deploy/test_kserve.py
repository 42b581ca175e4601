"""The KServe ClusterServingRuntime and example InferenceServices: valid against KServe's CRD
schemas (v0.20.0, committed in tests/deploy/crds), and a command line the server accepts."""

from __future__ import annotations

import hashlib

import pytest

from server.cli import build_parser
from tests.deploy.manifests import CRDS, KSERVE, crd_sources, file_manifests, one, validation_errors

RUNTIME = KSERVE / "cluster-serving-runtime.yaml"
EXAMPLES = sorted(KSERVE.glob("inferenceservice-*.yaml"))


def runtime() -> dict:
    return one(file_manifests([RUNTIME]), "ClusterServingRuntime")


def test_committed_crds_are_the_recorded_upstream_files():
    sources = crd_sources()["files"]
    assert sorted(sources) == sorted(p.name for p in CRDS.glob("*.yaml"))
    for name, source in sources.items():
        data = (CRDS / name).read_bytes()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        assert blob == source["git_blob_sha1"], f"{name} differs from {source['tag']}"


@pytest.mark.parametrize("path", [RUNTIME, *EXAMPLES], ids=lambda p: p.name)
def test_validates_against_kserve_crd_schemas(path):
    manifests = file_manifests([path])
    assert manifests
    assert [e for m in manifests for e in validation_errors(m, "1.37.0")] == []


def test_runtime_serves_the_three_formats_over_v2():
    spec = runtime()["spec"]
    assert {f["name"] for f in spec["supportedModelFormats"]} == {"onnx", "triton", "ascend-om"}
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(
        build_parser().parse_args(["--model-repository", "/m"]).metrics_port
    )


def test_runtime_command_line_parses_with_the_servers_cli():
    container = one([{"kind": "c", **c} for c in runtime()["spec"]["containers"]], "c")
    assert container["name"] == "kserve-container"  # the name KServe merges the model into
    args = build_parser().parse_args(container["args"])
    assert [str(p) for p in args.model_repositories] == ["/mnt/models"]  # storage initializer
    assert (args.http_port, args.grpc_port) == (8080, 9000)  # KServe's ports
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert container["securityContext"]["runAsNonRoot"] is True


def test_an_example_for_each_format_and_a_canary():
    services = file_manifests(EXAMPLES)
    formats = {s["spec"]["predictor"]["model"]["modelFormat"]["name"] for s in services}
    assert formats == {"onnx", "triton", "ascend-om"}
    for service in services:
        model = service["spec"]["predictor"]["model"]
        assert model["runtime"] == runtime()["metadata"]["name"]
        assert model["protocolVersion"] in runtime()["spec"]["protocolVersions"]
        # KServe appends the model's args to the runtime's: the whole line must parse.
        build_parser().parse_args(
            runtime()["spec"]["containers"][0]["args"] + model.get("args", [])
        )
    canary = [s for s in services if "canaryTrafficPercent" in s["spec"]["predictor"]]
    assert len(canary) == 1 and canary[0]["spec"]["predictor"]["canaryTrafficPercent"] == 10
    stable = [
        s
        for s in services
        if s["metadata"]["name"] == canary[0]["metadata"]["name"] and s is not canary[0]
    ]
    assert len(stable) == 1  # the canary updates an example above it
    mode = "serving.kserve.io/deploymentMode"
    assert (
        stable[0]["metadata"]["annotations"][mode]
        == canary[0]["metadata"]["annotations"][mode]
        == "Serverless"
    )  # canaryTrafficPercent needs Knative revisions


def test_ascend_example_requests_an_npu_and_mounts_the_driver():
    service = one(file_manifests([KSERVE / "inferenceservice-ascend-om.yaml"]), "InferenceService")
    predictor = service["spec"]["predictor"]
    for side in ("limits", "requests"):
        assert predictor["model"]["resources"][side]["huawei.com/Ascend910"] == "1"
    volumes = {v["name"]: v["hostPath"]["path"] for v in predictor["volumes"]}
    assert volumes["ascend-driver"] == "/usr/local/Ascend/driver"
    assert {m["name"] for m in predictor["model"]["volumeMounts"]} == set(volumes)
