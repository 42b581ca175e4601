"""The Ascend backend end to end: a real server subprocess whose `import acl` is the pyACL
emulator, driven with tritonclient.http, tritonclient.grpc and raw httpx.

One server per scenario, shared by the tests of that scenario (module-scoped fixtures):

- `main_server`: a dynamic-batch `.om` model (gears 4,1,8,2, dynamic batching) on NPU 0 with a
  poison input value that makes its execution fail, a model on NPU 1 whose first
  `acl.mdl.execute_async` is an injected fault, and the ONNX `simple` example.
- `lost_server`: an NPU model whose poison input loses its device (NPU 1), another NPU model
  on NPU 0 and `simple`; strict readiness (the default).
- `broken_server`: `--exit-on-error false` with NPU models that cannot load (missing `.om`, a
  max_batch_size no gear holds, out of device memory, a faulty NPU) beside a good NPU model
  and `simple`.
- `plain_server`: no emulator on PYTHONPATH (no CANN), an NPU model and `simple`.

The last test stops the emulator servers and reads the emulator's leak report (ACL_EMU_REPORT).
"""

from __future__ import annotations

import json
import queue
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_repository import build_simple
from harness.serverproc import ServerProcess, running_server
from tests.support import om_fixtures as omf

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
FEATURES = 4
GEARS = (4, 1, 8, 2)  # as compiled: unsorted on purpose
SCALE, BIAS = 2.0, 1.0  # om_fixtures.scale_model defaults: OUTPUT0 = x * 2 + 1, OUTPUT1 = row sums
EXECUTE_POISON = -7.0  # an input holding this fails execution with 507011
LOST_POISON = -9.0  # an input holding this loses the device (507010)
DEVICE_MEMORY = 1 << 26  # 64 MiB per emulated NPU in the main server
WEIGHTS = 1 << 20  # weight_size of the main server's NPU models
# Long enough that concurrent requests from the test always meet in one batch; requests that
# fill the largest gear go at once.
QUEUE_DELAY_US = 300_000
EXIT_ARGS = ["--exit-timeout-secs", "10"]


# ----- servers ------------------------------------------------------------------------------
def emulated(report: Path, **config) -> dict[str, str]:
    return omf.emulator_env({"PYTHONPATH": str(ROOT)}, config=config, report_path=report)


@pytest.fixture(scope="module")
def main_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("npu_main")
    repo = root / "models"
    omf.write_model_repository(
        repo,
        "npu_scale",
        gears=GEARS,
        gpus=(0,),
        max_queue_delay_us=QUEUE_DELAY_US,
        weight_size=WEIGHTS,
        poison={"value": EXECUTE_POISON, "code": 507011},
    )
    omf.write_model_repository(
        repo, "npu_flaky", gears=GEARS, gpus=(1,), dynamic_batching=False, weight_size=WEIGHTS
    )
    build_simple(repo)
    env = emulated(
        root / "acl_report.json",
        device_count=2,
        memory_bytes=DEVICE_MEMORY,
        faults=[{"fn": "mdl.execute_async", "ret": 507011, "count": 1, "device": 1}],
    )
    with running_server([repo], EXIT_ARGS, env=env, log_dir=root) as server:
        server.report_path = root / "acl_report.json"  # type: ignore[attr-defined]
        yield server


@pytest.fixture(scope="module")
def lost_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("npu_lost")
    repo = root / "models"
    omf.write_model_repository(
        repo,
        "npu_lost",
        gears=GEARS,
        gpus=(1,),
        dynamic_batching=False,
        poison={"value": LOST_POISON, "code": 507010},
    )
    omf.write_model_repository(repo, "npu_other", gears=GEARS, gpus=(0,), dynamic_batching=False)
    build_simple(repo)
    env = emulated(root / "acl_report.json", device_count=2)
    with running_server([repo], EXIT_ARGS, env=env, log_dir=root) as server:
        server.report_path = root / "acl_report.json"  # type: ignore[attr-defined]
        yield server


@pytest.fixture(scope="module")
def broken_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("npu_broken")
    repo = root / "models"
    omf.write_model_repository(repo, "npu_ok", gears=GEARS, gpus=(0,), dynamic_batching=False)
    missing = omf.write_model_repository(repo, "npu_missing", gears=GEARS, gpus=(0,))
    (missing / "1" / "model.om").unlink()
    omf.write_model_repository(repo, "npu_bad_gear", gears=GEARS, gpus=(0,), max_batch_size=16)
    # Two instances on NPU 1, each needing 600 KiB of a 1 MiB device: the second cannot load.
    omf.write_model_repository(
        repo, "npu_oom", gears=GEARS, gpus=(1,), count=2, weight_size=600 << 10, work_size=0
    )
    omf.write_model_repository(repo, "npu_dead_device", gears=GEARS, gpus=(2,))
    build_simple(repo)
    env = emulated(root / "acl_report.json", device_count=3, memory_bytes=1 << 20, lost_devices=[2])
    # Models are loaded before the server goes live; strict readiness keeps it not ready.
    with running_server(
        [repo], [*EXIT_ARGS, "--exit-on-error", "false"], env=env, wait_ready=False, log_dir=root
    ) as server:
        server.report_path = root / "acl_report.json"  # type: ignore[attr-defined]
        yield server


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """No CANN: the emulator is not on PYTHONPATH, so `import acl` fails in the server."""
    root = tmp_path_factory.mktemp("npu_plain")
    repo = root / "models"
    omf.write_model_repository(repo, "npu_scale", gears=GEARS)
    build_simple(repo)
    env = {"PYTHONPATH": str(ROOT), "ACL_EMU_CONFIG": "", "ACL_EMU_REPORT": ""}
    with running_server(
        [repo], [*EXIT_ARGS, "--exit-on-error", "false"], env=env, wait_ready=False, log_dir=root
    ) as server:
        yield server


# ----- helpers ------------------------------------------------------------------------------
def rows(request: int, count: int) -> np.ndarray:
    """`count` distinct rows for request number `request` (never a poison value)."""
    return (
        np.arange(count * FEATURES, dtype=np.float32).reshape(count, FEATURES) + 100 * request + 1
    )


def check_scale(out0: np.ndarray, out1: np.ndarray, x: np.ndarray) -> None:
    """The request's own rows, in order, and no padding rows."""
    np.testing.assert_array_equal(out0, x * SCALE + BIAS)
    np.testing.assert_array_equal(out1, x.sum(axis=1, keepdims=True))


def http_input(x: np.ndarray, name: str = "INPUT0") -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    return tensor


def grpc_input(x: np.ndarray, name: str = "INPUT0") -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def json_infer(server: ServerProcess, model: str, x: np.ndarray) -> httpx.Response:
    body = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": list(x.shape),
                "datatype": "FP32",
                "data": x.ravel().tolist(),
            }
        ]
    }
    return httpx.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=30)


def check_simple_http(server: ServerProcess) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def check_simple_grpc(server: ServerProcess) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16) * 2
    b = np.full((1, 16), 5, np.int32)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def http_stats(server: ServerProcess, model: str) -> dict:
    response = httpx.get(f"{server.base}/v2/models/{model}/stats", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["model_stats"][0]


def batch_counts(stats: dict) -> dict[int, int]:
    """batch size -> executions, from HTTP or gRPC (as dict) statistics."""
    return {
        int(b["batch_size"]): int(b["compute_infer"].get("count", 0))
        for b in stats.get("batch_stats", [])
    }


def check_batched(before: dict, after: dict, sizes: list[int]) -> None:
    """The requests of one burst were batched: fewer executions than requests, every batch
    within the largest gear, and every row counted."""
    inferences = int(after["inference_count"]) - int(before.get("inference_count", 0))
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert inferences == sum(sizes)
    assert 1 <= executions < len(sizes) <= inferences
    old, new = batch_counts(before), batch_counts(after)
    ran = {
        size: count - old.get(size, 0) for size, count in new.items() if count > old.get(size, 0)
    }
    assert sum(ran.values()) == executions
    assert sum(size * count for size, count in ran.items()) == inferences
    assert all(1 <= size <= max(GEARS) for size in ran), ran


def index(server: ServerProcess, ready: bool = False) -> dict[str, dict]:
    response = httpx.post(
        f"{server.base}/v2/repository/index", json={"ready": True} if ready else {}, timeout=10
    )
    assert response.status_code == 200, response.text
    return {entry["name"]: entry for entry in response.json()}


def status(server: ServerProcess, path: str) -> int:
    return httpx.get(server.base + path, timeout=10).status_code


def metric(text: str, name: str, **labels: str) -> float:
    label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{name}\{{{re.escape(label_text)}\}} (\S+)$", text, re.MULTILINE)
    assert match, f"{name}{{{label_text}}} not in metrics:\n{text}"
    return float(match.group(1))


# ----- 1. inference, batching, metadata, statistics -----------------------------------------
def test_metadata_and_config_are_auto_completed(main_server: ServerProcess) -> None:
    metadata = httpx.get(f"{main_server.base}/v2/models/npu_scale", timeout=10).json()
    assert metadata["name"] == "npu_scale" and metadata["versions"] == ["1"]
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}]
    # ATC's `op:0:name` output names appear as plain names.
    assert metadata["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1, 1]},
    ]

    config = httpx.get(f"{main_server.base}/v2/models/npu_scale/config", timeout=10).json()
    assert config["backend"] == "ascend"
    assert config["max_batch_size"] == max(GEARS)
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [4])
    ]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [4]),
        ("OUTPUT1", "TYPE_FP32", [1]),
    ]
    assert config["parameters"]["batch_gears"]["string_value"] == "1,2,4,8"
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == QUEUE_DELAY_US

    with grpcclient.InferenceServerClient(main_server.grpc_url) as client:
        assert client.is_model_ready("npu_scale")
        grpc_meta = client.get_model_metadata("npu_scale", as_json=True)
        assert [
            (t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in grpc_meta["outputs"]
        ] == [("OUTPUT0", "FP32", [-1, 4]), ("OUTPUT1", "FP32", [-1, 1])]
        grpc_config = client.get_model_config("npu_scale").config
        assert grpc_config.max_batch_size == max(GEARS)
        assert [(i.name, list(i.dims)) for i in grpc_config.input] == [("INPUT0", [4])]
        assert grpc_config.parameters["batch_gears"].string_value == "1,2,4,8"


def test_http_concurrent_requests_are_batched_and_unpadded(main_server: ServerProcess) -> None:
    sizes = [1, 2, 1, 3]  # 7 rows: one batch, padded to gear 8 on the device
    inputs = [rows(i, n) for i, n in enumerate(sizes)]
    before = http_stats(main_server, "npu_scale")
    with httpclient.InferenceServerClient(main_server.http_url, concurrency=len(sizes)) as client:
        pending = [client.async_infer("npu_scale", [http_input(x)]) for x in inputs]
        results = [p.get_result() for p in pending]
    for x, result in zip(inputs, results, strict=False):
        check_scale(result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"), x)
    check_batched(before, http_stats(main_server, "npu_scale"), sizes)


def test_grpc_concurrent_requests_are_batched_and_unpadded(main_server: ServerProcess) -> None:
    sizes = [2, 1, 2, 1]  # 6 rows: one batch, padded to gear 8 on the device
    inputs = [rows(10 + i, n) for i, n in enumerate(sizes)]
    done: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(main_server.grpc_url) as client:
        before = client.get_inference_statistics("npu_scale", as_json=True)["model_stats"][0]
        for i, x in enumerate(inputs):
            client.async_infer(
                "npu_scale",
                [grpc_input(x)],
                callback=lambda result, error, i=i: done.put((i, result, error)),
            )
        answers = {}
        for _ in inputs:
            i, result, error = done.get(timeout=30)
            assert error is None, error
            answers[i] = result
        after = client.get_inference_statistics("npu_scale", as_json=True)["model_stats"][0]
    for i, x in enumerate(inputs):
        check_scale(answers[i].as_numpy("OUTPUT0"), answers[i].as_numpy("OUTPUT1"), x)
    check_batched(before, after, sizes)


def test_full_gear_and_requested_output_subset(main_server: ServerProcess) -> None:
    """A request that fills the largest gear alone, asking for one output only (raw httpx)."""
    x = rows(30, max(GEARS))
    body = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": list(x.shape),
                "datatype": "FP32",
                "data": x.ravel().tolist(),
            }
        ],
        "outputs": [{"name": "OUTPUT1"}],
    }
    response = httpx.post(f"{main_server.base}/v2/models/npu_scale/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    assert [(o["name"], o["shape"]) for o in outputs] == [("OUTPUT1", [8, 1])]
    np.testing.assert_array_equal(np.array(outputs[0]["data"], np.float32), x.sum(axis=1))
    # One row more than the largest gear is refused before it reaches the device.
    response = json_infer(main_server, "npu_scale", rows(31, max(GEARS) + 1))
    assert response.status_code == 400
    assert "batch-size must be <= 8" in response.json()["error"]


# ----- 2. execution errors --------------------------------------------------------------------
def test_failed_execution_fails_that_request_only(main_server: ServerProcess) -> None:
    bad = rows(40, 2)
    bad[1, 2] = EXECUTE_POISON
    response = json_infer(main_server, "npu_scale", bad)
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert "acl.rt.synchronize_stream_with_timeout failed with error 507011" in error
    assert "ACL_ERROR_RT_MODEL_EXECUTE" in error

    with grpcclient.InferenceServerClient(main_server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as failure:
            client.infer("npu_scale", [grpc_input(bad)])
        assert "507011" in failure.value.message()
        assert "acl.rt.synchronize_stream" in failure.value.message()
        # The next request succeeds, and the model stays ready.
        good = rows(41, 3)
        result = client.infer("npu_scale", [grpc_input(good)])
        check_scale(result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"), good)
        assert client.is_model_ready("npu_scale")
    assert status(main_server, "/v2/models/npu_scale/ready") == 200
    assert status(main_server, "/v2/health/ready") == 200


def test_injected_execute_fault_fails_one_request_then_serves(main_server: ServerProcess) -> None:
    """ACL_EMU_CONFIG makes the first acl.mdl.execute_async on NPU 1 fail with 507011."""
    x = rows(50, 3)
    with httpclient.InferenceServerClient(main_server.http_url) as client:
        with pytest.raises(InferenceServerException) as failure:
            client.infer("npu_flaky", [http_input(x)])
        message = failure.value.message()
        assert "acl.mdl.execute_async failed with error 507011" in message
        assert "ACL_ERROR_RT_MODEL_EXECUTE" in message
        result = client.infer("npu_flaky", [http_input(x)])
        check_scale(result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"), x)
        assert client.is_model_ready("npu_flaky")
    stats = http_stats(main_server, "npu_flaky")
    assert stats["inference_stats"]["fail"]["count"] == 1
    assert stats["inference_stats"]["success"]["count"] >= 1


# ----- 4. telemetry ---------------------------------------------------------------------------
def test_npu_telemetry_on_metrics_endpoint(main_server: ServerProcess) -> None:
    text = httpx.get(main_server.metrics_url, timeout=10).text
    for device in ("0", "1"):  # npu_scale holds NPU 0, npu_flaky NPU 1
        total = metric(text, "ascend_npu_memory_total_bytes", device=device)
        used = metric(text, "ascend_npu_memory_used_bytes", device=device)
        assert total == DEVICE_MEMORY
        assert WEIGHTS <= used < total  # at least the loaded model's weights
        aicore = metric(text, "ascend_npu_utilization", device=device, engine="aicore")
        assert 0.0 <= aicore <= 1.0
    assert 'device="2"' not in text


# ----- 2. device lost -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def device_lost(lost_server: ServerProcess) -> httpx.Response:
    """Everything ready, then a request whose execution loses NPU 1 under npu_lost."""
    assert status(lost_server, "/v2/health/ready") == 200
    assert status(lost_server, "/v2/models/npu_lost/ready") == 200
    poisoned = rows(60, 2)
    poisoned[0, 0] = LOST_POISON
    return json_infer(lost_server, "npu_lost", poisoned)


def test_device_fault_fails_the_request_with_the_pyacl_error(device_lost: httpx.Response) -> None:
    assert device_lost.status_code == 500, device_lost.text
    error = device_lost.json()["error"]
    assert "error 507010" in error and "ACL_ERROR_RT_LOST_HEARTBEAT" in error


def test_device_fault_takes_only_that_model_out_of_service(
    lost_server: ServerProcess, device_lost: httpx.Response
) -> None:
    assert status(lost_server, "/v2/models/npu_lost/ready") == 400
    assert status(lost_server, "/v2/health/ready") == 400  # strict readiness
    assert status(lost_server, "/v2/health/live") == 200
    with grpcclient.InferenceServerClient(lost_server.grpc_url) as client:
        assert not client.is_model_ready("npu_lost")
        assert not client.is_server_ready()
        assert client.is_server_live()
        # Further requests to the lost model fail instead of reaching the device.
        with pytest.raises(InferenceServerException) as failure:
            client.infer("npu_lost", [grpc_input(rows(61, 1))])
        assert failure.value.status() == "StatusCode.UNAVAILABLE"
        # The NPU model on the other device and the ONNX model keep serving.
        assert client.is_model_ready("npu_other") and client.is_model_ready("simple")
        x = rows(62, 3)
        result = client.infer("npu_other", [grpc_input(x)])
        check_scale(result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"), x)
    response = json_infer(lost_server, "npu_other", rows(63, 2))
    assert response.status_code == 200, response.text
    assert status(lost_server, "/v2/models/npu_other/ready") == 200
    check_simple_http(lost_server)
    check_simple_grpc(lost_server)
    # NPU telemetry keeps answering for the healthy device.
    text = httpx.get(lost_server.metrics_url, timeout=10).text
    assert metric(text, "ascend_npu_memory_used_bytes", device="0") > 0


def test_device_fault_shows_in_repository_index(
    lost_server: ServerProcess, device_lost: httpx.Response
) -> None:
    entries = index(lost_server)
    assert entries["npu_other"]["state"] == "READY"
    assert entries["simple"]["state"] == "READY"
    # The model answers not ready (and its requests 'not at ready state'); the index must say
    # so too, with the fault as the reason, and leave it out of the ready-only listing.
    lost = entries["npu_lost"]
    ready_only = index(lost_server, ready=True)
    problems = []
    if "507010" not in lost.get("reason", ""):
        problems.append(f"index entry without the device fault as its reason: {lost}")
    if "npu_lost" in ready_only:
        problems.append(f"listed by the ready-only index: {ready_only['npu_lost']}")
    assert not problems, "; ".join(problems)


# ----- 2. load failures -----------------------------------------------------------------------
def test_load_failures_are_unavailable_with_a_reason(broken_server: ServerProcess) -> None:
    entries = index(broken_server)
    broken = ("npu_missing", "npu_bad_gear", "npu_oom", "npu_dead_device")
    for name in broken:
        assert entries[name]["state"] == "UNAVAILABLE", entries[name]
    assert "model.om does not exist" in entries["npu_missing"]["reason"]
    assert (
        "max_batch_size 16 exceeds the model's largest gear 8" in entries["npu_bad_gear"]["reason"]
    )
    oom = entries["npu_oom"]["reason"]
    assert "acl.mdl.load_from_file" in oom and "245000" in oom and "out of device memory" in oom
    dead = entries["npu_dead_device"]["reason"]
    assert "acl.rt.set_device(2) failed with error 507033" in dead
    assert "ACL_ERROR_RT_DEV_SETUP_ERROR" in dead
    for name in broken:
        assert status(broken_server, f"/v2/models/{name}/ready") == 400
        response = json_infer(broken_server, name, rows(70, 1))
        assert response.status_code in (400, 404, 503), response.text


def test_other_models_serve_beside_load_failures(broken_server: ServerProcess) -> None:
    entries = index(broken_server)
    assert entries["npu_ok"]["state"] == "READY" and entries["simple"]["state"] == "READY"
    x = rows(71, 4)
    with httpclient.InferenceServerClient(broken_server.http_url) as client:
        result = client.infer("npu_ok", [http_input(x)])
    check_scale(result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"), x)
    with grpcclient.InferenceServerClient(broken_server.grpc_url) as client:
        result = client.infer("npu_ok", [grpc_input(x)])
    check_scale(result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"), x)
    check_simple_http(broken_server)
    check_simple_grpc(broken_server)


# ----- 3. no CANN -----------------------------------------------------------------------------
def test_without_pyacl_npu_model_fails_with_install_hint(plain_server: ServerProcess) -> None:
    entry = index(plain_server)["npu_scale"]
    assert entry["state"] == "UNAVAILABLE"
    assert "install the CANN toolkit" in entry["reason"]
    assert "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in entry["reason"]
    assert status(plain_server, "/v2/models/npu_scale/ready") == 400
    assert index(plain_server)["simple"]["state"] == "READY"
    check_simple_http(plain_server)
    check_simple_grpc(plain_server)
    # No NPU model loaded: no NPU gauges.
    assert "ascend_npu_" not in httpx.get(plain_server.metrics_url, timeout=10).text


# ----- 5. leak report at exit (keep last: it stops the servers) --------------------------------
@pytest.mark.parametrize("scenario", ["main_server", "lost_server", "broken_server"])
def test_emulator_reports_no_leak_and_no_misuse_at_exit(
    request: pytest.FixtureRequest, scenario: str
) -> None:
    server: ServerProcess = request.getfixturevalue(scenario)
    if scenario == "lost_server":
        request.getfixturevalue("device_lost")  # exit after the device fault, too
    report_path: Path = server.report_path  # type: ignore[attr-defined]
    assert server.stop() == 0, server.log()
    assert report_path.is_file(), f"no emulator report at {report_path}:\n{server.log()}"
    report = json.loads(report_path.read_text())
    assert report["violations"] == []
    assert report["live"] == []
    assert all(value == 0 for value in report["stats"].values()), report["stats"]
