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
