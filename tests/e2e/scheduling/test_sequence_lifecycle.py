"""Sequences across a hot swap and a shutdown: a sequence finishes on the copy it started on."""

from __future__ import annotations

import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.sequences import write_accumulator
from harness.serverproc import running_server

pytestmark = pytest.mark.e2e


def _step(
    client,
    corrid: int,
    value: int,
    start: bool = False,
    end: bool = False,
    parameters: dict | None = None,
):
    tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer(
        "accumulator",
        [tensor],
        sequence_id=corrid,
        sequence_start=start,
        sequence_end=end,
        parameters=parameters,
    )
    return int(result.as_numpy("OUTPUT")[0][0]), result.get_response()["model_version"]


def test_a_sequence_finishes_on_the_version_it_started_on(tmp_path: Path) -> None:
    model_dir = write_accumulator(tmp_path)
    with running_server(
        [tmp_path],
        ["--model-control-mode", "explicit", "--load-model", "*", "--exit-timeout-secs", "20"],
    ) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert _step(client, 1, 5, start=True) == (5, "1")
        shutil.copytree(model_dir / "1", model_dir / "2")
        # Loads version 2 and retires version 1; the call returns once 1 has drained, which
        # waits for its live sequence.
        loading = threading.Thread(
            target=httpclient.InferenceServerClient(server.http_url).load_model,
            args=("accumulator",),
        )
        loading.start()
        deadline = time.monotonic() + 20
        while not client.is_model_ready("accumulator", "2"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Sequence 1 lives on version 1 (its state is in that copy's model); new ones on 2.
        assert _step(client, 1, 6) == (11, "1")
        assert _step(client, 2, 100, start=True) == (100, "2")
        assert loading.is_alive()
        assert _step(client, 1, 7, end=True) == (18, "1")
        loading.join(20)
        assert not loading.is_alive()
        assert not client.is_model_ready("accumulator", "1")
        index = {
            (m["name"], m.get("version")): m.get("state")
            for m in client.get_model_repository_index()
        }
        assert index[("accumulator", "2")] == "READY"
        assert _step(client, 2, 1, end=True) == (101, "2")


def test_shutdown_lets_live_sequences_finish(tmp_path: Path) -> None:
    write_accumulator(tmp_path)
    with running_server([tmp_path], ["--exit-timeout-secs", "20"]) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert _step(client, 1, 5, start=True) == (5, "1")
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while client.is_server_ready():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(InferenceServerException) as error:
            _step(client, 2, 1, start=True)  # no new sequences while exiting
        assert "Server exiting" in error.value.message()
        assert _step(client, 1, 6) == (11, "1")
        assert _step(client, 1, 7, end=True) == (18, "1")
        assert server.process.wait(20) == 0


def test_sequences_through_frontend_processes(tmp_path: Path) -> None:
    """Each request on a new connection, so the kernel spreads them over both processes: the
    sequence still runs in one place, the model owner, with its state."""
    write_accumulator(tmp_path)
    with running_server([tmp_path], ["--frontend-processes", "2"]) as server:
        values = [3, 4, 5, 6, 7, 8]
        answers = []
        for step, value in enumerate(values):
            client = httpclient.InferenceServerClient(server.http_url)
            answers.append(_step(client, 9, value, start=step == 0, end=step == len(values) - 1)[0])
            client.close()
        assert answers == list(np.cumsum(values))


def test_a_traffic_split_keeps_each_sequence_on_its_version(tmp_path: Path) -> None:
    """Under a 50/50 split (gray release) only START picks a version (here by a traffic key,
    so both versions get sequences); the later requests carry no key, and would be split at
    random, but go where the sequence's state is."""
    model_dir = write_accumulator(tmp_path)
    shutil.copytree(model_dir / "1", model_dir / "2")
    config = model_dir / "config.pbtxt"
    config.write_text(config.read_text() + "version_policy: { all { } }\n")
    with running_server([tmp_path]) as server:
        import httpx

        answer = httpx.put(
            f"{server.base}/v2/models/accumulator/traffic", json={"weights": {"1": 50, "2": 50}}
        )
        assert answer.status_code == 200, answer.text
        client = httpclient.InferenceServerClient(server.http_url)
        versions = set()
        for corrid in range(1, 13):
            values = [corrid, 1, 2, 3]
            answers = [
                _step(
                    client,
                    corrid,
                    value,
                    start=step == 0,
                    end=step == 3,
                    parameters={"traffic_key": f"user-{corrid}"} if step == 0 else None,
                )
                for step, value in enumerate(values)
            ]
            assert [total for total, _ in answers] == list(np.cumsum(values))
            assert len({version for _, version in answers}) == 1
            versions.add(answers[0][1])
        assert versions == {"1", "2"}
