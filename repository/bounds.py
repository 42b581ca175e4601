"""The bounds of every number a config sets that the server allocates, loops or waits by.

A config can come from the network (a load request's `config` override), so a number in it
must not make the server build four million sequence slots, run a warm-up 2^32 times or map a
petabyte ring. Each such number is checked here, once, when the config is normalised and
before any work proportional to it (repository/config.py calls `check` ahead of `validate`,
whose sequence settings already allocate initial states). A number past its bound refuses the
load with a reason that names the field, the value and the bound, and the flag that raises it
where an operator may need more (`ModelBounds`, from server/settings.py).

Triton sets none of these limits (its fields are 32-bit), so the defaults are ours: far above
what a real model asks for, far below what stalls the server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.base import ParameterBound
from protocol import datatypes

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig

MIB = 1 << 20


@dataclass(frozen=True)
class ModelBounds:
    """The limits a config must keep, each set by the flag named beside it."""

    max_batch_size: int = 1 << 20  # --model-max-batch-size
    max_instances: int = 128  # --model-max-instances: instances of one model version
    max_sequence_slots: int = 65536  # --model-max-sequence-slots: over a version's instances
    max_warmup_requests: int = 65536  # --model-warmup-max-requests: batch_size x count, summed
    max_config_tensor_bytes: int = 64 * MIB  # --model-config-max-tensor-bytes
    max_response_ring_bytes: int = 1 << 30  # --python-max-response-ring-bytes
    max_delay_secs: float = 86400.0  # --model-max-delay-secs: queue delays, sequence idle time


DEFAULT_BOUNDS = ModelBounds()

FLAGS = {
    "max_batch_size": "--model-max-batch-size",
    "max_instances": "--model-max-instances",
    "max_sequence_slots": "--model-max-sequence-slots",
    "max_warmup_requests": "--model-warmup-max-requests",
    "max_config_tensor_bytes": "--model-config-max-tensor-bytes",
    "max_response_ring_bytes": "--python-max-response-ring-bytes",
    "max_delay_secs": "--model-max-delay-secs",
}


class BoundExceeded(ValueError):
    """A config number past its bound; the text names the field, the value and the bound."""


def _over(what: str, value: int, bounds: ModelBounds, setting: str) -> BoundExceeded:
    limit = getattr(bounds, setting)
    return BoundExceeded(f"{what} {value} exceeds the limit {limit} (set by {FLAGS[setting]})")


def _limit(what: str, value: int, bounds: ModelBounds, setting: str) -> None:
    if value > getattr(bounds, setting):
        raise _over(what, value, bounds, setting)


def check(
    config: ModelConfig, bounds: ModelBounds, parameters: Mapping[str, ParameterBound]
) -> None:
    """Raise BoundExceeded for the first number of `config` past its bound. `parameters` are
    the backend's numeric parameters (backends/base.py `Backend.parameter_bounds`). Costs
    O(size of the config): nothing here is proportional to a value it checks."""
    _limit("max_batch_size", int(config.max_batch_size), bounds, "max_batch_size")
    instances = _instances(config, bounds)
    if config.HasField("sequence_batching"):
        _check_sequence(config, bounds, instances)
    _check_warmup(config, bounds)
    _check_delays(config, bounds)
    _check_parameters(config, bounds, parameters)


def _instances(config: ModelConfig, bounds: ModelBounds) -> int:
    total = 0
    for group in config.instance_group:
        count = max(1, int(group.count))
        _limit(f"instance_group '{group.name}' count", count, bounds, "max_instances")
        devices = len(group.gpus) if group.kind == group.KIND_GPU and len(group.gpus) else 1
        total += count * devices
    _limit("instances (count x gpus over all instance groups)", total, bounds, "max_instances")
    return max(1, total)


def _check_sequence(config: ModelConfig, bounds: ModelBounds, instances: int) -> None:
    sequence = config.sequence_batching
    if sequence.WhichOneof("strategy_choice") == "oldest":
        what = "sequence_batching oldest max_candidate_sequences"
        per_instance = max(1, int(sequence.oldest.max_candidate_sequences))
    else:  # direct: one slot per batch row
        what = "sequence_batching direct slots (max_batch_size)"
        per_instance = max(1, int(config.max_batch_size))
    _limit(what, per_instance, bounds, "max_sequence_slots")
    _limit(
        f"sequence slots ({per_instance} x {instances} instances)",
        per_instance * instances,
        bounds,
        "max_sequence_slots",
    )
    for state in sequence.state:
        itemsize = _itemsize(state.data_type)
        shapes = [list(state.dims)] + [list(init.dims) for init in state.initial_state]
        for dims in shapes:
            _limit(
                f"sequence_batching state '{state.input_name}' bytes",
                _elements(dims) * itemsize,
                bounds,
                "max_config_tensor_bytes",
            )


def _check_warmup(config: ModelConfig, bounds: ModelBounds) -> None:
    rows_limit = max(1, int(config.max_batch_size))
    total = 0
    for sample in config.model_warmup:
        rows, count = int(sample.batch_size), max(1, int(sample.count))
        if rows > rows_limit and config.max_batch_size > 0:
            raise BoundExceeded(
                f"model_warmup '{sample.name}' batch_size {rows} exceeds "
                f"max_batch_size {config.max_batch_size}"
            )
        _limit(f"model_warmup '{sample.name}' count", count, bounds, "max_warmup_requests")
        total += rows * count
        _limit(
            "model_warmup requests (batch_size x count over all samples)",
            total,
            bounds,
            "max_warmup_requests",
        )
        for key, item in sample.inputs.items():
            _limit(
                f"model_warmup '{sample.name}' input '{key}' bytes",
                _elements(item.dims) * _itemsize(item.data_type),
                bounds,
                "max_config_tensor_bytes",
            )


def _check_delays(config: ModelConfig, bounds: ModelBounds) -> None:
    """Times a request or a sequence is held by: a delay past the bound would hold them for
    ever in practice (2^63 microseconds), and a load override is a client's choice."""
    delays = []
    if config.HasField("dynamic_batching"):
        delays.append(
            (
                "dynamic_batching max_queue_delay_microseconds",
                config.dynamic_batching.max_queue_delay_microseconds,
            )
        )
    if config.HasField("sequence_batching"):
        sequence = config.sequence_batching
        strategy = sequence.WhichOneof("strategy_choice") or "direct"
        delays.append(
            (
                f"sequence_batching {strategy} max_queue_delay_microseconds",
                getattr(sequence, strategy).max_queue_delay_microseconds,
            )
        )
        delays.append(
            (
                "sequence_batching max_sequence_idle_microseconds",
                sequence.max_sequence_idle_microseconds,
            )
        )
    limit_us = int(bounds.max_delay_secs * 1_000_000)
    for what, value in delays:
        if int(value) > limit_us:
            raise BoundExceeded(
                f"{what} {int(value)} exceeds the limit {limit_us} "
                f"({_show(bounds.max_delay_secs)} s, set by {FLAGS['max_delay_secs']})"
            )


def _check_parameters(
    config: ModelConfig, bounds: ModelBounds, parameters: Mapping[str, ParameterBound]
) -> None:
    for key, bound in parameters.items():
        if key not in config.parameters:
            continue
        text = config.parameters[key].string_value
        high = getattr(bounds, bound.setting) if bound.setting else bound.high
        value = _number(text)
        if (
            value is None
            or not bound.low <= value <= high
            or (bound.integer and value != math.floor(value))
        ):
            kind = "an integer" if bound.integer else "a number"
            where = f" (set by {bound.flag})" if bound.flag else ""
            raise BoundExceeded(
                f"parameter '{key}' must be {kind} between {_show(bound.low)} and "
                f"{_show(high)}{where}, got '{text}'"
            )


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _show(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def _elements(dims: Any) -> int:
    """Elements of a shape, -1 (any) read as 1; exact (Python ints never overflow)."""
    return math.prod(max(1, int(d)) for d in dims)


def _itemsize(data_type: int) -> int:
    """Bytes an element takes (BYTES: 8, a reference, before any content)."""
    from protocol.proto.model_config_pb2 import DataType

    try:
        wire = datatypes.BY_CONFIG_NAME[DataType.Name(data_type)]
    except (KeyError, ValueError):
        return 1
    return wire.itemsize or 8
