"""A version's `sequence_batching` block, read and checked once, and its control tensors.

Triton's sequence batcher feeds a stateful model control inputs the client never sends: START,
END, READY (a pair of false/true values in INT32, FP32 or BOOL) and CORRID (the correlation ID
in an integer type or as a string). This module turns the config into `SequenceSettings`, with
Triton's load-time errors for a config that cannot work, and builds the control tensors of one
batch slot. It knows nothing of queues or instances (scheduler/sequence/slots.py does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol.types import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig

CorrelationId = int | str

# Triton's request flags (tritonserver.h): what `request.flags()` gives a Python model.
FLAG_START = 1
FLAG_END = 2

# Triton's default for max_sequence_idle_microseconds when the config leaves it at 0.
DEFAULT_IDLE_US = 1_000_000

_KINDS = (
    "CONTROL_SEQUENCE_START",
    "CONTROL_SEQUENCE_READY",
    "CONTROL_SEQUENCE_END",
    "CONTROL_SEQUENCE_CORRID",
)
_CORRID_TYPES = {
    "TYPE_UINT64": ("UINT64", np.uint64),
    "TYPE_INT64": ("INT64", np.int64),
    "TYPE_UINT32": ("UINT32", np.uint32),
    "TYPE_INT32": ("INT32", np.int32),
    "TYPE_STRING": ("BYTES", np.object_),
}
_STATE_TYPES = {
    "TYPE_BOOL": ("BOOL", np.bool_),
    "TYPE_UINT8": ("UINT8", np.uint8),
    "TYPE_INT8": ("INT8", np.int8),
    "TYPE_INT16": ("INT16", np.int16),
    "TYPE_UINT16": ("UINT16", np.uint16),
    "TYPE_INT32": ("INT32", np.int32),
    "TYPE_UINT32": ("UINT32", np.uint32),
    "TYPE_INT64": ("INT64", np.int64),
    "TYPE_UINT64": ("UINT64", np.uint64),
    "TYPE_FP16": ("FP16", np.float16),
    "TYPE_FP32": ("FP32", np.float32),
    "TYPE_FP64": ("FP64", np.float64),
}


class SequenceConfigError(ValueError):
    """A `sequence_batching` block Triton would refuse to load; the text is Triton's."""


@dataclass(frozen=True, slots=True)
class FlagControl:
    """START, END or READY: one input holding `false` or `true` as a one-element tensor."""

    name: str
    wire: str
    false: np.ndarray  # one element, the wire dtype
    true: np.ndarray


@dataclass(frozen=True, slots=True)
class CorridControl:
    name: str
    wire: str
    dtype: type


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One implicit state: fed as `input_name`, read back from `output_name`."""

    input_name: str
    output_name: str
    wire: str
    dtype: type
    dims: tuple[int, ...]
    initial: np.ndarray | None  # None: zeros of `dims` (with -1 read as 1)


@dataclass(frozen=True)
class SequenceSettings:
    """Everything the sequence batcher reads from the config, once per loaded version."""

    model: str
    batching: bool  # max_batch_size > 0: control tensors carry a batch dimension
    oldest: bool
    slots_per_instance: int
    idle_ns: int
    delay_ns: int
    minimum_slot_utilization: float = 0.0
    preferred: frozenset = frozenset()
    max_batch: int = 1
    start: FlagControl | None = None
    end: FlagControl | None = None
    ready: FlagControl | None = None
    corrid: CorridControl | None = None
    states: tuple[StateSpec, ...] = field(default_factory=tuple)

    @property
    def extra_input_names(self) -> frozenset:
        """The inputs the batcher fills in itself (a client never sends them)."""
        names = [c.name for c in (self.start, self.end, self.ready, self.corrid) if c]
        return frozenset(names + [s.input_name for s in self.states])

    def control_tensors(self, flags: int, corrid: CorrelationId, ready: bool) -> list[Tensor]:
        """The control inputs of one slot: its flags, READY and CORRID (not-ready slots get
        false everywhere and a zero / empty correlation ID, as Triton sends them)."""
        tensors: list[Tensor] = []
        lead = (1, 1) if self.batching else (1,)
        for control, on in (
            (self.start, ready and bool(flags & FLAG_START)),
            (self.end, ready and bool(flags & FLAG_END)),
            (self.ready, ready),
        ):
            if control is not None:
                value = control.true if on else control.false
                tensors.append(Tensor(control.name, control.wire, lead, value.reshape(lead)))
        corrid_control = self.corrid
        if corrid_control is not None:
            if corrid_control.wire == "BYTES":
                text = str(corrid) if ready and corrid != 0 else ""
                data = np.empty(lead, dtype=object)
                data.fill(text.encode())
            else:
                number = corrid if ready and isinstance(corrid, int) else 0
                data = np.full(lead, number, dtype=corrid_control.dtype)
            tensors.append(Tensor(corrid_control.name, corrid_control.wire, lead, data))
        return tensors


def read_settings(config: ModelConfig) -> SequenceSettings:
    """The settings of a config that has `sequence_batching`; SequenceConfigError when Triton
    would not load it."""
    from protocol.proto.model_config_pb2 import DataType, ModelSequenceBatching

    name = config.name
    seq = config.sequence_batching
    if config.model_transaction_policy.decoupled:
        raise SequenceConfigError(
            f"sequence batching of a decoupled model is not supported "
            f"by ascend-serve (model {name})"
        )
    if seq.iterative_sequence:
        raise SequenceConfigError(
            f"sequence batching 'iterative_sequence' is not supported by "
            f"ascend-serve (model {name})"
        )
    controls = _read_controls(seq, name, ModelSequenceBatching, DataType)
    batching = config.max_batch_size > 0
    idle_us = seq.max_sequence_idle_microseconds or DEFAULT_IDLE_US
    states = tuple(_read_state(state, name, DataType) for state in seq.state)
    oldest = seq.WhichOneof("strategy_choice") == "oldest"
    max_batch = max(1, config.max_batch_size)
    if oldest:
        strategy = seq.oldest
        candidates = strategy.max_candidate_sequences
        if candidates < 0:
            raise SequenceConfigError(
                f"sequence batching oldest max_candidate_sequences must be >= 0 for {name}"
            )
        preferred = frozenset(
            size for size in strategy.preferred_batch_size if 0 < size <= max_batch
        ) or frozenset({max_batch})
        return SequenceSettings(
            name,
            batching,
            True,
            max(1, candidates or 1),
            idle_us * 1000,
            int(strategy.max_queue_delay_microseconds) * 1000,
            preferred=preferred,
            max_batch=max_batch,
            states=states,
            **controls,
        )
    direct = seq.direct
    utilization = float(direct.minimum_slot_utilization)
    if not 0.0 <= utilization <= 1.0:
        raise SequenceConfigError(
            f"sequence batching direct minimum_slot_utilization must be between 0 and 1 for {name}"
        )
    return SequenceSettings(
        name,
        batching,
        False,
        max_batch,
        idle_us * 1000,
        int(direct.max_queue_delay_microseconds) * 1000,
        minimum_slot_utilization=utilization,
        max_batch=max_batch,
        states=states,
        **controls,
    )


def _read_controls(seq, name: str, messages, data_types) -> dict:
    """START / END / READY / CORRID with Triton's checks, in Triton's words."""
    kind_enum = messages.Control.Kind
    seen_tensors: set[str] = set()
    found: dict[str, tuple[str, Any]] = {}  # Any: a ModelSequenceBatching.Control
    for control_input in seq.control_input:
        if not control_input.name:
            raise SequenceConfigError(
                f"sequence batching control tensor must have a name for {name}"
            )
        if control_input.name in seen_tensors:
            raise SequenceConfigError(
                f"sequence batching control tensor '{control_input.name}' "
                f"is specified for multiple control kinds for {name}"
            )
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            kind = kind_enum.Name(control.kind)
            if kind in found:
                raise SequenceConfigError(
                    f"sequence batching specifies multiple {kind} tensors for {name}"
                )
            found[kind] = (control_input.name, control)
    result: dict = {}
    for kind, key in (
        ("CONTROL_SEQUENCE_START", "start"),
        ("CONTROL_SEQUENCE_END", "end"),
        ("CONTROL_SEQUENCE_READY", "ready"),
    ):
        if kind in found:
            result[key] = _flag_control(*found[kind], kind, name)
    if "CONTROL_SEQUENCE_CORRID" in found:
        tensor, control = found["CONTROL_SEQUENCE_CORRID"]
        if (
            len(control.int32_false_true)
            or len(control.fp32_false_true)
            or len(control.bool_false_true)
        ):
            raise SequenceConfigError(
                "sequence batching must not specify either 'int32_false_true', "
                "'fp32_false_true' nor 'bool_false_true' for CONTROL_SEQUENCE_CORRID for "
                f"{name}"
            )
        typed = _CORRID_TYPES.get(data_types.Name(control.data_type))
        if typed is None:
            raise SequenceConfigError(
                "unexpected control data type, expected TYPE_UINT64, TYPE_INT64, TYPE_UINT32, "
                f"TYPE_INT32, or TYPE_STRING for CONTROL_SEQUENCE_CORRID for {name}"
            )
        result["corrid"] = CorridControl(tensor, typed[0], typed[1])
    return result


def _flag_control(tensor: str, control, kind: str, name: str) -> FlagControl:
    given = [
        (label, values, wire, dtype)
        for label, values, wire, dtype in (
            ("int32_false_true", list(control.int32_false_true), "INT32", np.int32),
            ("fp32_false_true", list(control.fp32_false_true), "FP32", np.float32),
            ("bool_false_true", list(control.bool_false_true), "BOOL", np.bool_),
        )
        if values
    ]
    if not given:
        raise SequenceConfigError(
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true' for {kind} for {name}"
        )
    if len(given) > 1:
        raise SequenceConfigError(
            "sequence batching specifies more than one of 'int32_false_true', "
            f"'fp32_false_true' and 'bool_false_true' for {kind} for {name}"
        )
    label, values, wire, dtype = given[0]
    if len(values) != 2:
        raise SequenceConfigError(
            f"sequence batching control '{label}' must have exactly 2 entries for {kind} for {name}"
        )
    return FlagControl(
        tensor, wire, np.array([values[0]], dtype=dtype), np.array([values[1]], dtype=dtype)
    )


def _read_state(state, name: str, data_types) -> StateSpec:
    if not state.input_name or not state.output_name:
        raise SequenceConfigError(
            f"sequence batching state must specify both input_name and output_name for {name}"
        )
    typed = _STATE_TYPES.get(data_types.Name(state.data_type))
    if typed is None:
        raise SequenceConfigError(
            f"sequence batching state '{state.input_name}' has an unsupported data_type for {name}"
        )
    dims = tuple(int(d) for d in state.dims)
    if not dims:
        raise SequenceConfigError(
            f"sequence batching state '{state.input_name}' must specify dims for {name}"
        )
    initial: np.ndarray | None = None
    if len(state.initial_state) > 1:
        raise SequenceConfigError(
            f"sequence batching state '{state.input_name}' can have at "
            f"most one initial_state for {name}"
        )
    for init in state.initial_state:
        init_dims = tuple(int(d) for d in init.dims) or tuple(max(1, d) for d in dims)
        if init.WhichOneof("state_data") == "data_file":
            raise SequenceConfigError(
                f"sequence batching state '{state.input_name}': "
                f"initial_state data_file is not supported for {name}"
            )
        initial = np.zeros(init_dims, dtype=typed[1])
    return StateSpec(state.input_name, state.output_name, typed[0], typed[1], dims, initial)


def parse_correlation_id(value: object) -> CorrelationId:
    """The `sequence_id` parameter as the batcher keys sequences: an int (uint64) or a str;
    0 or "" when the request has none."""
    if value is None or isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value % (1 << 64)  # an int64 parameter carries uint64 bit patterns
    if isinstance(value, str):
        return value
    return 0
