"""BLS from Python models against a real server: `exec()`, `async_exec()`, `exec(decoupled=True)`
and the errors a call gets back, verbatim; the calls go through the server's infer path, so the
called model's statistics and metrics move.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from harness.procutil import wait_for
from harness.serverproc import ServerProcess, running_server
from tests.support.streamingmodels import build_streaming_repository

pytestmark = pytest.mark.e2e

X = np.arange(16, dtype=np.int32).reshape(1, 16)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = build_streaming_repository(tmp_path_factory.mktemp("bls"))
    with running_server([repo], log_dir=tmp_path_factory.mktemp("logs")) as process:
        yield process


def _bls(server: ServerProcess, mode: str) -> tuple[np.ndarray, str]:
    x = httpclient.InferInput("X", [1, 16], "INT32")
    x.set_data_from_numpy(X)
    how = httpclient.InferInput("MODE", [1], "BYTES")
    how.set_data_from_numpy(np.array([mode.encode()], dtype=object))
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer("bls", [x, how], request_id=f"call-{mode}")
    # The model's InferenceResponse(parameters=...) and the request id it saw.
    assert result.get_response()["parameters"] == {"mode": mode, "caller": f"call-{mode}"}
    return result.as_numpy("OUT"), result.as_numpy("ERR")[0].decode()


def _simple_success(server: ServerProcess) -> int:
    stats = httpx.get(f"{server.base}/v2/models/simple/stats").json()
    return stats["model_stats"][0]["inference_stats"]["success"]["count"]


def _simple_metric(server: ServerProcess) -> float:
    for line in httpx.get(server.metrics_url).text.splitlines():
        if line.startswith('nv_inference_request_success{model="simple"'):
            return float(line.split()[-1])
    return 0.0


def test_exec_goes_through_the_infer_path(server: ServerProcess) -> None:
    before, metric_before = _simple_success(server), _simple_metric(server)
    out, err = _bls(server, "exec")
    assert err == ""
    assert out.tolist() == (X + 1).tolist()  # simple's OUTPUT0 = INPUT0 + INPUT1
    assert _simple_success(server) == before + 1
    assert _simple_metric(server) == metric_before + 1


def test_async_exec_runs_calls_concurrently(server: ServerProcess) -> None:
    before = _simple_success(server)
    out, err = _bls(server, "async")
    assert err == ""
    assert out.tolist() == ((X + 1) + (X + 2)).tolist()
    assert _simple_success(server) == before + 2


def test_errors_come_back_verbatim(server: ServerProcess) -> None:
    _, err = _bls(server, "unknown")
    assert err == "Request for unknown model: 'nope' is not found"
    _, err = _bls(server, "bad_input")
    assert "unexpected shape for input 'INPUT0' for model 'simple'" in err
    _, err = _bls(server, "decoupled")
    assert err.startswith("Model 'chatty' is decoupled: call it with exec(decoupled=True)")


def test_async_exec_decoupled_gives_every_answer_then_an_empty_one(server: ServerProcess) -> None:
    out, note = _bls(server, "async_stream")
    assert out[0, :4].tolist() == [0, 1, 2, 0]
    assert note == "4 answers, last empty: True"


def test_cancelling_a_decoupled_call_reaches_the_called_model(server: ServerProcess) -> None:
    cancels = server.log().count("chatty cancelled at")
    out, err = _bls(server, "stop_early")
    assert out[0, :2].tolist() == [0, 1] and err == ""
    wait_for(
        lambda: server.log().count("chatty cancelled at") > cancels,
        "chatty to see the cancel",
        timeout=15,
    )


def test_exec_decoupled_iterates_every_response(server: ServerProcess) -> None:
    text = httpclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"alpha beta gamma"], dtype=object))
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer("token_join", [text])
    assert result.as_numpy("text_output")[0] == b"alpha beta gamma"
    assert int(result.as_numpy("count")[0]) == 3


def test_a_decoupled_step_that_answers_once_works_in_an_ensemble(server: ServerProcess) -> None:
    def words(text: bytes) -> httpx.Response:
        return httpx.post(
            f"{server.base}/v2/models/words/infer",
            json={
                "inputs": [
                    {"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [text.decode()]}
                ]
            },
        )

    one = words(b"single")
    assert one.status_code == 200
    assert one.json()["outputs"][0]["data"] == ["single"]
    two = words(b"two words")
    assert two.status_code == 500
    assert (
        "model 'token_stream' is decoupled and gave more than one response" in two.json()["error"]
    )
