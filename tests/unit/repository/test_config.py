"""config.pbtxt parsing, Triton's normalisation and ONNX auto-complete, seen through the /config
JSON (protocol/config_json.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.build_repository import build_simple, make_simple_model
from protocol.config_json import config_to_json
from repository.config import ConfigError, normalize, parse_config_text, read_config


def _versions(model_dir: Path) -> list[Path]:
    return sorted(p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def test_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    with pytest.raises(ConfigError) as info:
        parse_config_text(
            'name: "m"\nmax_batch_size: 8\ninput [ { name: "x" dims: [ 1, ] } ]\nbogus_field: 3\n',
            path,
        )
    message = str(info.value)
    assert str(path) in message
    assert ":3:" in message or ":4:" in message


def test_unknown_field_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="bogus_field"):
        parse_config_text('name: "m"\nbogus_field: 3\n', tmp_path / "config.pbtxt")


def test_existing_triton_config_normalises_like_triton(tmp_path: Path) -> None:
    model_dir = build_simple(tmp_path)
    config = read_config(model_dir)
    normalize(config, "simple", model_dir, _versions(model_dir))
    data = config_to_json(config)
    assert data["name"] == "simple"
    assert data["backend"] == "onnxruntime"
    assert data["platform"] == "onnxruntime_onnx"
    assert data["version_policy"] == {"latest": {"num_versions": 1}}
    assert data["default_model_filename"] == "model.onnx"
    group = data["instance_group"][0]
    assert group["kind"] == "KIND_CPU" and group["count"] == 2 and group["name"] == "simple"
    # int64 fields are JSON numbers and every scalar default is printed
    assert data["input"][0]["dims"] == [16]
    assert data["input"][0]["is_shape_tensor"] is False
    assert data["runtime"] == ""
    # no scheduler block is printed when none is set (perf_analyzer relies on that)
    assert "dynamic_batching" not in data and "sequence_batching" not in data


def test_auto_complete_fills_a_missing_config_from_the_onnx_file(tmp_path: Path) -> None:
    import onnx

    model_dir = tmp_path / "bare"
    (model_dir / "1").mkdir(parents=True)
    onnx.save(make_simple_model(), str(model_dir / "1" / "model.onnx"))
    config = read_config(model_dir)
    normalize(config, "bare", model_dir, _versions(model_dir))
    assert config.backend == "onnxruntime"
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert [o.name for o in config.output] == ["OUTPUT0", "OUTPUT1"]
    assert list(config.input[0].dims) == [16]
    # a batchable model gets Triton's default batching
    assert config.max_batch_size == 4
    assert list(config.dynamic_batching.preferred_batch_size) == [4]
    assert config_to_json(config)["dynamic_batching"]["max_queue_delay_microseconds"] == 0


def test_auto_complete_can_be_disabled(tmp_path: Path) -> None:
    import onnx

    model_dir = tmp_path / "bare"
    (model_dir / "1").mkdir(parents=True)
    onnx.save(make_simple_model(), str(model_dir / "1" / "model.onnx"))
    config = normalize(
        read_config(model_dir), "bare", model_dir, _versions(model_dir), auto_complete=False
    )
    # Nothing was read from the model; a config with no tensors is valid, as in Triton (the
    # ONNX Runtime backend refuses it at load for this model, which has inputs).
    assert not config.input and not config.output
    config = normalize(read_config(model_dir), "bare", model_dir, _versions(model_dir))
    assert [t.name for t in config.input] == ["INPUT0", "INPUT1"]


def test_name_must_match_directory(tmp_path: Path) -> None:
    model_dir = build_simple(tmp_path)
    config = read_config(model_dir)
    config.name = "other"
    with pytest.raises(ConfigError, match="must match the model directory name"):
        normalize(config, "simple", model_dir, _versions(model_dir))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.input[0].dims.__setitem__(0, 0), "input 'INPUT0' has invalid dims"),
        (lambda c: c.dynamic_batching.preferred_batch_size.append(99), "preferred_batch_size 99"),
        (lambda c: setattr(c, "backend", "tensorflow"), "unknown backend 'tensorflow'"),
    ],
)
def test_validation_errors_name_model_and_field(tmp_path: Path, edit, message: str) -> None:
    model_dir = build_simple(tmp_path)
    config = read_config(model_dir)
    edit(config)
    with pytest.raises(ConfigError) as info:
        normalize(config, "simple", model_dir, _versions(model_dir))
    assert "simple" in str(info.value) and message in str(info.value)


@pytest.mark.parametrize("backend, count", [("onnxruntime", 2), ("python", 1), ("identity", 1)])
def test_a_cpu_group_without_a_count_gets_tritons_default(
    tmp_path: Path, backend: str, count: int
) -> None:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    config = parse_config_text(
        f'backend: "{backend}"\ninstance_group [ {{ kind: KIND_CPU }} ]\n'
        'input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]\n',
        model_dir / "config.pbtxt",
    )
    normalize(config, "m", model_dir, [], auto_complete=False)
    assert config.instance_group[0].count == count
