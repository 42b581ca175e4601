"""Where Ascend instances run: instance_group gpus, the `device_ids` / `device_id` parameters
of Ascend's Triton GE backend configs, and a device id this machine does not have."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from backends.base import BackendError
from npu import config as npu_config
from npu.backend import AscendBackend
from protocol.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup
from scheduler.pool import instance_specs
from tests.support.npu_harness import backend, prepare


def parsed(text: str) -> ModelConfig:
    return text_format.Parse('name: "m"\nbackend: "ascend"\n' + text, ModelConfig())


def device_ids(value: str, key: str = "device_ids") -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


def test_device_ids_spread_instances_as_gpus_does() -> None:
    config = parsed(device_ids("0,1") + "instance_group [{ count: 2 }]")
    AscendBackend.place_instances(config)
    group = config.instance_group[0]
    assert list(group.gpus) == [0, 1] and group.kind == ModelInstanceGroup.KIND_GPU
    devices = [spec.device_id for spec, _ in instance_specs(config, "m")]
    assert devices == [0, 1, 0, 1]


def test_device_id_alone_makes_the_instance_group() -> None:
    config = parsed(device_ids(" 1 ", key="device_id"))
    npu_config.place(config)
    assert [list(g.gpus) for g in config.instance_group] == [[1]]
    assert [spec.device_id for spec, _ in instance_specs(config, "m")] == [1]


def test_device_ids_agreeing_with_gpus_is_accepted() -> None:
    config = parsed(device_ids("2,3") + "instance_group [{ kind: KIND_GPU, gpus: [2, 3] }]")
    npu_config.place(config)
    assert list(config.instance_group[0].gpus) == [2, 3]


@pytest.mark.parametrize(
    "text, message",
    [
        (device_ids("0,x"), "parameter device_ids '0,x' is not a comma-separated list of NPU ids"),
        (device_ids(""), "is not a comma-separated list of NPU ids"),
        (device_ids("-1"), "is not a comma-separated list of NPU ids"),
        (device_ids("1,1"), "lists an NPU twice"),
        (device_ids("0,1", key="device_id"), "names more than one NPU; use device_ids"),
        (device_ids("99999999999"), "no NPU id"),
        (device_ids("0") + device_ids("0", key="device_id"), "not both"),
        (
            device_ids("1") + "instance_group [{ name: 'g', kind: KIND_GPU, gpus: [0] }]",
            "instance_group 'g' lists gpus [0] but parameter device_ids says 1: keep one",
        ),
        (
            device_ids("1") + "instance_group [{ kind: KIND_CPU }]",
            "is KIND_CPU, but parameter device_ids places instances on NPUs",
        ),
    ],
)
def test_unreadable_placement_is_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(BackendError, match=message.replace("[", r"\[").replace("]", r"\]")):
        npu_config.place(parsed(text))


def test_without_the_parameters_nothing_changes() -> None:
    config = parsed("instance_group [{ kind: KIND_GPU, gpus: [1] }]")
    npu_config.place(config)
    assert list(config.instance_group[0].gpus) == [1]


def test_a_device_that_does_not_exist_refuses_the_load(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path), device=5)  # the emulator has NPUs 0 and 1
    with pytest.raises(BackendError, match=r"NPU 5 does not exist: this process sees NPUs 0-1"):
        instance_thread.run(instance.load)
    assert all(v == 0 for v in acl_emu._emu.stats().values())


# -- configs written for Ascend's Triton GE backend (`backend: "npu_ge"`) ----------------------
GE_CONFIG = """
name: "resnet"
backend: "npu_ge"
max_batch_size: 8
instance_group [{ count: 1 }]
parameters [
  { key: "device_ids", value: { string_value: "0,1" } },
  { key: "static_model", value: { string_value: "1" } },
  { key: "ge.aicoreNum", value: { string_value: "12|10" } },
  { key: "profiling", value: { string_value: "dynamic" } }
]
"""


def test_an_npu_ge_config_is_served_by_the_ascend_backend(tmp_path) -> None:
    from repository.config import normalize

    config = text_format.Parse(GE_CONFIG, ModelConfig())
    normalize(config, "resnet", tmp_path, [], auto_complete=False)
    assert config.backend == "ascend" and config.platform == "ascend_om"
    assert config.default_model_filename == "model.om"
    group = config.instance_group[0]
    assert group.kind == ModelInstanceGroup.KIND_GPU and list(group.gpus) == [0, 1]


def test_ge_backend_parameters_are_warned_about_once_per_model(caplog) -> None:
    caplog.set_level("WARNING", logger="npu.config")
    config = text_format.Parse(GE_CONFIG.replace("resnet", "resnet_warned"), ModelConfig())
    npu_config.place(config)
    npu_config.place(config)  # a reload: nothing new to say
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3, warned
    assert [w.split("'")[3] for w in warned] == ["ge.aicoreNum", "profiling", "static_model"]
    assert "has no meaning for an ATC-compiled .om; ignored" in warned[0]
    assert "device_ids" not in " ".join(warned)


def test_an_onnx_graph_where_the_om_should_be_says_to_compile_it(acl_emu, tmp_path) -> None:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(b"onnx")
    config = text_format.Parse(GE_CONFIG, ModelConfig())
    with pytest.raises(BackendError, match=r"holds model.onnx: this backend runs ATC-compiled"):
        AscendBackend.auto_complete(config, tmp_path / "m", version)
