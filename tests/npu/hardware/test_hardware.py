"""On an Atlas box: the Ascend backend with the real pyACL, for each kind of model the user points
it at (paths in ASCEND_SERVE_OM_*, see conftest.py): loaded, run at every gear (batch size or
image size) with zero-filled inputs, released with nothing left over, and served over HTTP.
Where the description of a kind is what the backend relies on (dynamic AIPP, YUV420SP image
sizes, --dynamic_dims gears), a test says what GE reported: each dims gear comes back from
get_input_dynamic_dims with an empty name and the full dims, is taken back as reported by
set_input_dynamic_dims, and get_cur_output_dims follows it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from backends.base import InstanceSpec
from npu.backend import AscendBackend
from npu.description import ModelDescription
from npu.om_model import describe_file
from protocol.datatypes import BY_CONFIG_NAME, numpy_to_wire
from protocol.proto.model_config_pb2 import DataType, ModelConfig
from tests.npu.hardware.hw_models import config_text, om_path

KINDS = ["static", "dynamic", "aipp", "dynamic_aipp", "image_size", "yuv_image_size", "dims"]


def _extra(kind: str) -> str:
    """Config text a kind needs: the dims model's --input_shape, where given."""
    order = os.environ.get("ASCEND_SERVE_OM_DIMS_INPUT_SHAPE", "")
    if kind != "dims" or not order:
        return ""
    return f'parameters {{ key: "input_shape" value {{ string_value: "{order}" }} }}\n'


def _model_dir(tmp_path: Path, kind: str, device_id: int) -> tuple[ModelConfig, Path, Path]:
    om = om_path(kind)
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    shutil.copyfile(om, model_dir / "1" / "model.om")
    group = f"instance_group [{{ kind: KIND_GPU, gpus: [{device_id}] }}]"
    text = f'name: "m"\nbackend: "ascend"\n{group}\n' + config_text(kind) + _extra(kind)
    (model_dir / "config.pbtxt").write_text(text)
    config = text_format.Parse(text, ModelConfig())
    AscendBackend.auto_complete(config, model_dir, model_dir / "1")
    return config, model_dir, model_dir / "1"


def _zeros(config: ModelConfig, shape: list[int] | tuple[int, ...], name: str) -> np.ndarray:
    entry = next(e for e in config.input if e.name == name)
    return np.zeros(shape, dtype=BY_CONFIG_NAME[DataType.Name(entry.data_type)].numpy)


def _runs(config: ModelConfig, info: ModelDescription) -> list[tuple[dict[str, np.ndarray], int]]:
    """Zero inputs for every gear, with the rows each carries."""
    if info.shape_gears:  # one array per input at the gear's own shape (axis 0 the batch)
        return [
            (
                {
                    t.name: _zeros(config, shape, t.name)
                    for t, shape in zip(info.inputs, gear, strict=True)
                },
                0,
            )
            for gear in info.shape_gears
        ]
    runs = []
    for rows in info.batch_sizes if config.max_batch_size else (0,):
        arrays = {
            e.name: _zeros(config, ([rows] if rows else []) + list(e.dims), e.name)
            for e in config.input
        }
        runs.append((arrays, rows))
    return runs


@pytest.mark.parametrize("kind", KINDS)
def test_loads_runs_every_gear_and_releases(kind, tmp_path, device_id):
    config, model_dir, version_dir = _model_dir(tmp_path, kind, device_id)
    instance = AscendBackend(
        config, model_dir, version_dir, InstanceSpec("m_0", "KIND_GPU", device_id, 0)
    )
    instance.load()
    try:
        for arrays, rows in _runs(config, instance._model.info):
            outputs = instance.execute(arrays)
            for entry in config.output:
                assert entry.name in outputs
                if rows:
                    assert outputs[entry.name].shape[0] == rows
    finally:
        instance.unload()
    assert instance.healthy()


def test_dynamic_aipp_input_reads_as_n_and_minus_ones(device_id):
    """GE (aipp_op.cc CreateAippData) reports the image input as [N, -1, -1, -1] from both dims
    calls and sizes it by max_src_image_size; the backend shows the configured source instead."""
    info = describe_file(om_path("dynamic_aipp"), device_id)
    target = next(t for t in info.inputs if t.aipp == "dynamic")
    assert len(target.dims) == 4 and target.dims[1:] == (-1, -1, -1), target
    assert info.aipp_index is not None and target.size > 0


def test_yuv_image_size_input_is_recognised_as_yuv420sp(device_id):
    """Static AIPP YUV420SP under --dynamic_image_size: v2 dims [N, -1, -1, 1] where
    get_input_dims shows 3 channels; the gears are then written with 1.5 x H source rows."""
    info = describe_file(om_path("yuv_image_size"), device_id)
    target = next(t for t in info.inputs if t.aipp == "static")
    assert target.source_rows == 1.5, target
    assert info.shape_kind == "hw" and info.shape_gears


def test_dims_gears_as_ge_reports_and_takes_them(tmp_path, device_id):
    """What npu/dims.py and the emulator assume of GE, on the real binding."""
    config, model_dir, version_dir = _model_dir(tmp_path, "dims", device_id)
    instance = AscendBackend(
        config, model_dir, version_dir, InstanceSpec("m_0", "KIND_GPU", device_id, 0)
    )
    instance.load()
    try:
        model = instance._model
        acl, desc = model.acl, model.desc
        count, ret = acl.mdl.get_input_dynamic_gear_count(desc, -1)
        assert ret == 0 and count == len(model.info.shape_gears)
        gears, ret = acl.mdl.get_input_dynamic_dims(desc, -1, count)
        assert ret == 0
        ranks = sum(len(t.dims) for t in model.info.inputs)
        for gear in gears:
            assert gear["name"] == "" and gear["dimCount"] <= ranks
            assert gear["dimCount"] == len(gear["dims"])
        assert sorted(tuple(g["dims"]) for g in gears) == sorted(model.info.dims_flat)
        for arrays, _ in _runs(config, model.info):
            outputs = instance.execute(arrays)  # each gear set as reported, then run
            for index, tensor in enumerate(model.info.outputs):
                dims, ret = acl.mdl.get_cur_output_dims(desc, index)
                assert ret == 0 and list(outputs[tensor.name].shape) == dims["dims"]
    finally:
        instance.unload()


@pytest.mark.e2e
@pytest.mark.parametrize("kind", KINDS)
def test_served_over_http(kind, tmp_path, device_id):
    import tritonclient.http as httpclient

    from harness.serverproc import running_server

    config, model_dir, _ = _model_dir(tmp_path / "repo", kind, device_id)
    info = describe_file(model_dir / "1" / "model.om", device_id)
    if info.shape_gears:  # the smallest image size / dims gear
        arrays = _runs(config, info)[0][0]
    else:
        rows = [1] if config.max_batch_size else []
        arrays = {e.name: _zeros(config, rows + list(e.dims), e.name) for e in config.input}
    with running_server([model_dir.parent], log_dir=tmp_path) as server:
        with httpclient.InferenceServerClient(server.http_url) as client:
            inputs = []
            for name, array in arrays.items():
                tensor = httpclient.InferInput(name, list(array.shape), numpy_to_wire(array.dtype))
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            result = client.infer("m", inputs)
        assert all(result.as_numpy(o.name) is not None for o in config.output)
