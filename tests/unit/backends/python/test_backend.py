"""The Python backend end to end in-process: real worker processes, real model.py files.

Covers the worker protocol (init, execute, errors, finalize), the `args` a model receives,
shared-memory transfer of large and BYTES tensors, supervision (a killed worker fails only the
requests it was running, restarts, and gives up after repeated crashes) and auto-complete.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.base import BackendError, InstanceSpec
from backends.python.backend import PythonBackend
from protocol.errors import InternalError, InvalidArgument, Unavailable
from repository.config import normalize, parse_config_text

ADD_SUB = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            if in_1 is None:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(
                        "INPUT1 missing", pb_utils.TritonError.INVALID_ARG)))
                continue
            in_1 = in_1.as_numpy()
            if float(in_1.reshape(-1)[0]) == -1:
                raise ValueError("asked to fail")
            if float(in_1.reshape(-1)[0]) == -2:
                time.sleep(30)
            out = pb_utils.Tensor("OUTPUT0", (in_0 + in_1).astype(self.output0_dtype))
            args = pb_utils.Tensor("ARGS", np.array([json.dumps(self.args).encode()],
                                                    dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out, args]))
        return responses

    def finalize(self):
        with open(self.args["model_repository"] + "/finalized", "w") as handle:
            handle.write("yes")
""".replace("import json\n", "import json\nimport time\n", 1)

ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
%s
"""


def write_model(root: Path, name: str, source: str, config_text: str) -> Path:
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(source))
    if config_text:
        (model_dir / "config.pbtxt").write_text(config_text)
    return model_dir


def make_backend(model_dir: Path, config_text: str) -> PythonBackend:
    config = parse_config_text(config_text, model_dir / "config.pbtxt")
    normalize(config, model_dir.name, model_dir, [model_dir / "1"])
    spec = InstanceSpec(f"{model_dir.name}_0", "KIND_CPU", 0, 0)
    return PythonBackend(config, model_dir, model_dir / "1", spec)


@pytest.fixture
def add_sub(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[PythonBackend]:
    extra = getattr(request, "param", "")
    config_text = ADD_SUB_CONFIG % extra
    backend = make_backend(write_model(tmp_path, "add_sub", ADD_SUB, config_text), config_text)
    backend.load()
    yield backend
    backend.unload()


def pair(a: float, b: float, n: int = 4) -> dict[str, np.ndarray]:
    return {"INPUT0": np.full((1, n), a, np.float32), "INPUT1": np.full((1, n), b, np.float32)}


def kill_worker(backend: PythonBackend) -> None:
    """SIGKILL the worker and wait until the supervisor has seen it go."""
    worker = backend._worker
    assert worker is not None
    os.kill(worker.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while backend._worker is worker and backend._state == "ready":
        assert time.monotonic() < deadline, "the supervisor did not notice the kill"
        time.sleep(0.005)


def wait_healthy(backend: PythonBackend, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not backend.healthy():
        assert time.monotonic() < deadline, "the worker did not come back"
        time.sleep(0.02)


def test_documented_model_runs_and_gets_tritons_args(
    add_sub: PythonBackend, tmp_path: Path
) -> None:
    results = add_sub.execute_requests([pair(1, 2), pair(10, 20, n=3)])
    assert np.array_equal(results[0]["OUTPUT0"], np.full((1, 4), 3, np.float32))
    assert np.array_equal(results[1]["OUTPUT0"], np.full((1, 3), 30, np.float32))
    args = json.loads(results[0]["ARGS"][0])
    assert set(args) == {
        "model_config",
        "model_instance_kind",
        "model_instance_name",
        "model_instance_device_id",
        "model_repository",
        "model_version",
        "model_name",
    }
    assert args["model_name"] == "add_sub" and args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU" and args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] == "add_sub_0"
    assert args["model_repository"] == str(tmp_path / "add_sub")
    model_config = json.loads(args["model_config"])
    assert model_config["max_batch_size"] == 8
    assert model_config["input"][0]["dims"] == [-1]
    assert model_config["output"][1]["data_type"] == "TYPE_STRING"


def test_large_tensors_cross_through_shared_memory(add_sub: PythonBackend) -> None:
    big = np.random.default_rng(1).standard_normal((1, 2_000_000)).astype(np.float32)
    result = add_sub.execute_requests([{"INPUT0": big, "INPUT1": big}])[0]
    assert np.array_equal(result["OUTPUT0"], big + big)
    small = add_sub.execute_requests([pair(1, 1)])[0]  # the grown arenas keep working
    assert np.array_equal(small["OUTPUT0"], np.full((1, 4), 2, np.float32))


def test_model_errors_fail_only_their_request(add_sub: PythonBackend) -> None:
    results = add_sub.execute_requests([pair(1, 2), {"INPUT0": np.zeros((1, 2), np.float32)}])
    assert "OUTPUT0" in results[0]
    assert isinstance(results[1], InvalidArgument) and "INPUT1 missing" in results[1].message


def test_exception_in_execute_fails_the_batch_and_keeps_the_worker(add_sub: PythonBackend) -> None:
    results = add_sub.execute_requests([pair(1, 2), pair(1, -1)])
    assert all(isinstance(r, InternalError) for r in results)
    assert "Failed to process the request(s) for model instance 'add_sub_0'" in results[0].message
    assert "ValueError: asked to fail" in results[0].message
    assert add_sub.healthy() and add_sub.restarts == 0
    assert "OUTPUT0" in add_sub.execute_requests([pair(1, 2)])[0]


def test_unload_calls_finalize_and_ends_the_process(tmp_path: Path) -> None:
    config_text = ADD_SUB_CONFIG % ""
    model_dir = write_model(tmp_path, "add_sub", ADD_SUB, config_text)
    backend = make_backend(model_dir, config_text)
    started = time.monotonic()
    backend.load()
    assert time.monotonic() - started < 2.0  # worker start stays fast
    process = backend._worker.process  # type: ignore[union-attr]
    backend.unload()
    assert (model_dir / "finalized").read_text() == "yes"
    assert process.poll() is not None
    assert not backend.healthy()


def test_initialize_failure_is_a_load_error(tmp_path: Path) -> None:
    source = """
    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("weights not found")
        def execute(self, requests):
            return []
    """
    config_text = ADD_SUB_CONFIG % ""
    backend = make_backend(write_model(tmp_path, "add_sub", source, config_text), config_text)
    with pytest.raises(BackendError, match="RuntimeError: weights not found"):
        backend.load()


def test_missing_model_class_is_a_load_error(tmp_path: Path) -> None:
    config_text = ADD_SUB_CONFIG % ""
    backend = make_backend(write_model(tmp_path, "add_sub", "x = 1\n", config_text), config_text)
    with pytest.raises(BackendError, match="TritonPythonModel"):
        backend.load()


def test_killed_worker_fails_in_flight_requests_and_restarts(add_sub: PythonBackend) -> None:
    results: list = []
    runner = threading.Thread(
        target=lambda: results.extend(add_sub.execute_requests([pair(1, -2), pair(1, 2)]))
    )
    runner.start()
    time.sleep(0.3)  # the first request now sleeps inside the worker
    started = time.monotonic()
    os.kill(add_sub._worker.pid, signal.SIGKILL)  # type: ignore[union-attr]
    runner.join(5)
    assert time.monotonic() - started < 1.0  # in-flight requests fail at once
    assert len(results) == 2 and all(isinstance(r, Unavailable) for r in results)
    assert "was killed by SIGKILL" in results[0].message
    wait_healthy(add_sub)
    assert add_sub.restarts == 1
    assert np.array_equal(
        add_sub.execute_requests([pair(2, 3)])[0]["OUTPUT0"], np.full((1, 4), 5, np.float32)
    )


def test_worker_killed_while_idle_is_replaced_before_the_next_request(
    add_sub: PythonBackend,
) -> None:
    kill_worker(add_sub)
    assert not add_sub.healthy()  # not ready while restarting
    result = add_sub.execute_requests([pair(1, 1)])[0]  # waits for the restart, then runs
    assert np.array_equal(result["OUTPUT0"], np.full((1, 4), 2, np.float32))
    assert add_sub.restarts == 1 and add_sub.healthy()


@pytest.mark.parametrize(
    "add_sub",
    ['parameters { key: "max_worker_crashes" value { string_value: "2" } }'],
    indirect=True,
)
def test_repeated_crashes_make_the_instance_fail_for_good(add_sub: PythonBackend) -> None:
    kill_worker(add_sub)
    wait_healthy(add_sub)
    kill_worker(add_sub)
    assert add_sub._state == "failed"
    assert not add_sub.healthy()
    with pytest.raises(BackendError) as caught:
        add_sub.execute_requests([pair(1, 1)])
    assert caught.value.fatal
    assert "crashed 2 times within 60 s" in caught.value.message
    assert "not restarting" in caught.value.message


AUTO_COMPLETE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_INT32",
                                               "dims": [2]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)]) for r in requests]
"""


def test_auto_complete_config_fills_the_config(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "doubler", AUTO_COMPLETE, "")
    config = parse_config_text('backend: "python"', model_dir / "config.pbtxt")
    normalize(config, "doubler", model_dir, [model_dir / "1"])
    assert config.max_batch_size == 4 and config.HasField("dynamic_batching")
    assert [t.name for t in config.input] == ["IN"] and list(config.input[0].dims) == [2]
    assert [t.name for t in config.output] == ["OUT"]
    backend = PythonBackend(
        config, model_dir, model_dir / "1", InstanceSpec("doubler_0", "KIND_CPU", 0, 0)
    )
    backend.load()
    try:
        out = backend.execute_requests([{"IN": np.array([[1, 2]], np.int32)}])[0]["OUT"]
        assert out.tolist() == [[2, 4]]
    finally:
        backend.unload()


def test_worker_dying_during_initialize_is_a_load_error(tmp_path: Path) -> None:
    source = """
    import os

    class TritonPythonModel:
        def initialize(self, args):
            os._exit(3)
    """
    config_text = ADD_SUB_CONFIG % ""
    backend = make_backend(write_model(tmp_path, "add_sub", source, config_text), config_text)
    with pytest.raises(BackendError, match="exited with code 3 during initialize"):
        backend.load()
