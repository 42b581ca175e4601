"""acl.mdl's execution: the checks GE makes before a model runs, reading the inputs at the
current gear (AIPP applied), the stand-in compute, and the outputs written back. The device
time (fixed + per sample x gear) is queued on the device's timeline (_timeline.py) when the
execution is submitted, so one device runs one execution at a time, whichever thread or process
submitted it; a synchronous execute also holds the GIL (and the emulator lock) until its
execution ends, as the real one does, while synchronize_stream waits with the GIL released."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import _codes as C
from . import _om
from ._runtime import RT, AclFail, ConcurrentModelUse, entry, hold_gil, ret_only

if TYPE_CHECKING:  # pragma: no cover
    from .mdl import Model


@dataclass(eq=False)
class Task:
    model: Model
    inputs: list
    outputs: list
    gear: int | None
    latency_s: float = 0.0
    shapes: dict | None = None  # input shapes at a dynamic HW / dims gear
    stream: int = 0
    end: float | None = None  # when it ends on the device's timeline, once queued there
    hang: threading.Event | None = None  # a hung execution: set when the test releases it


# While a hung execution holds the device, a new one polls for it at this interval.
HUNG_POLL_S = 0.01

# -- execution --------------------------------------------------------------------------------


def _buffers(dataset: int, label: str) -> list:
    found = RT.datasets.get(dataset) if dataset else None
    if found is None:
        raise AclFail(C.INVALID_PARAM, f"{label} dataset is null or destroyed")
    buffers = []
    for handle in found.buffers:
        buffer = RT.buffers.get(handle)
        if buffer is None:
            raise AclFail(C.INVALID_PARAM, f"{label} dataset holds a destroyed data buffer")
        buffers.append(buffer)
    return buffers


def _prepare(model_id: int, in_ds: int, out_ds: int, stream: int | None) -> Task:
    from .mdl import _model

    RT.require_init()
    ctx = RT.current_ctx()
    model = _model(model_id, C.GE_EXEC_MODEL_ID_INVALID)
    if model.ctx is not ctx:
        raise AclFail(C.RT_MODEL_CONTEXT, f"model {model_id} was loaded in another context")
    if stream:
        from .rt import stream_in_current_context

        stream_in_current_context(stream)
    inputs, outputs = _buffers(in_ds, "input"), _buffers(out_ds, "output")
    spec = model.spec
    if len(inputs) != len(spec.desc_inputs()) or len(outputs) != len(spec.outputs):
        raise AclFail(
            C.GE_PARAM_INVALID,
            f"model {model_id} has {len(spec.desc_inputs())} inputs and "
            f"{len(spec.outputs)} outputs; datasets hold {len(inputs)} and {len(outputs)}",
        )
    if any(b.addr == 0 for b in inputs):
        raise AclFail(C.INVALID_PARAM, "input data buffer with a null address")
    if stream is not None and any(b.addr == 0 for b in outputs):
        raise AclFail(C.INVALID_PARAM, "execute_async needs allocated output buffers")
    gear, shapes = None, None
    if spec.dynamic or spec.shape_dynamic:
        gear = model.gear if spec.dynamic else model.shape_gear
        dataset_gear = RT.datasets[in_ds].gear
        if dataset_gear is None and RT.config.require_gear_before_execute:
            raise AclFail(
                C.GE_DYNAMIC_BATCH_SIZE_INVALID, "dynamic model executed without setting its gear"
            )
        if dataset_gear is not None and gear != dataset_gear:
            RT.violate(
                f"model {model_id}: gear {gear} set through another dataset, this one "
                f"says {dataset_gear} (shared model state raced)"
            )
        if spec.dynamic:
            gear = gear or spec.max_gear
        else:
            shapes = spec.gear_shapes(gear or spec.max_shape_gear())
        if spec.dynamic and RT.config.strict_dynamic_sizes:
            for tensor, buffer in zip(spec.inputs, inputs, strict=False):
                if buffer.size != tensor.nbytes(gear):
                    RT.violate(
                        f"input {tensor.name}: buffer of {buffer.size} bytes for gear {gear}"
                        f" (expected {tensor.nbytes(gear)})"
                    )
    else:
        for tensor, buffer in zip(spec.inputs + spec.outputs, inputs + outputs, strict=False):
            need = tensor.nbytes(None)
            if spec.aipp is not None and tensor.name == spec.aipp.input:
                aipp = spec.aipp
                need = aipp.max_src if aipp.mode == "dynamic" else aipp.source_bytes(tensor.dims[0])
            if buffer.addr and buffer.size + 64 < need:
                raise AclFail(
                    C.GE_PARAM_INVALID,
                    f"buffer for {tensor.name} holds {buffer.size} bytes, the model needs {need}",
                )
    RT.require_alive(model.device)
    if model.busy:
        RT.violate(
            f"model {model_id} entered concurrently by {threading.current_thread().name} "
            f"while {model.busy} runs it",
            ConcurrentModelUse,
        )
    for tensor, buffer in zip(spec.outputs, outputs, strict=False):
        if buffer.addr == 0:  # synchronous execute allocates (0, 0) outputs for the caller
            alloc = RT.memory.allocate(model.device, tensor.nbytes(gear))
            buffer.addr, buffer.size = alloc.ptr, alloc.size
    batch = gear if spec.dynamic else 1
    latency = (spec.latency_fixed_s + spec.latency_per_sample_s * batch) * RT.config.latency_scale
    model.busy = f"thread {threading.current_thread().name}"
    return Task(
        model,
        [(b.addr, b.size) for b in inputs],
        [(b.addr, b.size) for b in outputs],
        gear if spec.dynamic else None,
        latency,
        shapes,
        stream or 0,
    )


def _read_inputs(task: Task) -> dict[str, np.ndarray]:
    """Each input as the model sees it at this execution's gear; an AIPP input as float32
    [n, source bytes] after the emulated AIPP."""
    spec = task.model.spec
    arrays = {}
    addresses = dict(zip((t.name for t in spec.desc_inputs()), task.inputs, strict=False))
    for tensor in spec.inputs:
        addr, size = addresses[tensor.name]
        if spec.aipp is not None and tensor.name == spec.aipp.input:
            arrays[tensor.name] = _aipp_input(task, tensor, addr, size, addresses)
            continue
        shape = task.shapes[tensor.name] if task.shapes else tensor.shape(task.gear)
        need = int(np.prod(shape)) * tensor.np_dtype.itemsize
        raw = np.zeros(need, dtype=np.uint8)
        take = min(need, size)
        raw[:take] = RT.memory.read_device(addr, take)
        arrays[tensor.name] = raw.view(tensor.np_dtype).reshape(shape)
    return arrays


def _aipp_input(
    task: Task, tensor: _om.TensorSpec, addr: int, size: int, addresses: dict
) -> np.ndarray:
    from ._mdl_aipp import read_block

    aipp = task.model.spec.aipp
    n = task.gear if tensor.dims[0] == -1 else tensor.dims[0]
    mean, var = 0.0, 1.0
    fmt, src = aipp.fmt, aipp.src
    if aipp.mode == "dynamic":
        block = read_block(addresses[C.DYNAMIC_AIPP_NAME][0])
        if block is None:
            raise AclFail(
                C.GE_AIPP_NOT_SET,
                "dynamic AIPP parameters were never set on "
                "ascend_dynamic_aipp_data (acl.mdl.set_input_aipp)",
            )
        fmt, src, mean, var = block["fmt"], block["src"], block["mean"], block["var_reci"]
    if aipp.mode == "static" and task.shapes is not None:  # --dynamic_image_size: the gear's
        src = task.model.shape_gear or task.model.spec.max_shape_gear()
    per_row = aipp.source_bytes(1, fmt, src)
    if n * per_row > size:
        raise AclFail(
            C.GE_PARAM_INVALID,
            f"source images of {per_row} bytes x {n} exceed the input buffer of {size} bytes",
        )
    raw = RT.memory.read_device(addr, n * per_row).astype(np.float32).reshape(n, per_row)
    return (raw - mean) * var


def _compute(task: Task) -> int:
    model, spec = task.model, task.model.spec
    try:
        RT.require_alive(model.device)
        if RT.models.get(model.id) is not model:
            raise AclFail(C.GE_EXEC_MODEL_ID_INVALID, f"model {model.id} was unloaded")
        arrays = _read_inputs(task)
        code = _om.poisoned(spec, arrays)
        if code is not None:
            if code == C.RT_LOST_HEARTBEAT:
                RT.devices[model.device].lost = True
            if code == C.RT_AICORE_EXCEPTION and task.stream in RT.streams:
                RT.streams[task.stream].broken = code
            raise AclFail(
                code,
                f"model {model.id} execution failed on device {model.device} "
                f"(emulated fault, error {code})",
            )
        outputs = _om.run(spec, arrays, task.gear, free_shapes=spec.shape_dynamic)
        for tensor, (addr, size) in zip(spec.outputs, task.outputs, strict=False):
            value = outputs[tensor.name]
            if value.nbytes > size + (0 if spec.dynamic or spec.shape_dynamic else 64):
                raise AclFail(
                    C.GE_PARAM_INVALID,
                    f"output buffer for {tensor.name} holds {size} bytes, the gear "
                    f"needs {value.nbytes}",
                )
            RT.memory.write_device(addr, value)
        model.cur_gear = task.gear
        model.cur_shapes = {name: value.shape for name, value in outputs.items()}
        record = RT.executions.setdefault(model.id, {"count": 0})
        record.update(
            count=record["count"] + 1, gear=task.gear, inputs=arrays, shape_gear=model.shape_gear
        )
        return C.SUCCESS
    except AclFail as failure:
        RT.set_err(failure.message)
        return failure.code


def queue(task: Task) -> float:
    """Queue the execution on its device's timeline (once): when it ends there. The device
    starts it when the executions queued before it (by any process) have ended."""
    if task.end is None:
        timeline = RT.devices[task.model.device].timeline
        end = timeline.reserve(task.latency_s)
        while end is None:  # a hung execution holds the device, perhaps another process's
            time.sleep(HUNG_POLL_S)
            end = timeline.reserve(task.latency_s)
        task.end = end
    return task.end


def queue_or_hang(task: Task) -> None:
    """execute_async on a stream: queue the execution, or, with a hang poison in its inputs,
    let it take the device for good once what is queued before it has run: every later
    execution on the device, from any process, waits until the test releases it
    (`_emu.release_hangs`, or a reset) or this process ends. The real one never ends. Never
    waits (the caller holds the emulator lock): while a hang holds the device, the execution
    is queued when its stream is synchronised."""
    try:
        hangs = _om.hangs(task.model.spec, _read_inputs(task))
    except AclFail:  # unreadable inputs: the execution reports it when it runs
        hangs = False
    timeline = RT.devices[task.model.device].timeline
    if not hangs:
        task.end = timeline.reserve(task.latency_s)
        return
    RT.hung += 1
    task.hang = RT.unhang
    timeline.block()  # False: another hang holds the device already, and this one follows it


def run_task(task: Task, hold_lock: bool) -> int:
    """Wait until the execution has ended on the device (holding the GIL and the lock for a
    synchronous execute, as the real one holds the GIL; with neither under
    synchronize_stream), then compute."""
    try:
        if hold_lock:
            with RT.lock:
                hold_gil(queue(task) - time.monotonic())
                return _compute(task)
        if task.hang is not None:
            task.hang.wait()
        else:
            time.sleep(max(0.0, queue(task) - time.monotonic()))
        with RT.lock:
            return _compute(task)
    finally:
        task.model.busy = None


@entry("mdl.execute", "kkk", ret_only)
def execute(model_id: int, in_ds: int, out_ds: int) -> int:
    with RT.lock:
        task = _prepare(model_id, in_ds, out_ds, None)
        return run_task(task, hold_lock=True)


@entry("mdl.execute_async", "kkkk", ret_only)
def execute_async(model_id: int, in_ds: int, out_ds: int, stream: int) -> int:
    with RT.lock:
        task = _prepare(model_id, in_ds, out_ds, stream)
        if stream:
            RT.streams[stream].pending.append(task)  # a broken stream fails it at synchronize
            queue_or_hang(task)  # the device starts it once what is queued before it has run
        else:  # the context's default stream: emulate as synchronous
            return run_task(task, hold_lock=True)
        return C.SUCCESS
