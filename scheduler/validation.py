"""Check a decoded request against its model config, once, before it is queued.

Sets the scheduling fields the batcher relies on (batch_size, priority, timeout_us). Messages
follow Triton's core wording, prefixed with the request id, so clients see familiar text.
"""
from __future__ import annotations

from typing import Any

from protocol import datatypes
from protocol.errors import InvalidArgument
from protocol.model_config_pb2 import DataType, ModelConfig
from protocol.types import InferRequest


def _prefix(request: InferRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "


def _fmt(shape: Any) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


def _shape_matches(expected: list[int], actual: tuple[int, ...]) -> bool:
    return len(expected) == len(actual) and all(e == -1 or e == a for e, a in zip(expected, actual))


def validate_request(request: InferRequest, config: ModelConfig) -> None:
    """Raise InvalidArgument naming the offending input/output; fill scheduling fields."""
    prefix = _prefix(request)
    model = config.name
    expected = {tensor.name: tensor for tensor in config.input}
    given: dict[str, Any] = {}
    for tensor in request.inputs:
        if tensor.name in given:
            raise InvalidArgument(f"{prefix}input '{tensor.name}' already exists in request")
        if tensor.name not in expected:
            raise InvalidArgument(f"{prefix}unexpected inference input '{tensor.name}' for model "
                                  f"'{model}'")
        given[tensor.name] = tensor
    required = [t.name for t in config.input if not t.optional]
    missing = [name for name in required if name not in given]
    if missing:
        raise InvalidArgument(
            f"{prefix}expected {len(required)} inputs but got {len(given)} inputs for model "
            f"'{model}'. Got input(s) {sorted(given)}, but missing required input(s) {missing}. "
            f"Please provide all required input(s).")

    batching = config.max_batch_size > 0
    batch_size = 0
    for tensor in request.inputs:
        spec = expected[tensor.name]
        wanted = datatypes.config_to_wire(DataType.Name(spec.data_type))
        if tensor.datatype != wanted:
            raise InvalidArgument(f"{prefix}inference input '{tensor.name}' data-type is "
                                  f"'{tensor.datatype}', but model '{model}' expects '{wanted}'")
        dims = list(spec.dims)
        shape = tensor.shape
        if batching:
            if len(shape) == 0:
                raise InvalidArgument(f"{prefix}unexpected shape for input '{tensor.name}' for "
                                      f"model '{model}'. Expected {_fmt([-1] + dims)}, got []")
            rows = shape[0]
            if batch_size == 0:
                batch_size = rows
            elif rows != batch_size:
                raise InvalidArgument(f"{prefix}input '{tensor.name}' batch size does not match "
                                      f"other inputs for '{model}'")
            inner = shape[1:]
        else:
            inner = shape
        if not _shape_matches(dims, tuple(inner)):
            shown = [-1] + dims if batching else dims
            raise InvalidArgument(f"{prefix}unexpected shape for input '{tensor.name}' for model "
                                  f"'{model}'. Expected {_fmt(shown)}, got {_fmt(shape)}")
        if spec.HasField("reshape"):
            target = ([rows] if batching else []) + [int(d) for d in spec.reshape.shape]
            tensor.data = tensor.data.reshape(target)
            tensor.shape = tuple(target)
    if batching:
        if batch_size < 1 or batch_size > config.max_batch_size:
            raise InvalidArgument(f"{prefix}inference request batch-size must be <= "
                                  f"{config.max_batch_size} for '{model}'")
    request.batch_size = batch_size

    if request.outputs is not None:
        known = {tensor.name for tensor in config.output}
        seen: set[str] = set()
        for output in request.outputs:
            if output.name not in known:
                raise InvalidArgument(f"{prefix}unexpected inference output '{output.name}' for "
                                      f"model '{model}'")
            if output.name in seen:
                raise InvalidArgument(f"{prefix}output '{output.name}' already exists in request")
            seen.add(output.name)
    _apply_schedule_parameters(request, config)


def _uint_parameter(request: InferRequest, key: str) -> int:
    value = request.parameters.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"{_prefix(request)}parameter '{key}' must be a non-negative "
                              f"integer, got {value!r}")
    return value


def _apply_schedule_parameters(request: InferRequest, config: ModelConfig) -> None:
    """Map the `priority` and `timeout` parameters onto the model's queue policy."""
    priority = _uint_parameter(request, "priority")
    timeout = _uint_parameter(request, "timeout")
    if not config.HasField("dynamic_batching"):
        request.priority = 0
        request.timeout_us = 0
        return
    batching = config.dynamic_batching
    levels = batching.priority_levels
    if levels:
        request.priority = priority if 1 <= priority <= levels else batching.default_priority_level
    else:
        request.priority = 0
    policy = batching.default_queue_policy
    if request.priority and request.priority in batching.priority_queue_policy:
        policy = batching.priority_queue_policy[request.priority]
    effective = policy.default_timeout_microseconds
    # Triton applies an override only when it shortens a non-zero default.
    if policy.allow_timeout_override and timeout and timeout < effective:
        effective = timeout
    request.timeout_us = effective
