"""On an Atlas box: the Ascend backend with the real pyACL, for a static model, a dynamic-batch
model, a static-AIPP model and a --dynamic_dims model (paths in ASCEND_SERVE_OM_*, see
conftest.py), loaded, run at every gear with zero-filled inputs, released with nothing left
over, and served over HTTP. The dims model also checks what the emulator assumes of GE: each
gear comes back from get_input_dynamic_dims with an empty name and the full dims, is taken back
as reported by set_input_dynamic_dims, and get_cur_output_dims follows it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from backends.base import InstanceSpec
from npu.backend import AscendBackend
from protocol.datatypes import BY_CONFIG_NAME, numpy_to_wire
from protocol.proto.model_config_pb2 import DataType, ModelConfig
from tests.npu.hardware.hw_models import om_path

KINDS = ["static", "dynamic", "aipp", "dims"]


def _extra(kind: str) -> str:
    """Config text a kind needs: the dims model's --input_shape, where given."""
    order = os.environ.get("ASCEND_SERVE_OM_DIMS_INPUT_SHAPE", "")
    if kind != "dims" or not order:
        return ""
    return f'parameters {{ key: "input_shape" value {{ string_value: "{order}" }} }}\n'


def _model_dir(
    tmp_path: Path, om: Path, device_id: int, extra: str = ""
) -> tuple[ModelConfig, Path, Path]:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    shutil.copyfile(om, model_dir / "1" / "model.om")
    config = text_format.Parse(
        f'name: "m"\nbackend: "ascend"\ninstance_group [{{ kind: KIND_GPU, gpus: [{device_id}] }}]'
        + "\n"
        + extra,
        ModelConfig(),
    )
    AscendBackend.auto_complete(config, model_dir, model_dir / "1")
    return config, model_dir, model_dir / "1"


def _inputs(config: ModelConfig, rows: int, gear=None) -> dict[str, np.ndarray]:
    """Zero inputs; with a dims / image-size `gear` (every input's shape, model order), at it."""
    arrays = {}
    for index, entry in enumerate(config.input):
        dtype = BY_CONFIG_NAME[DataType.Name(entry.data_type)].numpy
        shape = ([rows] if config.max_batch_size else []) + list(entry.dims)
        if gear is not None:
            shape = list(gear[index])
        arrays[entry.name] = np.zeros([max(d, 1) for d in shape], dtype=dtype)
    return arrays


@pytest.mark.parametrize("kind", KINDS)
def test_loads_runs_every_gear_and_releases(kind, tmp_path, device_id):
    config, model_dir, version_dir = _model_dir(tmp_path, om_path(kind), device_id, _extra(kind))
    instance = AscendBackend(
        config, model_dir, version_dir, InstanceSpec("m_0", "KIND_GPU", device_id, 0)
    )
    instance.load()
    try:
        info = instance._model.info
        for gear in info.shape_gears:  # dims / image size: each gear at its own full shape
            outputs = instance.execute(_inputs(config, 1, gear))
            assert all(entry.name in outputs for entry in config.output)
        sizes = info.batch_sizes if config.max_batch_size else (None,)
        for rows in sizes if not info.shape_gears else ():
            outputs = instance.execute(_inputs(config, rows or 1))
            for entry in config.output:
                assert entry.name in outputs
                if rows:
                    assert outputs[entry.name].shape[0] == rows
    finally:
        instance.unload()
    assert instance.healthy()


def test_dims_gears_as_ge_reports_and_takes_them(tmp_path, device_id):
    """What npu/dims.py and the emulator assume of GE, on the real binding."""
    config, model_dir, version_dir = _model_dir(
        tmp_path, om_path("dims"), device_id, _extra("dims")
    )
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
        for gear in model.info.shape_gears:
            outputs = instance.execute(_inputs(config, 1, gear))  # set as reported, then run
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

    config, model_dir, _ = _model_dir(tmp_path / "repo", om_path(kind), device_id, _extra(kind))
    with running_server([model_dir.parent], log_dir=tmp_path) as server:
        with httpclient.InferenceServerClient(server.http_url) as client:
            inputs = []
            for name, array in _inputs(config, 1).items():
                tensor = httpclient.InferInput(name, list(array.shape), numpy_to_wire(array.dtype))
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            result = client.infer("m", inputs)
        assert all(result.as_numpy(o.name) is not None for o in config.output)
