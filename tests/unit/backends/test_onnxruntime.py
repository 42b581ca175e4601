"""The ONNX Runtime backend: execution, BYTES conversion and config/model mismatch checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.base import BackendError, InstanceSpec
from backends.onnxruntime import OnnxRuntimeBackend
from examples.build_repository import build_identity_bytes, build_simple
from protocol.proto.model_config_pb2 import ModelConfig
from repository.config import normalize, read_config


def _backend(model_dir: Path) -> OnnxRuntimeBackend:
    config = read_config(model_dir)
    normalize(config, model_dir.name, model_dir, [model_dir / "1"])
    return OnnxRuntimeBackend(
        config, model_dir, model_dir / "1", InstanceSpec("i_0", "KIND_CPU", 0, 0)
    )


def test_executes_a_batch(tmp_path: Path) -> None:
    backend = _backend(build_simple(tmp_path))
    backend.load()
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    out = backend.execute({"INPUT0": a, "INPUT1": np.ones_like(a)})
    np.testing.assert_array_equal(out["OUTPUT0"], a + 1)
    np.testing.assert_array_equal(out["OUTPUT1"], a - 1)


def test_bytes_tensors_round_trip_as_bytes(tmp_path: Path) -> None:
    backend = _backend(build_identity_bytes(tmp_path))
    backend.load()
    data = np.array([b"x", b"", "\u00e9".encode()], dtype=object)
    out = backend.execute({"INPUT": data})["OUTPUT"]
    assert list(out) == list(data) and all(isinstance(item, bytes) for item in out)


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("dims: [ 16 ]", "dims: [ 32 ]", "has dims [32] in the config but [16] in the model"),
        ('name: "INPUT1"', 'name: "INPUT9"', "unexpected input 'INPUT9'"),
        (
            "data_type: TYPE_INT32",
            "data_type: TYPE_FP32",
            "is TYPE_FP32 in the config but tensor(int32)",
        ),
    ],
)
def test_a_config_that_does_not_match_the_model_fails_to_load(
    tmp_path: Path, old, new, message
) -> None:
    model_dir = build_simple(tmp_path)
    config_path = model_dir / "config.pbtxt"
    text = config_path.read_text()
    assert old in text
    config_path.write_text(text.replace(old, new, 1))
    backend = _backend(model_dir)
    with pytest.raises(BackendError) as info:
        backend.load()
    assert message in info.value.message and "'simple'" in info.value.message


def _config_with(text: str) -> ModelConfig:
    from google.protobuf import text_format

    return text_format.Parse('name: "m" ' + text, ModelConfig())


def test_server_defaults_leave_the_loop_a_cpu_and_do_not_spin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from backends import onnxruntime as backend_module

    monkeypatch.setattr(backend_module.os, "sched_getaffinity", lambda pid: set(range(9)))
    one = backend_module.session_options(_config_with("instance_group [{ count: 1 }]"))
    assert one.intra_op_num_threads == 8
    assert one.get_session_config_entry(backend_module.SPINNING_KEY) == "0"
    four = _config_with("instance_group [{ count: 2 }, { count: 2 }]")
    assert backend_module.session_options(four).intra_op_num_threads == 2
    monkeypatch.setattr(backend_module.os, "sched_getaffinity", lambda pid: {0})
    assert backend_module.session_options(four).intra_op_num_threads == 1


def test_config_parameters_override_the_defaults() -> None:
    from backends import onnxruntime as backend_module

    options = backend_module.session_options(
        _config_with(
            'parameters { key: "intra_op_thread_count" value: { string_value: "3" } } '
            'parameters { key: "session.intra_op.allow_spinning" value: { string_value: "1" } }'
        )
    )
    assert options.intra_op_num_threads == 3
    assert options.get_session_config_entry(backend_module.SPINNING_KEY) == "1"


def test_a_config_that_leaves_a_model_input_unfed_fails_to_load(tmp_path: Path) -> None:
    """A config may declare no tensors at all (Triton's rule), but the model must get every
    input it has: otherwise each request would fail inside ONNX Runtime."""
    from google.protobuf import text_format

    model_dir = build_simple(tmp_path)
    config = read_config(model_dir)
    del config.input[1]
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
    with pytest.raises(BackendError) as info:
        _backend(model_dir).load()
    assert "the model's inputs ['INPUT1'] are not in the config" in info.value.message
