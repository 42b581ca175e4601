"""protocol/config_json.py: the ModelConfig message <-> Triton's config JSON."""

from __future__ import annotations

import pytest

from protocol.config_json import ConfigJsonError, config_from_json, config_to_json
from protocol.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup


def test_int64_fields_are_numbers_and_map_keys_stay_strings() -> None:
    config = ModelConfig(name="m", max_batch_size=4)
    config.input.add(name="x", dims=[-1, 16])
    config.dynamic_batching.max_queue_delay_microseconds = 100
    config.dynamic_batching.priority_queue_policy[2].default_timeout_microseconds = 5
    data = config_to_json(config)
    assert data["input"][0]["dims"] == [-1, 16]
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    policy = data["dynamic_batching"]["priority_queue_policy"]
    assert list(policy) == ["2"] and policy["2"]["default_timeout_microseconds"] == 5
    assert "sequence_batching" not in data  # unset messages are left out


def test_round_trip() -> None:
    config = ModelConfig(name="m", backend="onnxruntime", max_batch_size=8)
    config.output.add(name="y", dims=[3])
    import orjson

    assert config_from_json(orjson.dumps(config_to_json(config)).decode()) == config


def test_bad_json_is_a_config_json_error() -> None:
    with pytest.raises(ConfigJsonError, match="^failed to parse the config override: ") as info:
        config_from_json('{"max_batch_size": "many"}')
    assert isinstance(info.value, ValueError)


def test_a_repeated_field_given_one_object_reads_as_a_list_of_one() -> None:
    """Triton reads `"instance_group": {...}` as a list of one (qa's L0_lifecycle sends it)."""
    config = config_from_json(
        '{"instance_group": {"kind": "KIND_CPU", "count": 5}, '
        '"input": {"name": "A", "data_type": "TYPE_FP32", "dims": 4}, '
        '"parameters": {"k": {"string_value": "v"}}}'
    )
    assert [(g.kind, g.count) for g in config.instance_group] == [(ModelInstanceGroup.KIND_CPU, 5)]
    assert [(t.name, list(t.dims)) for t in config.input] == [("A", [4])]
    assert config.parameters["k"].string_value == "v"
    with pytest.raises(ConfigJsonError, match="failed to parse the config override"):
        config_from_json('{"instance_group": 3}')
    with pytest.raises(ConfigJsonError, match="failed to parse the config override"):
        config_from_json('["not", "an", "object"]')
