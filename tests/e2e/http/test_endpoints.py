"""Every HTTP endpoint and error path, with raw HTTP, against a server subprocess.

After each error the server must still be live and serving.
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def http(example_server) -> httpx.Client:
    with httpx.Client(base_url=example_server.base, timeout=30) as client:
        yield client


@pytest.fixture(autouse=True)
def still_serving(http: httpx.Client):
    yield
    assert http.get("/v2/health/live").status_code == 200
    body = _simple_json()
    reply = http.post("/v2/models/simple/infer", json=body)
    assert reply.status_code == 200, reply.text


def _simple_json(a=None, b=None, shape=(1, 16)) -> dict:
    a = list(range(16)) if a is None else a
    b = [1] * 16 if b is None else b
    return {
        "inputs": [
            {"name": "INPUT0", "shape": list(shape), "datatype": "INT32", "data": a},
            {"name": "INPUT1", "shape": list(shape), "datatype": "INT32", "data": b},
        ]
    }


def test_health_and_server_metadata(http: httpx.Client) -> None:
    live = http.get("/v2/health/live")
    ready = http.get("/v2/health/ready")
    assert (live.status_code, live.content) == (200, b"")
    assert (ready.status_code, ready.content) == (200, b"")
    meta = http.get("/v2").json()
    assert meta["name"] == "ascend-serve"
    assert "binary_tensor_data" in meta["extensions"] and "statistics" in meta["extensions"]
    assert {"system_shared_memory", "trace", "logging"} <= set(meta["extensions"])


@pytest.mark.parametrize(
    "accept",
    ["application/json", "application/json, text/plain", "text/plain;q=0.5, Application/JSON;q=1"],
)
def test_health_answers_json_when_the_client_asks_for_it(http: httpx.Client, accept: str) -> None:
    """KServe's own client reads `{"live": true}` / `{"ready": true}` (KServe's v2 spec); it
    gets them by asking for JSON, while other clients keep Triton's empty body."""
    live = http.get("/v2/health/live", headers={"Accept": accept})
    ready = http.get("/v2/health/ready", headers={"Accept": accept})
    assert (live.status_code, live.json()) == (200, {"live": True})
    assert (ready.status_code, ready.json()) == (200, {"ready": True})
    assert live.headers["content-type"] == "application/json"


@pytest.mark.parametrize("accept", [None, "*/*", "text/html", "application/json;q=0"])
def test_health_keeps_tritons_empty_body_otherwise(
    http: httpx.Client, example_server, accept: str | None
) -> None:
    import tritonclient.http as httpclient

    headers = {} if accept is None else {"Accept": accept}
    for path in ("/v2/health/live", "/v2/health/ready"):
        reply = http.get(path, headers=headers)
        assert (reply.status_code, reply.content) == (200, b"")
    client = httpclient.InferenceServerClient(example_server.http_url)
    try:
        assert client.is_server_live() and client.is_server_ready()
    finally:
        client.close()


def test_not_ready_health_in_json_is_400_ready_false(tmp_path) -> None:
    from harness.serverproc import running_server

    # No model: never ready (--strict-readiness), still live.
    repository = tmp_path / "models"
    repository.mkdir()
    with running_server([repository], wait_ready=False, log_dir=tmp_path) as server:
        json_accept = {"Accept": "application/json"}
        ready = httpx.get(f"{server.base}/v2/health/ready", headers=json_accept, timeout=10)
        assert (ready.status_code, ready.json()) == (400, {"ready": False})
        plain = httpx.get(f"{server.base}/v2/health/ready", timeout=10)
        assert (plain.status_code, plain.content) == (400, b"")
        live = httpx.get(f"{server.base}/v2/health/live", headers=json_accept, timeout=10)
        assert (live.status_code, live.json()) == (200, {"live": True})


def test_model_metadata_ready_and_config(http: httpx.Client) -> None:
    meta = http.get("/v2/models/simple").json()
    assert meta == {
        "name": "simple",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
    }
    assert http.get("/v2/models/simple/versions/1").json()["versions"] == ["1"]
    assert http.get("/v2/models/simple/ready").status_code == 200
    assert http.get("/v2/models/simple/versions/1/ready").status_code == 200
    not_ready = http.get("/v2/models/simple/versions/7/ready")
    assert (not_ready.status_code, not_ready.json()) == (400, {"error": "Model version not ready"})
    config = http.get("/v2/models/simple/config").json()
    assert config["max_batch_size"] == 8 and config["input"][0]["dims"] == [16]
    assert "dynamic_batching" not in config
    assert (
        http.get("/v2/models/simple_batching/config").json()["dynamic_batching"][
            "max_queue_delay_microseconds"
        ]
        == 500
    )


def test_json_inference_values(http: httpx.Client) -> None:
    body = _simple_json()
    body["id"] = "req-1"
    reply = http.post("/v2/models/simple/infer", json=body)
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    data = reply.json()
    assert data["id"] == "req-1" and data["model_name"] == "simple" and data["model_version"] == "1"
    outputs = {o["name"]: o for o in data["outputs"]}
    assert outputs["OUTPUT0"]["data"] == [i + 1 for i in range(16)]
    assert outputs["OUTPUT1"]["data"] == [i - 1 for i in range(16)]
    assert outputs["OUTPUT0"]["shape"] == [1, 16] and outputs["OUTPUT0"]["datatype"] == "INT32"


def test_binary_request_and_response(http: httpx.Client) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [2, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": a.nbytes},
                },
                {
                    "name": "INPUT1",
                    "shape": [2, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": b.nbytes},
                },
            ],
            "outputs": [
                {"name": "OUTPUT0", "parameters": {"binary_data": True}},
                {"name": "OUTPUT1"},
            ],
        }
    ).encode()
    reply = http.post(
        "/v2/models/simple/infer",
        content=header + a.tobytes() + b.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert reply.status_code == 200, reply.text
    length = int(reply.headers["Inference-Header-Content-Length"])
    meta = json.loads(reply.content[:length])
    first, second = meta["outputs"]
    assert first["parameters"]["binary_data_size"] == a.nbytes and "data" not in first
    out0 = np.frombuffer(reply.content[length:], dtype=np.int32).reshape(2, 16)
    assert (out0 == a + b).all()
    assert second["data"] == (a - b).reshape(-1).tolist()


def test_raw_binary_body_for_a_single_input_model(http: httpx.Client) -> None:
    strings = [b"hello", b"", "w\u00f6rld".encode()]
    raw = b"".join(struct.pack("<I", len(s)) + s for s in strings)
    # identity_bytes has dims [-1]: a BYTES raw input must have shape [1]
    reply = http.post(
        "/v2/models/identity_bytes/infer",
        content=raw,
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert reply.status_code == 400
    assert "must have input shape [1]" in reply.json()["error"]
    image = np.random.default_rng(1).random((3, 32, 32), dtype=np.float32)
    reply = http.post(
        "/v2/models/classifier/infer",
        content=image.tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert reply.status_code == 200, reply.text
    length = int(reply.headers["Inference-Header-Content-Length"])
    probabilities = np.frombuffer(reply.content[length:], dtype=np.float32)
    assert probabilities.shape == (10,) and abs(probabilities.sum() - 1) < 1e-4


def test_bytes_tensors_json(http: httpx.Client) -> None:
    body = {
        "inputs": [{"name": "INPUT", "shape": [3], "datatype": "BYTES", "data": ["a", "", "ünï"]}]
    }
    data = http.post("/v2/models/identity_bytes/infer", json=body).json()
    assert data["outputs"][0]["data"] == ["a", "", "ünï"]
    assert data["outputs"][0]["datatype"] == "BYTES"


def test_classification_extension(http: httpx.Client) -> None:
    image = np.zeros((1, 3, 32, 32), dtype=np.float32)
    image[0, 0] = 1.0
    body = {
        "inputs": [
            {
                "name": "INPUT",
                "shape": [1, 3, 32, 32],
                "datatype": "FP32",
                "data": image.reshape(-1).tolist(),
            }
        ],
        "outputs": [{"name": "PROBABILITIES", "parameters": {"classification": 3}}],
    }
    data = http.post("/v2/models/classifier/infer", json=body).json()
    output = data["outputs"][0]
    assert output["datatype"] == "BYTES" and output["shape"] == [1, 3]
    plain = http.post("/v2/models/classifier/infer", json={"inputs": body["inputs"]}).json()
    probabilities = plain["outputs"][0]["data"]
    best = int(np.argmax(probabilities))
    labels = [
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    ]
    value, index, label = output["data"][0].split(":")
    assert int(index) == best and label == labels[best]
    assert abs(float(value) - probabilities[best]) < 1e-5


@pytest.mark.parametrize(
    "encoding, compress",
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("identity", lambda b: b)],
)
def test_compressed_request_bodies(http: httpx.Client, encoding, compress) -> None:
    body = json.dumps(_simple_json()).encode()
    reply = http.post(
        "/v2/models/simple/infer", content=compress(body), headers={"Content-Encoding": encoding}
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"][:3] == [1, 2, 3]


def test_compressed_responses(http: httpx.Client) -> None:
    reply = http.post(
        "/v2/models/simple/infer",
        json=_simple_json(),
        headers={"Accept-Encoding": "deflate;q=0.5, gzip;q=0.9"},
    )
    assert reply.headers["content-encoding"] == "gzip"
    assert reply.json()["outputs"][0]["data"][:2] == [1, 2]  # httpx decompresses


def test_unknown_compression_is_501(http: httpx.Client) -> None:
    reply = http.post("/v2/models/simple/infer", content=b"{}", headers={"Content-Encoding": "br"})
    assert reply.status_code == 501
    assert "Unsupported compression type" in reply.json()["error"]
    assert reply.headers["accept-encoding"] == "gzip, deflate"


def test_statistics(http: httpx.Client) -> None:
    http.post("/v2/models/simple/infer", json=_simple_json())
    stats = http.get("/v2/models/simple/stats").json()["model_stats"]
    assert len(stats) == 1
    entry = stats[0]
    assert entry["name"] == "simple" and entry["version"] == "1"
    assert set(entry["inference_stats"]) == {
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    }
    inference = entry["inference_stats"]
    assert isinstance(entry["inference_count"], int) and entry["inference_count"] >= 1
    assert inference["queue"]["count"] == inference["success"]["count"]
    assert (
        inference["compute_input"]["count"]
        == inference["compute_infer"]["count"]
        == inference["compute_output"]["count"]
    )
    assert entry["batch_stats"][0]["compute_infer"]["count"] >= 1
    every = http.get("/v2/models/stats").json()["model_stats"]
    assert {s["name"] for s in every} >= {"simple", "classifier", "identity_bytes"}
    versioned = http.get("/v2/models/simple/versions/1/stats").json()["model_stats"]
    assert versioned[0]["version"] == "1"
    missing = http.get("/v2/models/nope/stats")
    assert missing.status_code == 400
    assert missing.json() == {"error": "requested model 'nope' is not available"}


def test_repository_index_and_control_in_none_mode(http: httpx.Client) -> None:
    index = http.post("/v2/repository/index").json()
    simple = next(e for e in index if e["name"] == "simple")
    assert simple == {"name": "simple", "version": "1", "state": "READY"}
    assert all(
        e["state"] == "READY"
        for e in http.post("/v2/repository/index", json={"ready": True}).json()
    )
    bad = http.post("/v2/repository/index", json={"ready": "yes"})
    assert (bad.status_code, bad.json()["error"]) == (
        400,
        "Invalid value for 'ready': expected a boolean",
    )
    for action in ("load", "unload"):
        reply = http.post(f"/v2/repository/models/simple/{action}")
        assert reply.status_code == 503
        assert reply.json() == {
            "error": "explicit model load / unload is not allowed if polling is enabled"
        }


def test_repository_index_with_a_repository_name_answers_the_index(http: httpx.Client) -> None:
    """Triton's HTTP index ignores the name; load and unload with one stay refused."""
    named = http.post("/v2/repository/models_dir/index", json={"ready": True})
    assert named.status_code == 200
    assert named.json() == http.post("/v2/repository/index", json={"ready": True}).json()
    assert any(e["name"] == "simple" for e in named.json())
    for action in ("load", "unload"):
        reply = http.post(f"/v2/repository/models_dir/models/simple/{action}")
        assert reply.status_code == 501
        assert reply.json() == {"error": "'repository_name' specification is not supported"}


@pytest.mark.parametrize(
    "method, path, status, error",
    [
        ("GET", "/v2/nothing", 404, "Not Found"),
        ("GET", "/v2/models/simple/versions/v1", 404, "Not Found"),
        ("DELETE", "/v2/models/simple", 405, "Method Not Allowed"),
        ("GET", "/v2/models/simple/infer", 405, "Method Not Allowed"),
        ("GET", "/v2/models/nope", 404, "Request for unknown model: 'nope' is not found"),
        (
            "GET",
            "/v2/models/simple/versions/9",
            404,
            "Request for unknown model: 'simple' version 9 is not found",
        ),
    ],
)
def test_routing_errors(
    http: httpx.Client, method: str, path: str, status: int, error: str
) -> None:
    reply = http.request(method, path)
    assert reply.status_code == status
    assert reply.json() == {"error": error}


BAD_INFER = [
    (
        "unknown model",
        "/v2/models/nope/infer",
        _simple_json(),
        404,
        "Request for unknown model: 'nope' is not found",
    ),
    (
        "wrong shape",
        "/v2/models/simple/infer",
        _simple_json(a=list(range(15)), b=[1] * 15, shape=(1, 15)),
        400,
        "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,15]",
    ),
    (
        "wrong dtype",
        "/v2/models/simple/infer",
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
            ]
        },
        400,
        "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
    ),
    ("element count", "/v2/models/simple/infer", _simple_json(a=[1] * 3), 400, "INPUT0"),
    (
        "batch too large",
        "/v2/models/simple/infer",
        _simple_json(a=[1] * 16 * 9, b=[1] * 16 * 9, shape=(9, 16)),
        400,
        "batch-size must be <= 8 for 'simple'",
    ),
    ("negative dim", "/v2/models/simple/infer", _simple_json(shape=(-1, 16)), 400, "INPUT0"),
    (
        "missing input",
        "/v2/models/simple/infer",
        {"inputs": _simple_json()["inputs"][:1]},
        400,
        "expected 2 inputs but got 1 inputs for model 'simple'",
    ),
]


@pytest.mark.parametrize(
    "case, path, body, status, fragment", BAD_INFER, ids=[c[0] for c in BAD_INFER]
)
def test_bad_inference_requests(http: httpx.Client, case, path, body, status, fragment) -> None:
    reply = http.post(path, json=body)
    assert reply.status_code == status, reply.text
    assert fragment in reply.json()["error"]


def test_malformed_json(http: httpx.Client) -> None:
    reply = http.post(
        "/v2/models/simple/infer",
        content=b'{"inputs": [',
        headers={"content-type": "application/json"},
    )
    assert reply.status_code == 400 and "error" in reply.json()


def test_json_nesting_limit(http: httpx.Client) -> None:
    deep = b'{"inputs": ' + b"[" * 120 + b"]" * 120 + b"}"
    reply = http.post("/v2/models/simple/infer", content=deep)
    assert reply.status_code == 400
    assert "JSON nesting depth exceeds maximum allowed limit (100)" in reply.json()["error"]
    index = http.post("/v2/repository/index", content=b"[" * 250_000 + b"]" * 250_000)
    assert index.status_code == 400


@pytest.mark.parametrize(
    "header, extra, fragment",
    [
        ("99999999999", b"", ""),
        ("-1", b"", ""),
        ("abc", b"", "Inference-Header-Content-Length"),
        (None, b"\x00" * 64, ""),  # binary data without the header
        ("SIZE", b"\x00" * 60, "INPUT0"),  # too few binary bytes
        ("SIZE", b"\x00" * 136, "unexpected additional input data"),  # too many
    ],
)
def test_bad_binary_framing(http: httpx.Client, header, extra, fragment) -> None:
    meta = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 64},
                },
                {
                    "name": "INPUT1",
                    "shape": [1, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 64},
                },
            ]
        }
    ).encode()
    headers = (
        {}
        if header is None
        else {"Inference-Header-Content-Length": str(len(meta)) if header == "SIZE" else header}
    )
    reply = http.post("/v2/models/simple/infer", content=meta + extra, headers=headers)
    assert reply.status_code == 400, reply.text
    assert fragment in reply.json()["error"]


def test_json_nesting_limit_is_a_setting(example_repository) -> None:
    from harness.serverproc import running_server

    with running_server([example_repository], ["--http-max-json-depth", "4"]) as server:
        deep = {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [[[[1] * 16]]]}
            ]
        }  # 6 levels: body, inputs, entry, data x3
        reply = httpx.post(server.base + "/v2/models/simple/infer", json=deep)
        assert reply.status_code == 400
        assert "JSON nesting depth exceeds maximum allowed limit (4)" in reply.json()["error"]
        ok = httpx.post(server.base + "/v2/repository/index", json={"ready": True})
        assert ok.status_code == 200


def test_raw_binary_bodies_over_the_offload_threshold(example_repository) -> None:
    """A raw body over --http-offload-threshold: uncompressed it decodes on the loop (its tensor
    is a view over the body), gzipped it inflates in a parser process; same answer both ways."""
    import gzip

    from harness.serverproc import running_server

    image = np.random.default_rng(2).random((3, 32, 32), dtype=np.float32)
    with running_server([example_repository], ["--http-offload-threshold", "1024"]) as server:
        answers = []
        for body, extra in (
            (image.tobytes(), {}),
            (gzip.compress(image.tobytes()), {"Content-Encoding": "gzip"}),
        ):
            reply = httpx.post(
                server.base + "/v2/models/classifier/infer",
                content=body,
                headers={"Inference-Header-Content-Length": "0", **extra},
            )
            assert reply.status_code == 200, reply.text
            length = int(reply.headers["Inference-Header-Content-Length"])
            answers.append(np.frombuffer(reply.content[length:], dtype=np.float32))
        assert answers[0].shape == (10,) and abs(answers[0].sum() - 1) < 1e-4
        np.testing.assert_array_equal(answers[0], answers[1])
        too_many = httpx.post(
            server.base + "/v2/models/simple/infer",
            content=b"\0" * 4096,
            headers={"Inference-Header-Content-Length": "0"},
        )
        assert too_many.status_code == 400 and "simple" in too_many.json()["error"]
