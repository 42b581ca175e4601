"""The model config against the model's own description: auto-complete, then the check at
load that the two agree, producing the name-to-tensor binding the backend executes with."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.base import BackendError
from npu.description import ModelDescription, TensorInfo

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

GEARS_PARAMETER = "batch_gears"

# Parameters of Ascend's Triton GE backend (`npu_ge`, which compiles ONNX graphs with GE at
# load: src/model_state.cpp ParseGeConfig) that mean nothing for an ATC-compiled .om, each with
# what does the job here. Warned about once per model and parameter, then ignored.
GE_ONLY_PARAMETERS = {
    "static_model": "an .om is compiled already: static, or with ATC's gears",
    "profiling": "profile with msprof, or ACL's acl.json, outside the server",
    "dump_graph": "ATC dumps graphs at compile time (DUMP_GE_GRAPH)",
    "dump_data": "dump with ACL's acl.json outside the server",
    "device_exec_blocks": "instance_group count sets the instances (each with its own stream)",
    "instance_exec_blocks": "instance_group count sets the instances (each with its own stream)",
}
_GE_PREFIX = "ge."  # GE session options (ge.aicoreNum, ge.dynamicDims, ...): fixed by ATC here
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def warn_ge_parameters(config: ModelConfig) -> list[str]:
    """Log, once per model and key, each GE-backend parameter that has no meaning for an .om
    (so a config moved from `npu_ge` says what it lost). Returns the keys warned about now."""
    keys = sorted(
        k for k in config.parameters if k in GE_ONLY_PARAMETERS or k.startswith(_GE_PREFIX)
    )
    fresh = []
    with _warned_lock:
        for key in keys:
            if (config.name, key) in _warned:
                continue
            _warned.add((config.name, key))
            fresh.append(key)
    for key in fresh:
        instead = GE_ONLY_PARAMETERS.get(key, "GE options are fixed when ATC compiles the .om")
        log.warning(
            "model '%s': parameter '%s' is an option of the npu_ge backend (GE compiling a "
            "graph at load) and has no meaning for an ATC-compiled .om; ignored (%s)",
            config.name,
            key,
            instead,
        )
    return fresh


def _type_number(config_name: str) -> int:
    from protocol.proto import model_config_pb2

    return model_config_pb2.DataType.Value(config_name)


def _type_name(number: int) -> str:
    from protocol.proto import model_config_pb2

    return model_config_pb2.DataType.Name(number)


# The parameters Ascend's Triton GE backend (`npu_ge`) configs carry to say which NPUs a model
# runs on: `device_ids` "2" or "2,3" (its README); `device_id` "0" is accepted as the one-id form.
DEVICE_PARAMETERS = ("device_ids", "device_id")
_INT32_MAX = 2**31 - 1  # instance_group gpus is int32


def _device_list(key: str, text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or not all(part.isdecimal() for part in parts):
        raise BackendError(
            f"parameter {key} '{text[:80]}' is not a comma-separated list of NPU ids "
            '(e.g. "0" or "0,1")'
        )
    ids = [int(part) for part in parts]
    if key == "device_id" and len(ids) != 1:
        raise BackendError(
            f"parameter device_id '{text[:80]}' names more than one NPU; use device_ids"
        )
    if len(set(ids)) != len(ids):
        raise BackendError(f"parameter {key} '{text[:80]}' lists an NPU twice")
    if any(i > _INT32_MAX for i in ids):
        raise BackendError(f"parameter {key} '{text[:80]}' holds a number that is no NPU id")
    return ids


def place(config: ModelConfig) -> None:
    """`device_ids` / `device_id` become the `gpus` of every instance group that lists none,
    so instances spread over those NPUs exactly as with `instance_group { gpus: [...] }`
    (`count` instances on each). A group that lists other gpus, or is not KIND_GPU, is refused:
    two places saying different things about where a model runs is a mistake to report."""
    from protocol.proto.model_config_pb2 import ModelInstanceGroup

    warn_ge_parameters(config)
    given = [key for key in DEVICE_PARAMETERS if key in config.parameters]
    if not given:
        return
    if len(given) > 1:
        raise BackendError("set one of the parameters device_ids and device_id, not both")
    key = given[0]
    ids = _device_list(key, config.parameters[key].string_value)
    if not len(config.instance_group):
        config.instance_group.add()
    for group in config.instance_group:
        label = f"instance_group '{group.name}'" if group.name else "an instance_group"
        if group.kind not in (ModelInstanceGroup.KIND_AUTO, ModelInstanceGroup.KIND_GPU):
            kind = ModelInstanceGroup.Kind.Name(group.kind)
            raise BackendError(
                f"{label} is {kind}, but parameter {key} places instances on NPUs: "
                "use KIND_GPU or leave kind out"
            )
        if len(group.gpus) and list(group.gpus) != ids:
            raise BackendError(
                f"{label} lists gpus {list(group.gpus)} but parameter {key} says "
                f"{','.join(map(str, ids))}: keep one of them"
            )
        group.kind = ModelInstanceGroup.KIND_GPU
        del group.gpus[:]
        group.gpus.extend(ids)


def input_shape(config: ModelConfig) -> str | None:
    """The config's `input_shape` parameter (ATC's --input_shape), which says how the model's
    --dynamic_dims gears map onto its inputs where the gears alone cannot tell (npu/dims.py)."""
    from npu.dims import ORDER_PARAMETER

    if ORDER_PARAMETER not in config.parameters:
        return None
    return config.parameters[ORDER_PARAMETER].string_value.strip() or None


def probe_device(config: ModelConfig) -> int:
    """The NPU to read the model description on: the first listed in instance_group, else 0."""
    for group in config.instance_group:
        if group.gpus:
            return int(group.gpus[0])
    return 0


def _declares_full_rank(config: ModelConfig, info: ModelDescription) -> bool:
    """An input listed with the model's full rank says the config means 'no batching'."""
    by_name = {t.name: t for t in info.inputs}
    return any(
        i.name in by_name and i.dims and len(i.dims) == len(by_name[i.name].dims)
        for i in config.input
    )


def _complete(entries, tensors: Iterable[TensorInfo], batching: bool, outputs: bool) -> None:
    tensors = list(tensors)
    if len(entries) == 0:
        for info in tensors:
            entry = entries.add()
            entry.name = info.name
        lookup = {t.name: t for t in tensors}
    else:
        lookup = {t.name: t for t in tensors}
        if outputs:
            lookup.update({t.raw_name: t for t in tensors})
    for entry in entries:
        tensor = lookup.get(entry.name)
        if tensor is None:
            continue  # bind() reports it with the list of real names
        if entry.data_type == 0:
            entry.data_type = _type_number(tensor.acl_type.config_name)
        if not entry.dims and not entry.HasField("reshape"):
            entry.dims.extend(tensor.row_dims if batching else tensor.dims)


def complete(config: ModelConfig, info: ModelDescription) -> None:
    """Fill what the config leaves out: max_batch_size (the largest gear, or the compiled batch
    of a static model) when it is 0, requests can be stacked (info.stackable) and the config
    does not describe full-rank inputs; the inputs and outputs (names, data types, dims: a side
    input such as im_info [1, 3] shows as [3] when batching, one row per request); and the
    gears as parameter `batch_gears`."""
    if config.max_batch_size == 0 and info.stackable and not _declares_full_rank(config, info):
        config.max_batch_size = max(info.batch_sizes)
    if info.gears:
        config.parameters[GEARS_PARAMETER].string_value = ",".join(str(g) for g in info.gears)
    batching = config.max_batch_size > 0
    _complete(config.input, info.inputs, batching, outputs=False)
    _complete(config.output, info.outputs, batching, outputs=True)


@dataclass(frozen=True)
class Binding:
    """How the config's tensors map onto the model's."""

    inputs: tuple[tuple[str, TensorInfo], ...]  # every model input, in model order
    outputs: tuple[tuple[str, TensorInfo], ...]  # the outputs the config lists (or all)
    batching: bool  # max_batch_size > 0: axis 0 of every request tensor is the batch
    rows: bool  # batches carry a row count (batching, or a dynamic-batch model served unbatched)


def fits(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    """A concrete shape against dims with -1 wildcards."""
    return len(shape) == len(dims) and all(
        d == -1 or s == d for s, d in zip(shape, dims, strict=False)
    )


def _dims_agree(config_dims: list[int], model_dims: tuple[int, ...]) -> bool:
    return len(config_dims) == len(model_dims) and all(
        c == -1 or m == -1 or c == m for c, m in zip(config_dims, model_dims, strict=False)
    )


def _check_entry(kind: str, entry, tensor: TensorInfo, batching: bool) -> None:
    want = tensor.acl_type.config_name
    if entry.data_type and _type_name(entry.data_type) != want:
        raise BackendError(
            f"{kind} '{entry.name}': the config says {_type_name(entry.data_type)},"
            f" the model has {want}"
        )
    model_dims = tensor.row_dims if batching else tensor.dims
    reshaped = entry.HasField("reshape")
    if entry.dims and not reshaped and not _dims_agree(list(entry.dims), model_dims):
        raise BackendError(
            f"{kind} '{entry.name}': the config says dims {list(entry.dims)}, the "
            f"model has {list(model_dims)}" + (" (without the batch dimension)" if batching else "")
        )


def bind(config: ModelConfig, info: ModelDescription) -> Binding:
    """Check the config against the model and say which config name is which model tensor."""
    batching = config.max_batch_size > 0
    if batching:
        if not info.batch_sizes:
            raise BackendError(
                f"max_batch_size is {config.max_batch_size} but the model has no "
                "batch dimension; set max_batch_size: 0 or compile with "
                "--dynamic_batch_size"
            )
        if not info.stackable:
            side = [t.name for t in info.side_inputs if t.dims[:1] != (1,)]
            lone = [t.name for t in info.outputs if not t.batched]
            raise BackendError(
                "requests to this model cannot be stacked into a batch ("
                + "; ".join(
                    p
                    for p in (
                        f"side input(s) {', '.join(side)} have no leading 1" if side else "",
                        f"output(s) {', '.join(lone)} have no batch axis" if lone else "",
                    )
                    if p
                )
                + "): set max_batch_size: 0 and send each request with the model's full shapes"
            )
        if config.max_batch_size > max(info.batch_sizes):
            what = "largest gear" if info.gears else "compiled batch size"
            raise BackendError(
                f"max_batch_size {config.max_batch_size} exceeds the model's "
                f"{what} {max(info.batch_sizes)}"
            )
    model_inputs = {t.name: t for t in info.inputs}
    inputs: dict[str, TensorInfo] = {}
    for entry in config.input:
        tensor = model_inputs.get(entry.name)
        if tensor is None:
            raise BackendError(
                f"config input '{entry.name}' is not an input of the model "
                f"(model inputs: {', '.join(model_inputs)})"
            )
        _check_entry("input", entry, tensor, batching)
        inputs[entry.name] = tensor
    missing = [name for name in model_inputs if name not in inputs]
    if config.input and missing:
        raise BackendError(f"model input(s) {', '.join(missing)} missing from the config")
    model_outputs = {t.name: t for t in info.outputs}
    model_outputs.update({t.raw_name: t for t in info.outputs})
    outputs: list[tuple[str, TensorInfo]] = []
    for output in config.output:
        tensor = model_outputs.get(output.name)
        if tensor is None:
            raise BackendError(
                f"config output '{output.name}' is not an output of the model "
                f"(model outputs: {', '.join(t.name for t in info.outputs)})"
            )
        _check_entry("output", output, tensor, batching)
        outputs.append((output.name, tensor))
    ordered_inputs = tuple((t.name, t) for t in info.inputs)
    if not outputs:
        outputs = [(t.name, t) for t in info.outputs]
    return Binding(ordered_inputs, tuple(outputs), batching, batching or info.dynamic)
