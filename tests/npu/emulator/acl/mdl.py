"""acl.mdl: model load, descriptions, datasets, dynamic batch gears and execution."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _codes as C
from . import _om
from ._mdl_aipp import (  # noqa: F401  (acl.mdl.*)
    create_aipp,
    destroy_aipp,
    get_aipp_type,
    set_aipp_ax_swap_switch,
    set_aipp_crop_params,
    set_aipp_csc_params,
    set_aipp_dtc_pixel_mean,
    set_aipp_dtc_pixel_min,
    set_aipp_input_format,
    set_aipp_padding_params,
    set_aipp_pixel_var_reci,
    set_aipp_rbuv_swap_switch,
    set_aipp_src_image_size,
    set_input_aipp,
)
from ._mdl_dynamic import (  # noqa: F401  (acl.mdl.*)
    get_dynamic_batch,
    get_dynamic_hw,
    get_input_dynamic_dims,
    get_input_dynamic_gear_count,
    set_dynamic_batch_size,
    set_dynamic_hw_size,
    set_input_dynamic_dims,
)
from ._memory import Allocation
from ._runtime import RT, AclFail, Context, Dataset, entry, hold_gil, ret_only, value_ret


@dataclass(eq=False)
class Model:
    id: int
    ctx: Context
    device: int
    spec: _om.OmSpec
    weights: Allocation | None
    busy: str | None = None
    gear: int | None = None  # set by set_dynamic_batch_size (GE keeps it per model)
    cur_gear: int | None = None  # gear of the last execution, for get_cur_output_dims
    shape_gear: tuple | None = None  # set by set_dynamic_hw_size / set_input_dynamic_dims
    cur_shapes: dict | None = None  # output shapes of the last execution


@dataclass(eq=False)
class Desc:
    handle: int
    model_id: int | None = None
    spec: _om.OmSpec | None = None
    from_file: bool = False  # filled by get_desc_from_file: no model behind it


# -- load / unload ----------------------------------------------------------------------------


@entry("mdl.load_from_file", "s", value_ret)
def load_from_file(path: str) -> tuple[int, int]:
    with RT.lock:
        RT.require_init()
        ctx = RT.current_ctx()
        RT.require_alive(ctx.device)
        spec = _om.parse(path)
        if spec.soc and spec.soc != RT.config.soc_name:
            raise AclFail(
                C.GE_LOAD_MODEL,
                f"the model was compiled for {spec.soc} (--soc_version)"
                f", this device is {RT.config.soc_name}",
            )
        hold_gil(spec.load_s)  # the real load keeps the GIL (and this the lock) as long
        model_id = RT.new_model_id()
        charge = spec.weight_size + spec.work_size
        weights = (
            RT.memory.allocate(
                ctx.device, charge, owner=f"model {model_id}", oom_code=C.GE_MEMORY_ALLOCATION
            )
            if charge
            else None
        )
        RT.models[model_id] = Model(model_id, ctx, ctx.device, spec, weights)
        return model_id, C.SUCCESS


@entry("mdl.query_size", "s", lambda code: (0, 0, code))
def query_size(path: str) -> tuple[int, int, int]:
    spec = _om.parse(path)
    return spec.work_size, spec.weight_size, C.SUCCESS


def _model(model_id: int, code: int = C.INVALID_MODEL_ID) -> Model:
    model = RT.models.get(model_id)
    if model is None:
        if model_id in RT.retired:
            RT.violate(f"use of unloaded model id {model_id}")
        raise AclFail(code, f"model id {model_id} is not loaded")
    return model


@entry("mdl.unload", "k", ret_only)
def unload(model_id: int) -> int:
    with RT.lock:
        RT.require_init()
        model = _model(model_id)
        if model.ctx is not RT.current_ctx():
            raise AclFail(C.RT_MODEL_CONTEXT, f"model {model_id} was loaded in another context")
        if model.busy:
            RT.violate(f"unload of model {model_id} while it executes ({model.busy})")
        if model.weights is not None:
            RT.memory.release(model.weights.ptr)
        del RT.models[model_id]
        RT.retired.add(model_id)
        return C.SUCCESS


# -- description ------------------------------------------------------------------------------


@entry("mdl.create_desc", "")
def create_desc() -> int:
    with RT.lock:
        desc = Desc(RT.new_handle("desc"))
        RT.descs[desc.handle] = desc
        return desc.handle


@entry("mdl.destroy_desc", "k", ret_only)
def destroy_desc(desc: int) -> int:
    with RT.lock:
        if desc not in RT.descs:
            if desc in RT.retired:
                RT.violate(f"double destroy of model desc {desc:#x}")
            raise AclFail(C.INVALID_PARAM, f"desc {desc:#x} does not exist")
        del RT.descs[desc]
        RT.retired.add(desc)
        return C.SUCCESS


@entry("mdl.get_desc", "kk", ret_only)
def get_desc(desc: int, model_id: int) -> int:
    with RT.lock:
        RT.require_init()
        found = RT.find(RT.descs, desc, "desc")
        found.model_id, found.spec = model_id, _model(model_id).spec
        return C.SUCCESS


@entry("mdl.get_desc_from_file", "ks", ret_only)
def get_desc_from_file(desc: int, path: str) -> int:
    """The description straight from the file: no load, no device memory, no context needed."""
    with RT.lock:
        RT.require_init()
        found = RT.find(RT.descs, desc, "desc")
        found.spec, found.model_id, found.from_file = _om.parse(path), None, True
        return C.SUCCESS


def _spec(desc: int) -> _om.OmSpec | None:
    found = RT.descs.get(desc)
    return found.spec if found is not None else None


def _tensor(desc: int, index: int, outputs: bool) -> _om.TensorSpec | None:
    spec = _spec(desc)
    if spec is None:
        return None
    tensors = spec.outputs if outputs else spec.desc_inputs()
    return tensors[index] if 0 <= index < len(tensors) else None


def _batch_of(spec: _om.OmSpec, tensor: _om.TensorSpec) -> int:
    first = tensor.dims[0] if tensor.dims else 1
    return spec.max_gear if first == -1 and spec.max_gear else first


def _size(desc: int, index: int, outputs: bool) -> int:
    tensor = _tensor(desc, index, outputs)
    if tensor is None:
        return 0
    spec = _spec(desc)
    if not outputs and tensor.name in (C.DYNAMIC_TENSOR_NAME, C.DYNAMIC_AIPP_NAME):
        return tensor.nbytes(None)
    if not outputs and spec.aipp is not None and tensor.name == spec.aipp.input:
        if spec.aipp.mode == "dynamic":  # GE sizes the input by max_src_image_size
            return spec.aipp.max_src
        return spec.aipp.source_bytes(_batch_of(spec, tensor), src=spec.aipp_source())
    if outputs and spec.shape_dynamic:
        shape = _om.max_output_shapes(spec)[tensor.name]
        return int(np.prod(shape)) * tensor.np_dtype.itemsize
    if not outputs and spec.shape_dynamic:
        shape = spec.gear_shapes(spec.max_shape_gear())[tensor.name]
        return int(np.prod(shape)) * tensor.np_dtype.itemsize
    return tensor.nbytes(spec.max_gear if spec.dynamic else None)


def _io_dims(name: str, dims) -> tuple[dict, int]:
    dims = [int(d) for d in dims]
    return {"name": name, "dimCount": len(dims), "dims": dims}, C.SUCCESS


def _dims(desc: int, index: int, outputs: bool, v2: bool = False) -> tuple[dict, int]:
    """What the desc reports: -1 on dynamic input axes; outputs of a dynamic-batch model at
    the largest gear (as hardware reports them); static AIPP inputs in source-image terms."""
    tensor = _tensor(desc, index, outputs)
    if tensor is None:
        RT.set_err(f"index {index} out of range or desc not filled")
        return {}, C.INVALID_PARAM
    spec = _spec(desc)
    dims = list(tensor.dims)
    if not outputs and spec.aipp is not None and tensor.name == spec.aipp.input:
        n = dims[0] if dims else 1
        if spec.aipp.mode == "dynamic":
            # Both calls: [N, -1, -1, -1], N the static batch or -1 with --dynamic_batch_size
            # (GE aipp_op.cc CreateAippData sets ATTR_DYNAMIC_AIPP_INPUT_DIMS; davinci_model.cc
            # CreateInputDimsInfo reports it; only static AIPP sets the v2 dims apart).
            return _io_dims(tensor.name, (n, -1, -1, -1))
        if spec.hw_gears:
            return _io_dims(tensor.name, spec.aipp.hw_dims(n, v2))
        if v2:
            return _io_dims(tensor.name, spec.aipp.v2_dims(n))
        h, w = spec.aipp.src
        return _io_dims(tensor.name, (n, h, w, _om.AIPP_SOURCE[spec.aipp.fmt][2]))
    if outputs and spec.shape_dynamic:
        return _io_dims(tensor.name, _om.max_output_shapes(spec)[tensor.name])
    show_max = outputs or RT.config.dims_show_max_gear
    if spec.dynamic and show_max and dims and dims[0] == -1:
        dims[0] = spec.max_gear
    return _io_dims(tensor.name, dims)


@entry("mdl.get_num_inputs", "k")
def get_num_inputs(desc: int) -> int:
    spec = _spec(desc)
    return len(spec.desc_inputs()) if spec else 0


@entry("mdl.get_num_outputs", "k")
def get_num_outputs(desc: int) -> int:
    spec = _spec(desc)
    return len(spec.outputs) if spec else 0


@entry("mdl.get_input_size_by_index", "kk")
def get_input_size_by_index(desc: int, index: int) -> int:
    return _size(desc, index, outputs=False)


@entry("mdl.get_output_size_by_index", "kk")
def get_output_size_by_index(desc: int, index: int) -> int:
    return _size(desc, index, outputs=True)


@entry("mdl.get_input_dims", "kk")
def get_input_dims(desc: int, index: int) -> tuple[dict, int]:
    return _dims(desc, index, outputs=False)


@entry("mdl.get_input_dims_v2", "kk")
def get_input_dims_v2(desc: int, index: int) -> tuple[dict, int]:
    """As get_input_dims, except a static AIPP input: dims whose product is the byte size."""
    return _dims(desc, index, outputs=False, v2=True)


@entry("mdl.get_output_dims", "kk")
def get_output_dims(desc: int, index: int) -> tuple[dict, int]:
    return _dims(desc, index, outputs=True)


@entry("mdl.get_cur_output_dims", "kk")
def get_cur_output_dims(desc: int, index: int) -> tuple[dict, int]:
    """The output's dims at the current gear (a dynamic batch: the last one set; image size and
    dims: the last execution's). Not for a desc from get_desc_from_file (the CANN docs
    exclude it)."""
    found = RT.descs.get(desc)
    if found is None or found.from_file:
        RT.set_err("get_cur_output_dims needs a desc filled by get_desc from a loaded model")
        return {}, C.INVALID_PARAM
    model = RT.models.get(found.model_id) if found.model_id else None
    tensor = _tensor(desc, index, outputs=True)
    if tensor is None:
        return {}, C.INVALID_PARAM
    if model is not None and model.spec.dynamic and model.gear:
        # GE answers from the model's table of output dims per gear, at the gear the last
        # set_dynamic_batch_size chose (GetCurShape), executed or not.
        return _io_dims(tensor.name, tensor.shape(model.gear))
    if model is not None and model.cur_shapes and tensor.name in model.cur_shapes:
        return _io_dims(tensor.name, model.cur_shapes[tensor.name])
    return _dims(desc, index, outputs=True)


@entry("mdl.get_input_data_type", "kk")
def get_input_data_type(desc: int, index: int) -> int:
    tensor = _tensor(desc, index, outputs=False)
    return tensor.dtype if tensor else -1


@entry("mdl.get_output_data_type", "kk")
def get_output_data_type(desc: int, index: int) -> int:
    tensor = _tensor(desc, index, outputs=True)
    return tensor.dtype if tensor else -1


@entry("mdl.get_input_format", "kk")
def get_input_format(desc: int, index: int) -> int:
    tensor = _tensor(desc, index, outputs=False)
    return tensor.fmt if tensor else -1


@entry("mdl.get_output_format", "kk")
def get_output_format(desc: int, index: int) -> int:
    tensor = _tensor(desc, index, outputs=True)
    return tensor.fmt if tensor else -1


@entry("mdl.get_input_name_by_index", "kk")
def get_input_name_by_index(desc: int, index: int) -> str:
    tensor = _tensor(desc, index, outputs=False)
    return tensor.name if tensor else ""


@entry("mdl.get_output_name_by_index", "kk")
def get_output_name_by_index(desc: int, index: int) -> str:
    tensor = _tensor(desc, index, outputs=True)
    return tensor.name if tensor else ""


def _index_by_name(desc: int, name: str, outputs: bool) -> tuple[int, int]:
    spec = _spec(desc)
    tensors = (spec.outputs if outputs else spec.desc_inputs()) if spec else ()
    for index, tensor in enumerate(tensors):
        if tensor.name == name:
            return index, C.SUCCESS
    RT.set_err(f"no {'output' if outputs else 'input'} named {name!r}")
    return 0, C.INVALID_PARAM


@entry("mdl.get_input_index_by_name", "ks")
def get_input_index_by_name(desc: int, name: str) -> tuple[int, int]:
    return _index_by_name(desc, name, outputs=False)


@entry("mdl.get_output_index_by_name", "ks")
def get_output_index_by_name(desc: int, name: str) -> tuple[int, int]:
    return _index_by_name(desc, name, outputs=True)


# -- datasets ---------------------------------------------------------------------------------


@entry("mdl.create_dataset", "")
def create_dataset() -> int:
    with RT.lock:
        dataset = Dataset(RT.new_handle("dataset"))
        RT.datasets[dataset.handle] = dataset
        return dataset.handle


@entry("mdl.destroy_dataset", "k", ret_only)
def destroy_dataset(dataset: int) -> int:
    with RT.lock:
        if dataset not in RT.datasets:
            if dataset in RT.retired:
                RT.violate(f"double destroy of dataset {dataset:#x}")
            raise AclFail(C.INVALID_PARAM, f"dataset {dataset:#x} does not exist")
        del RT.datasets[dataset]  # its data buffers stay alive: the caller destroys them
        RT.retired.add(dataset)
        return C.SUCCESS


@entry("mdl.add_dataset_buffer", "kk", value_ret)
def add_dataset_buffer(dataset: int, buffer: int) -> tuple[int, int]:
    with RT.lock:
        found = RT.datasets.get(dataset)
        if found is None or buffer not in RT.buffers:
            raise AclFail(C.INVALID_PARAM, "add_dataset_buffer: unknown dataset or data buffer")
        found.buffers.append(buffer)
        return dataset, C.SUCCESS


@entry("mdl.get_dataset_num_buffers", "k")
def get_dataset_num_buffers(dataset: int) -> int:
    found = RT.datasets.get(dataset)
    return len(found.buffers) if found else 0


@entry("mdl.get_dataset_buffer", "kk")
def get_dataset_buffer(dataset: int, index: int) -> int:
    found = RT.datasets.get(dataset)
    if found is None or not 0 <= index < len(found.buffers):
        return 0
    return found.buffers[index]


from ._mdl_exec import execute, execute_async, run_task  # noqa: E402,F401  (acl.mdl.*)
