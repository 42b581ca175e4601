"""Warm-up samples become requests shaped like clients' ones (one row each), from zeros, random
values or data files inside the model's warmup/ directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from backends.onnxruntime import OnnxRuntimeBackend
from protocol import datatypes
from protocol.proto.model_config_pb2 import ModelConfig
from repository.warmup import WarmupError, build_requests
from scheduler.interface import VersionSpec
from scheduler.validation import validate_request

CONFIG = """
name: "m"
max_batch_size: %d
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, 3 ] },
        { name: "S" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]
model_warmup [ { name: "sample" batch_size: %d count: 1 inputs [
  { key: "A" value: { data_type: TYPE_FP32 dims: [ 2, 3 ] %s } },
  { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] %s } } ] } ]
"""


def spec_for(
    tmp_path: Path,
    max_batch: int = 8,
    rows: int = 2,
    a: str = "zero_data: true",
    s: str = "zero_data: true",
) -> VersionSpec:
    config = text_format.Parse(CONFIG % (max_batch, rows, a, s), ModelConfig())
    return VersionSpec("m", 1, config, tmp_path, tmp_path / "1", OnnxRuntimeBackend)


def test_zero_data_gives_one_row_per_request(tmp_path: Path) -> None:
    spec = spec_for(tmp_path)
    requests = build_requests(spec, spec.config.model_warmup[0])
    assert len(requests) == 2
    for request in requests:
        validate_request(request, spec.config)
        a, s = request.inputs
        assert (a.datatype, a.shape) == ("FP32", (1, 2, 3)) and not a.data.any()
        assert (s.datatype, s.shape) == ("BYTES", (1, 2)) and list(s.data.ravel()) == [b"", b""]
        assert request.batch_size == 1


def test_a_model_without_batching_gets_no_batch_dimension(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, max_batch=0, rows=1, a="random_data: true")
    (request,) = build_requests(spec, spec.config.model_warmup[0])
    validate_request(request, spec.config)
    assert request.inputs[0].shape == (2, 3)
    assert request.inputs[0].data.dtype == np.float32


def test_data_files_come_from_the_warmup_directory(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    values = np.arange(6, dtype=np.float32)
    (tmp_path / "warmup" / "a.bin").write_bytes(values.tobytes())
    strings = np.array([b"hi", b"there"], dtype=object)
    (tmp_path / "warmup" / "s.bin").write_bytes(datatypes.serialize_bytes(strings))
    spec = spec_for(tmp_path, rows=1, a='input_data_file: "a.bin"', s='input_data_file: "s.bin"')
    (request,) = build_requests(spec, spec.config.model_warmup[0])
    assert request.inputs[0].data.ravel().tolist() == values.tolist()
    assert list(request.inputs[1].data.ravel()) == [b"hi", b"there"]


def test_a_short_data_file_fails_naming_the_sample(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "a.bin").write_bytes(b"\0" * 8)
    spec = spec_for(tmp_path, a='input_data_file: "a.bin"')
    with pytest.raises(
        WarmupError,
        match="failed to run warmup sample 'sample': input 'A' needs 24 bytes, but 'a.bin' holds 8",
    ):
        build_requests(spec, spec.config.model_warmup[0])


@pytest.mark.parametrize("name", ["../secret", "/etc/passwd", "x/../../secret"])
def test_data_files_outside_the_warmup_directory_are_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "secret").write_bytes(b"\0" * 24)
    spec = spec_for(tmp_path, a=f'input_data_file: "{name}"')
    with pytest.raises(WarmupError, match="plain path inside"):
        build_requests(spec, spec.config.model_warmup[0])


def test_batch_size_above_one_needs_batching(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, max_batch=0, rows=2)
    with pytest.raises(WarmupError, match="batch_size 2"):
        build_requests(spec, spec.config.model_warmup[0])
