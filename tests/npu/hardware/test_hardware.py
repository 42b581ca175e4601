"""On an Atlas box: the Ascend backend with the real pyACL, for a static model, a dynamic-batch
model and a static-AIPP model (paths in ASCEND_SERVE_OM_*, see conftest.py), loaded, run at
every gear with zero-filled inputs, released with nothing left over, and served over HTTP."""

from __future__ import annotations

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

KINDS = ["static", "dynamic", "aipp"]


def _model_dir(tmp_path: Path, om: Path, device_id: int) -> tuple[ModelConfig, Path, Path]:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    shutil.copyfile(om, model_dir / "1" / "model.om")
    config = text_format.Parse(
        f'name: "m"\nbackend: "ascend"\ninstance_group [{{ kind: KIND_GPU, gpus: [{device_id}] }}]',
        ModelConfig(),
    )
    AscendBackend.auto_complete(config, model_dir, model_dir / "1")
    return config, model_dir, model_dir / "1"


def _inputs(config: ModelConfig, rows: int) -> dict[str, np.ndarray]:
    arrays = {}
    for entry in config.input:
        dtype = BY_CONFIG_NAME[DataType.Name(entry.data_type)].numpy
        shape = ([rows] if config.max_batch_size else []) + list(entry.dims)
        arrays[entry.name] = np.zeros(shape, dtype=dtype)
    return arrays


@pytest.mark.parametrize("kind", KINDS)
def test_loads_runs_every_gear_and_releases(kind, tmp_path, device_id):
    config, model_dir, version_dir = _model_dir(tmp_path, om_path(kind), device_id)
    instance = AscendBackend(
        config, model_dir, version_dir, InstanceSpec("m_0", "KIND_GPU", device_id, 0)
    )
    instance.load()
    try:
        sizes = instance._model.info.batch_sizes if config.max_batch_size else (None,)
        for rows in sizes:
            outputs = instance.execute(_inputs(config, rows or 1))
            for entry in config.output:
                assert entry.name in outputs
                if rows:
                    assert outputs[entry.name].shape[0] == rows
    finally:
        instance.unload()
    assert instance.healthy()


@pytest.mark.e2e
@pytest.mark.parametrize("kind", KINDS)
def test_served_over_http(kind, tmp_path, device_id):
    import tritonclient.http as httpclient

    from harness.serverproc import running_server

    config, model_dir, _ = _model_dir(tmp_path / "repo", om_path(kind), device_id)
    with running_server([model_dir.parent], log_dir=tmp_path) as server:
        with httpclient.InferenceServerClient(server.http_url) as client:
            inputs = []
            for name, array in _inputs(config, 1).items():
                tensor = httpclient.InferInput(name, list(array.shape), numpy_to_wire(array.dtype))
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            result = client.infer("m", inputs)
        assert all(result.as_numpy(o.name) is not None for o in config.output)
