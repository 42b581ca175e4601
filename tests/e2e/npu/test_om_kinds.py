"""The `.om` kinds people compile, served: a real server subprocess on the pyACL emulator, driven
with tritonclient HTTP and gRPC through the dynamic batcher.

One server holds a detector-style model with a static side input (`npu_side`), a classifier
with dynamic AIPP set from config.pbtxt parameters (`npu_aipp`), a YOLO-style model compiled
with dynamic image sizes (`npu_hw`), a detector taking YUV420SP through static AIPP at dynamic
image sizes (`npu_yuv_hw`), a model whose load takes seconds (`npu_slow`), and two
models compiled with --dynamic_dims over several inputs, listed by --input_shape out of model
order (`npu_dims`: the gears tell the order; `npu_dims_twin`: the config's input_shape does).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness.serverproc import ServerProcess, running_server
from tests.support import om_fixtures as omf

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
QUEUE_DELAY_US = 300_000  # concurrent requests from a test always meet in one batch
AIPP_PARAMETERS = """
parameters { key: "aipp_input_format" value { string_value: "YUV420SP_U8" } }
parameters { key: "aipp_src_image_size_w" value { string_value: "16" } }
parameters { key: "aipp_src_image_size_h" value { string_value: "16" } }
parameters { key: "aipp_dtc_pixel_mean" value { string_value: "1,0,0,0" } }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("npu_kinds")
    repo = root / "models"
    omf.write_model_repository(
        repo, "npu_side", om_writer=omf.side_input_model, max_queue_delay_us=QUEUE_DELAY_US
    )
    omf.write_model_repository(
        repo,
        "npu_aipp",
        om_writer=omf.aipp_model,
        mode="dynamic",
        max_size=(32, 32),
        extra_config=AIPP_PARAMETERS,
    )
    omf.write_model_repository(repo, "npu_hw", om_writer=omf.hw_model)
    omf.write_model_repository(repo, "npu_yuv_hw", om_writer=omf.yuv_hw_model)
    omf.write_model_repository(
        repo, "npu_slow", om_writer=omf.with_fields(omf.scale_model, load_ms=1500)
    )
    omf.write_model_repository(
        repo, "npu_dims", om_writer=omf.dims_pair_model, dynamic_batching=False
    )
    omf.write_model_repository(
        repo,
        "npu_dims_twin",
        om_writer=omf.dims_twin_model,
        dynamic_batching=False,
        extra_config='parameters { key: "input_shape" value { string_value: "b:1,-1;a:1,-1" } }',
    )
    env = omf.emulator_env(
        {"PYTHONPATH": str(ROOT)}, config={"device_count": 1}, report_path=root / "acl_report.json"
    )
    with running_server([repo], ["--exit-timeout-secs", "10"], env=env, log_dir=root) as running:
        running.report_path = root / "acl_report.json"  # type: ignore[attr-defined]
        yield running


def http_tensor(name: str, x: np.ndarray, datatype: str = "FP32") -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x, binary_data=True)
    return tensor


def grpc_tensor(name: str, x: np.ndarray, datatype: str = "FP32") -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    return tensor


def stats(server: ServerProcess, model: str) -> dict:
    return httpx.get(f"{server.base}/v2/models/{model}/stats", timeout=10).json()["model_stats"][0]


# -- a static side input beside a dynamic batch ------------------------------------------------
def test_side_input_requests_are_batched_over_http(server: ServerProcess) -> None:
    info = np.array([[3.0, 0.0, 0.0]], dtype=np.float32)
    xs = [np.full((1, 4), i + 1, dtype=np.float32) for i in range(3)]
    before = stats(server, "npu_side")

    def one(x: np.ndarray) -> np.ndarray:
        with httpclient.InferenceServerClient(server.http_url) as client:
            result = client.infer(
                "npu_side", [http_tensor("images", x), http_tensor("im_info", info)]
            )
        return result.as_numpy("boxes")

    with ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(one, xs))
    for x, out in zip(xs, outs, strict=False):
        np.testing.assert_array_equal(out, x * 3.0)
    after = stats(server, "npu_side")
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == 3
    assert int(after["execution_count"]) - int(before.get("execution_count", 0)) < 3


def test_side_input_rows_with_their_own_values_over_grpc(server: ServerProcess) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    info = np.array([[2, 0, 0], [5, 0, 0]], dtype=np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("npu_side", [grpc_tensor("images", x), grpc_tensor("im_info", info)])
    np.testing.assert_array_equal(result.as_numpy("boxes"), x * info[:, :1])
    np.testing.assert_array_equal(result.as_numpy("score"), x.sum(axis=1, keepdims=True))


# -- dynamic AIPP --------------------------------------------------------------------------------
def test_aipp_model_takes_uint8_source_images(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        meta = client.get_model_metadata("npu_aipp")
    assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
        ("image", "UINT8", [-1, 24, 16, 1])
    ]
    image = np.full((2, 24, 16, 1), 4, dtype=np.uint8)
    with httpclient.InferenceServerClient(server.http_url) as client:
        http_out = client.infer("npu_aipp", [http_tensor("image", image, "UINT8")])
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        grpc_out = client.infer("npu_aipp", [grpc_tensor("image", image[:1], "UINT8")])
    np.testing.assert_array_equal(http_out.as_numpy("total")[:, 0], [(4 - 1) * 384] * 2)
    np.testing.assert_array_equal(grpc_out.as_numpy("total")[:, 0], [(4 - 1) * 384])


def test_aipp_model_refuses_an_image_of_another_size(server: ServerProcess) -> None:
    body = {
        "inputs": [
            {"name": "image", "shape": [1, 16, 16, 1], "datatype": "UINT8", "data": [0] * 256}
        ]
    }
    response = httpx.post(f"{server.base}/v2/models/npu_aipp/infer", json=body, timeout=30)
    assert response.status_code == 400
    assert "input 'image'" in response.json()["error"]
    assert "Expected [-1,24,16,1], got [1,16,16,1]" in response.json()["error"]


# -- static AIPP YUV420SP at dynamic image sizes ------------------------------------------------
def yuv_image(h: int, w: int) -> np.ndarray:
    image = np.full((1, h * 3 // 2, w, 1), 2, dtype=np.uint8)  # UV plane: 2
    image[:, :h] = 1  # Y plane: 1
    return image


def test_yuv_image_size_model_takes_sources_in_the_yuv_layout(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        meta = client.get_model_metadata("npu_yuv_hw")
        assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
            ("image", "UINT8", [-1, -1, -1, 1])
        ]
        out = client.infer("npu_yuv_hw", [http_tensor("image", yuv_image(16, 16), "UINT8")])
    assert out.as_numpy("total")[0, 0] == 16 * 16 + 8 * 16 * 2
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        out = client.infer("npu_yuv_hw", [grpc_tensor("image", yuv_image(20, 10), "UINT8")])
    assert out.as_numpy("total")[0, 0] == 20 * 10 + 10 * 10 * 2  # padded into the 32x24 gear


def test_a_yuv_source_of_broken_layout_is_a_400_saying_why(server: ServerProcess) -> None:
    odd = np.zeros((1, 25, 16, 1), dtype=np.uint8)
    with httpclient.InferenceServerClient(server.http_url) as client:
        with pytest.raises(InferenceServerException) as info:
            client.infer("npu_yuv_hw", [http_tensor("image", odd, "UINT8")])
    assert info.value.status() == "400"
    assert "YUV420SP image: 25 rows of 16 bytes" in info.value.message()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as info:
            client.infer("npu_yuv_hw", [grpc_tensor("image", odd, "UINT8")])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "multiple of 3" in info.value.message()


# -- dynamic image size --------------------------------------------------------------------------
def test_dynamic_hw_model_picks_the_gear(server: ServerProcess) -> None:
    small = np.ones((1, 3, 20, 10), dtype=np.float32)
    exact = np.ones((1, 3, 16, 16), dtype=np.float32)
    with httpclient.InferenceServerClient(server.http_url) as client:
        out = client.infer("npu_hw", [http_tensor("image", small)])
    assert out.as_numpy("grid").shape == (1, 3, 8, 6)  # ran at the 32x24 gear
    assert out.as_numpy("total")[0, 0] == 3 * 200
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        out = client.infer("npu_hw", [grpc_tensor("image", exact)])
    assert out.as_numpy("grid").shape == (1, 3, 4, 4)


def test_a_shape_no_gear_fits_is_a_400_naming_the_gears(server: ServerProcess) -> None:
    too_tall = np.ones((1, 3, 40, 8), dtype=np.float32)
    body = {
        "inputs": [
            {
                "name": "image",
                "shape": [1, 3, 40, 8],
                "datatype": "FP32",
                "data": too_tall.ravel().tolist(),
            }
        ]
    }
    response = httpx.post(f"{server.base}/v2/models/npu_hw/infer", json=body, timeout=30)
    assert response.status_code == 400
    assert (
        "fit none of the model's compiled image sizes (HxW): 16x16, 32x24"
        in response.json()["error"]
    )
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as info:
            client.infer("npu_hw", [grpc_tensor("image", too_tall)])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "16x16, 32x24" in info.value.message()


# -- dynamic dims over several inputs, in --input_shape order ---------------------------------
def test_dims_gears_over_several_inputs_follow_the_input_shape(server: ServerProcess) -> None:
    tokens = np.arange(1, 6, dtype=np.float32).reshape(1, 5)
    weights = np.arange(6, dtype=np.float32).reshape(3, 2)
    bias = np.array([7.0, 8.0, 9.0], dtype=np.float32)
    with httpclient.InferenceServerClient(server.http_url) as client:
        meta = client.get_model_metadata("npu_dims")
        out = client.infer(
            "npu_dims",
            [
                http_tensor("tokens", tokens),
                http_tensor("weights", weights),
                http_tensor("bias", bias),
            ],
        )
    assert [(i["name"], i["shape"]) for i in meta["inputs"]] == [
        ("tokens", [1, -1]),
        ("weights", [-1, 2]),
        ("bias", [3]),
    ]
    assert out.as_numpy("echo").shape == (1, 16)  # the gear weights [4, 2], tokens [1, 16]
    np.testing.assert_array_equal(out.as_numpy("wsum")[:, 0], [1.0, 5.0, 9.0, 0.0])
    a, b = np.ones((1, 3), np.float32), np.full((1, 7), 2.0, np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        twin = client.infer("npu_dims_twin", [grpc_tensor("a", a), grpc_tensor("b", b)])
        with pytest.raises(InferenceServerException) as info:
            client.infer(
                "npu_dims_twin",
                [grpc_tensor("a", np.ones((1, 9), np.float32)), grpc_tensor("b", b)],
            )
    assert twin.as_numpy("a_echo").shape == (1, 4) and twin.as_numpy("b_echo").shape == (1, 8)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'a' [1, 9], 'b' [1, 7] fit none of the model's compiled dims" in info.value.message()


# -- a load of seconds ---------------------------------------------------------------------------
def test_a_slow_loading_model_is_ready_and_serves(server: ServerProcess) -> None:
    assert httpx.get(f"{server.base}/v2/models/npu_slow/ready", timeout=10).status_code == 200
    x = np.ones((1, 4), dtype=np.float32)
    with httpclient.InferenceServerClient(server.http_url) as client:
        out = client.infer("npu_slow", [http_tensor("INPUT0", x)])
    np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), x * 2 + 1)


# -- exit (keep last: it stops the server) ---------------------------------------------------
def test_exit_leaves_nothing_behind(server: ServerProcess) -> None:
    assert server.stop() == 0, server.log()
    report = json.loads(server.report_path.read_text())  # type: ignore[attr-defined]
    assert report["violations"] == [] and report["live"] == []
