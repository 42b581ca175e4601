"""The ModelConfig message <-> Triton's config JSON (HTTP `/config`, a load request's `config`).

A wire form like the other codecs, so it lives in protocol/: the repository reads config.pbtxt
into the message, and the frontends and the Python backend only ever need its JSON.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from protocol.proto.model_config_pb2 import ModelConfig

_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


class ConfigJsonError(ValueError):
    """Config JSON that does not parse into a ModelConfig; the caller says which model."""


def config_to_json(config: ModelConfig) -> dict[str, Any]:
    """Triton's /config JSON: proto field names, every scalar printed, 64-bit ints as numbers,
    enums by name, unset messages (and so unset scheduler blocks) left out."""
    data = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_to_numbers(config.DESCRIPTOR, data)
    return data


def _int64_to_numbers(descriptor: Any, data: dict[str, Any]) -> None:
    for field in descriptor.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            # JSON object keys stay strings; only the values are converted.
            value_field = field.message_type.fields_by_name["value"]
            for key, item in list(value.items()):
                if value_field.message_type is not None:
                    _int64_to_numbers(value_field.message_type, item)
                elif value_field.type in _INT64_TYPES:
                    value[key] = int(item)
        elif field.message_type is not None:
            items = value if isinstance(value, list) else [value]
            for item in items:
                _int64_to_numbers(field.message_type, item)
        elif field.type in _INT64_TYPES:
            data[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)


def config_from_json(text: str) -> ModelConfig:
    """A ModelConfig from the JSON a repository load request carries as its `config`. A
    repeated field given one object instead of a list of one (`"instance_group": {...}`) is
    read as that list, as Triton reads it."""
    config = ModelConfig()
    try:
        data = json.loads(text)
        if isinstance(data, dict):
            _lists_for_repeated(config.DESCRIPTOR, data)
        json_format.ParseDict(data, config)
    except (ValueError, json_format.ParseError) as exc:
        raise ConfigJsonError(f"failed to parse the config override: {exc}") from None
    return config


def _lists_for_repeated(descriptor: Any, data: dict[str, Any]) -> None:
    for key, value in data.items():
        field = descriptor.fields_by_name.get(key) or descriptor.fields_by_camelcase_name.get(key)
        if field is None:
            continue  # ParseDict names the unknown field
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            continue
        if field.is_repeated and not isinstance(value, list):
            value = data[key] = [value]
        if field.message_type is not None:
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, dict):
                    _lists_for_repeated(field.message_type, item)
