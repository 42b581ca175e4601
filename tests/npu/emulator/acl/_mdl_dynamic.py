"""acl.mdl's dynamic gears: batch, image size (HW) and dims. Reads of the compiled gear lists
and the setters that write the chosen gear into the gear tensor's buffer before execute.

Checked against the binding (hicann/runtime python/pyACL/mdl/mdl_wrap.cpp): argument formats
"IkkK" (batch), "IkkKK" (hw), "IkkO" (dims dict), `get_dynamic_hw(desc, index)` returning
({"hwCount", "hw": [[h, w], ...]}, ret), `get_input_dynamic_gear_count(desc, index)` -> (n, ret)
and `get_input_dynamic_dims(desc, index, n)` -> ([{"name", "dimCount", "dims"}, ...], ret).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _codes as C
from ._runtime import RT, AclFail, dict_ret, entry, hold_gil, ret_only


def _spec(desc: int):
    found = RT.descs.get(desc)
    if found is None or found.spec is None:
        raise AclFail(C.INVALID_PARAM, f"desc {desc:#x} does not exist or is not filled")
    return found.spec


@entry("mdl.get_dynamic_batch", "k", dict_ret)
def get_dynamic_batch(desc: int) -> tuple[dict, int]:
    spec = _spec(desc)
    return {"batchCount": len(spec.gears), "batch": list(spec.gears)}, C.SUCCESS


@entry("mdl.get_dynamic_hw", "kk", dict_ret)
def get_dynamic_hw(desc: int, index: int) -> tuple[dict, int]:
    spec = _spec(desc)
    return {"hwCount": len(spec.hw_gears), "hw": [list(g) for g in spec.hw_gears]}, C.SUCCESS


@entry("mdl.get_input_dynamic_gear_count", "kk", lambda code: (0, code))
def get_input_dynamic_gear_count(desc: int, index: int) -> tuple[int, int]:
    return len(_spec(desc).dims_gears), C.SUCCESS


@entry("mdl.get_input_dynamic_dims", "kkk", lambda code: ([], code))
def get_input_dynamic_dims(desc: int, index: int, count: int) -> tuple[list, int]:
    spec = _spec(desc)
    if count > 4096 or count != len(spec.dims_gears):
        raise AclFail(C.INVALID_PARAM, f"gear count {count}, the model has {len(spec.dims_gears)}")
    return [{"name": "", "dimCount": len(g), "dims": g} for g in spec.full_dims_gears()], C.SUCCESS


def _target(model_id: int, dataset: int, index: int):
    """The model and the data buffer at `index`, whatever tensor sits there: GE writes the gear
    into that buffer without asking what it is."""
    from .mdl import _model

    RT.require_init()
    ctx = RT.current_ctx()
    model = _model(model_id)
    if model.ctx is not ctx:
        raise AclFail(C.RT_MODEL_CONTEXT, f"model {model_id} was loaded in another context")
    found = RT.datasets.get(dataset)
    if found is None or not 0 <= index < len(found.buffers):
        raise AclFail(C.INVALID_PARAM, f"no data buffer at index {index} of the dataset")
    buffer = RT.buffers.get(found.buffers[index])
    if buffer is None or buffer.addr == 0:
        raise AclFail(C.INVALID_PARAM, f"data buffer at index {index} has no address")
    return model, found, buffer


def _write(buffer: Any, values: list[int], dtype: Any) -> None:
    """Write the gear values into the gear tensor as GE does: one synchronous H2D copy per
    value, each keeping the real GIL (the binding's wrapper never releases it)."""
    data = np.array(values, dtype=dtype)
    if buffer.size < data.nbytes:
        raise AclFail(C.GE_DYNAMIC_INPUT_LENGTH_INVALID, "dynamic tensor buffer too small")
    RT.memory.write_device(buffer.addr, data)
    per_byte = 1 / RT.config.copy_bytes_per_s if RT.config.copy_bytes_per_s > 0 else 0.0
    hold_gil(len(values) * RT.config.gear_copy_s + data.nbytes * per_byte)


@entry("mdl.set_dynamic_batch_size", "IkkK", ret_only)
def set_dynamic_batch_size(model_id: int, dataset: int, index: int, batch: int) -> int:
    with RT.lock:
        model, found, buffer = _target(model_id, dataset, index)
        if batch == 0:
            raise AclFail(C.INVALID_PARAM, "dynamic batch size must not be 0")
        spec = model.spec
        if not spec.dynamic:
            raise AclFail(C.GE_DYNAMIC_BATCH_SIZE_INVALID, f"model {model_id} has no dynamic batch")
        if batch not in spec.gears:
            raise AclFail(
                C.GE_DYNAMIC_BATCH_SIZE_INVALID,
                f"batch size {batch} is not one of the model's gears {list(spec.gears)}",
            )
        if buffer.size < 4:
            raise AclFail(C.GE_DYNAMIC_INPUT_LENGTH_INVALID, "dynamic tensor buffer too small")
        _write(buffer, [batch], np.uint64 if buffer.size >= 8 else np.uint32)
        found.gear = batch
        model.gear = batch
        return C.SUCCESS


@entry("mdl.set_dynamic_hw_size", "IkkKK", ret_only)
def set_dynamic_hw_size(model_id: int, dataset: int, index: int, height: int, width: int) -> int:
    with RT.lock:
        model, found, buffer = _target(model_id, dataset, index)
        gears = model.spec.hw_gears
        if (height, width) not in gears:
            raise AclFail(
                C.GE_DYNAMIC_BATCH_SIZE_INVALID,
                f"image size {height}x{width} is not one of the model's gears "
                f"{[list(g) for g in gears]}",
            )
        _write(buffer, [height, width], np.int32)
        found.gear = model.shape_gear = (height, width)
        return C.SUCCESS


@entry("mdl.set_input_dynamic_dims", "IkkO", ret_only)
def set_input_dynamic_dims(model_id: int, dataset: int, index: int, dims: dict) -> int:
    if not isinstance(dims, dict):
        raise TypeError("argument 4 is not dict")
    values = dims.get("dims")
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise TypeError("The dims of parameter 4 is not a list.")
    count = int(dims.get("dimCount", 0))
    with RT.lock:
        model, found, buffer = _target(model_id, dataset, index)
        spec = model.spec
        if count == 0:
            raise AclFail(C.INVALID_PARAM, "dimCount can't be zero")
        # GE (ge_executor.cc GetCurDynamicDims): the dims of the inputs --input_shape lists,
        # in its order; every static dim must be repeated as it is; then the -1 values must be
        # one of the gears.
        origin = spec.all_data_dims()
        if count != len(origin):
            raise AclFail(
                C.GE_DYNAMIC_INPUT_LENGTH_INVALID,
                f"Dynamic input size [{count}] is not equal with all data dims size "
                f"[{len(origin)}]!",
            )
        for i, (value, want) in enumerate(zip(values[:count], origin, strict=False)):
            if want >= 0 and value != want:
                raise AclFail(
                    C.GE_DYNAMIC_INPUT_LENGTH_INVALID,
                    f"Static dims should be same, index:{i} value:{value} should be {want}",
                )
        gear = tuple(v for v, want in zip(values[:count], origin, strict=False) if want < 0)
        if gear not in spec.dims_gears:
            raise AclFail(
                C.GE_DYNAMIC_BATCH_SIZE_INVALID,
                f"dims {values[:count]} are not one of the model's gears {spec.full_dims_gears()}",
            )
        _write(buffer, list(gear), np.int32)
        found.gear = model.shape_gear = gear
        return C.SUCCESS
