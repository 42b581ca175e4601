"""Check a decoded request against its model config, once, before it is queued.

Sets the scheduling fields the batcher relies on: batch_size here, priority level and queue
timeout through the version's queue policy (scheduler/policy.py). Messages follow Triton's core
wording, prefixed with the request id, so clients see familiar text.
"""

from __future__ import annotations

from typing import Any

from protocol import datatypes
from protocol.errors import InvalidArgument
from protocol.proto.model_config_pb2 import DataType, ModelConfig
from protocol.text import shown
from protocol.types import InferRequest
from scheduler.policy import QueuePolicy

# Signatures remembered per loaded version (RequestRules.valid): a bound on the table, not
# on what is served; past it every request is checked in full.
VALID_SIGNATURES = 64


def _prefix(request: InferRequest) -> str:
    return f"[request id: {shown(request.id) if request.id else '<id_unknown>'}] "


def _fmt(shape: Any) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


def _shape_matches(expected: tuple[int, ...], actual: tuple[int, ...]) -> bool:
    if len(expected) != len(actual):
        return False
    for want, got in zip(expected, actual, strict=False):
        if want != -1 and want != got:
            return False
    return True


class _InputRule:
    __slots__ = ("wire", "dims", "reshape")

    def __init__(self, wire: str, dims: tuple[int, ...], reshape: tuple[int, ...] | None):
        self.wire = wire
        self.dims = dims
        self.reshape = reshape


class RequestRules:
    """What validation needs from a model config, read out of the protobuf once per loaded
    version (protobuf field access and enum names cost more than the checks themselves)."""

    __slots__ = (
        "model",
        "max_batch_size",
        "inputs",
        "required",
        "outputs",
        "queue_policy",
        "decoupled",
        "memoizes",
        "valid",
    )

    def __init__(self, config: ModelConfig) -> None:
        self.model = config.name
        self.max_batch_size = int(config.max_batch_size)
        self.inputs = {
            spec.name: _InputRule(
                datatypes.config_to_wire(DataType.Name(spec.data_type)),
                tuple(int(d) for d in spec.dims),
                tuple(int(d) for d in spec.reshape.shape) if spec.HasField("reshape") else None,
            )
            for spec in config.input
        }
        self.required = [spec.name for spec in config.input if not spec.optional]
        self.outputs = frozenset(spec.name for spec in config.output)
        # Answers any number of times, through the request's stream (protocol/stream.py).
        self.decoupled = bool(config.model_transaction_policy.decoupled)
        self.queue_policy = QueuePolicy(config)
        # Requests of one client look alike: a signature that passed (input names, datatypes,
        # shapes; output names) is checked once and looked up after. Not where a reshape
        # rewrites the inputs; at most VALID_SIGNATURES per loaded version, the rest checked
        # in full every time.
        self.memoizes = all(rule.reshape is None for rule in self.inputs.values())
        self.valid: dict[tuple, int] = {}


def validate_request(request: InferRequest, config: ModelConfig | RequestRules) -> None:
    """Raise InvalidArgument naming the offending input/output; fill scheduling fields.

    `config` is best given as the loaded version's RequestRules (built once); a ModelConfig
    works too, at the cost of building them for this one call.
    """
    rules = config if isinstance(config, RequestRules) else RequestRules(config)
    signature = _signature(request) if rules.memoizes else None
    if signature is not None:
        try:
            batch_size = rules.valid.get(signature)
        except TypeError:  # unhashable: a shape given as a list
            signature, batch_size = None, None
        if batch_size is not None:  # the same request passed before
            request.batch_size = batch_size
            rules.queue_policy.apply(request)
            return
    _check(request, rules)
    if signature is not None and len(rules.valid) < VALID_SIGNATURES:
        rules.valid[signature] = request.batch_size
    rules.queue_policy.apply(request)


def _signature(request: InferRequest) -> tuple:
    """What validation reads of a request (hashed once, by the table's lookup)."""
    outputs = request.outputs
    return (
        tuple([(t.name, t.datatype, t.shape) for t in request.inputs]),
        None if outputs is None else tuple([o.name for o in outputs]),
    )


def _check(request: InferRequest, rules: RequestRules) -> None:
    """Every rule, in full; sets the request's batch size."""
    model = rules.model
    expected = rules.inputs
    given: set[str] = set()
    for tensor in request.inputs:
        if tensor.name in given:
            raise InvalidArgument(
                f"{_prefix(request)}input '{shown(tensor.name)}' already exists in request"
            )
        if tensor.name not in expected:
            raise InvalidArgument(
                f"{_prefix(request)}unexpected inference input '{shown(tensor.name)}' "
                f"for model '{model}'"
            )
        given.add(tensor.name)
    if len(given) != len(expected):
        missing = [name for name in rules.required if name not in given]
        if missing:
            raise InvalidArgument(
                f"{_prefix(request)}expected {len(rules.required)} inputs but got {len(given)} "
                f"inputs for model '{model}'. Got input(s) {sorted(given)}, but missing required "
                f"input(s) {missing}. Please provide all required input(s)."
            )

    batching = rules.max_batch_size > 0
    batch_size = 0
    rows = 0
    for tensor in request.inputs:
        rule = expected[tensor.name]
        if tensor.datatype != rule.wire:
            raise InvalidArgument(
                f"{_prefix(request)}inference input '{shown(tensor.name)}' data-type "
                f"is '{tensor.datatype}', but model '{model}' expects "
                f"'{rule.wire}'"
            )
        shape = tensor.shape
        if batching:
            if len(shape) == 0:
                raise InvalidArgument(
                    f"{_prefix(request)}unexpected shape for input "
                    f"'{shown(tensor.name)}' for model '{model}'. Expected "
                    f"{_fmt((-1,) + rule.dims)}, got []"
                )
            rows = shape[0]
            if batch_size == 0:
                batch_size = rows
            elif rows != batch_size:
                raise InvalidArgument(
                    f"{_prefix(request)}input '{shown(tensor.name)}' batch size does "
                    f"not match other inputs for '{model}'"
                )
            inner = tuple(shape[1:])
        else:
            inner = tuple(shape)
        if not _shape_matches(rule.dims, inner):
            wanted = (-1,) + rule.dims if batching else rule.dims
            raise InvalidArgument(
                f"{_prefix(request)}unexpected shape for input '{shown(tensor.name)}' "
                f"for model '{model}'. Expected {_fmt(wanted)}, got "
                f"{_fmt(shape)}"
            )
        if rule.reshape is not None:
            target = ((rows,) if batching else ()) + rule.reshape
            try:
                tensor.data = tensor.data.reshape(target)
            except ValueError:  # the config's reshape holds another number of elements
                raise InvalidArgument(
                    f"{_prefix(request)}input '{shown(tensor.name)}' of shape {_fmt(shape)} "
                    "cannot be "
                    f"reshaped to {_fmt(target)} as the config of model '{model}' asks"
                ) from None
            tensor.shape = tuple(map(int, tensor.data.shape))
    if batching:
        if batch_size < 1 or batch_size > rules.max_batch_size:
            raise InvalidArgument(
                f"{_prefix(request)}inference request batch-size must be <= "
                f"{rules.max_batch_size} for '{model}'"
            )
    request.batch_size = batch_size

    if request.outputs is not None:
        seen: set[str] = set()
        for output in request.outputs:
            if output.name not in rules.outputs:
                raise InvalidArgument(
                    f"{_prefix(request)}unexpected inference output "
                    f"'{output.name}' for model '{model}'"
                )
            if output.name in seen:
                raise InvalidArgument(
                    f"{_prefix(request)}output '{output.name}' already exists in request"
                )
            seen.add(output.name)
