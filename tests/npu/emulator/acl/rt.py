"""acl.rt: devices, contexts, streams, memory and device telemetry, shaped as the real binding."""

from __future__ import annotations

import threading

from . import _codes as C
from ._runtime import (
    RT,
    AclFail,
    Context,
    Stream,
    entry,
    hold_gil,
    hold_gil_for_call,
    ret_only,
    value_ret,
)

# -- devices and contexts ---------------------------------------------------------------------


@entry("rt.set_device", "k", ret_only, device_arg=0)
def set_device(device_id: int) -> int:
    with RT.lock:
        RT.require_init()
        dev = RT.require_device_id(device_id)
        if dev.lost:
            raise AclFail(507033, f"device {device_id} setup error (driver or firmware fault)")
        dev.refcount += 1
        if not dev.opened:
            dev.opened = True  # the first set_device opens the device: seconds, GIL held
            hold_gil_for_call("rt.set_device")
        if dev.default_ctx is None:
            dev.default_ctx = Context(RT.new_handle("context"), device_id, default=True)
            RT.contexts[dev.default_ctx.handle] = dev.default_ctx
        RT.bind(dev.default_ctx)
        return C.SUCCESS


@entry("rt.reset_device", "k", ret_only, device_arg=0)
def reset_device(device_id: int) -> int:
    with RT.lock:
        RT.require_init()
        dev = RT.require_device_id(device_id)
        if dev.refcount <= 0:
            RT.violate(f"reset_device({device_id}) without a matching set_device")
            raise AclFail(C.RT_PARAM_INVALID, f"device {device_id} is not set")
        dev.refcount -= 1
        if dev.refcount == 0:
            _release_device(dev)
        return C.SUCCESS


def _release_device(dev) -> None:
    """Refcount reached 0: the default context and its streams go; anything else is a leak."""
    leaks = []
    user = [a for a in RT.memory.live.values() if a.device == dev.id and a.owner == "user"]
    if user:
        leaks.append(f"{len(user)} device allocation(s) ({sum(a.size for a in user)} bytes)")
    models = [m for m in RT.models.values() if m.device == dev.id]
    if models:
        leaks.append(f"{len(models)} loaded model(s)")
    contexts = [c for c in RT.contexts.values() if c.device == dev.id and not c.default]
    if contexts:
        leaks.append(f"{len(contexts)} explicit context(s)")
    if leaks:
        RT.violate(f"reset_device({dev.id}) left " + ", ".join(leaks))
    ctx = dev.default_ctx
    if ctx is not None:
        for handle in list(ctx.streams):
            RT.streams.pop(handle, None)
            RT.retired.add(handle)
        ctx.destroyed = True
        RT.contexts.pop(ctx.handle, None)
        RT.retired.add(ctx.handle)
        dev.default_ctx = None


@entry("rt.get_device", "", value_ret)
def get_device() -> tuple[int, int]:
    with RT.lock:
        return RT.current_ctx().device, C.SUCCESS


@entry("rt.get_device_count", "", value_ret)
def get_device_count() -> tuple[int, int]:
    return len(RT.devices), C.SUCCESS


@entry("rt.get_run_mode", "", value_ret)
def get_run_mode() -> tuple[int, int]:
    return RT.config.run_mode, C.SUCCESS


@entry("rt.create_context", "k", value_ret, device_arg=0)
def create_context(device_id: int) -> tuple[int, int]:
    with RT.lock:
        RT.require_init()
        RT.require_device_id(device_id)
        RT.require_alive(device_id)
        ctx = Context(RT.new_handle("context"), device_id, default=False)
        RT.contexts[ctx.handle] = ctx
        RT.bind(ctx)
        return ctx.handle, C.SUCCESS


def _context(handle: int) -> Context:
    return RT.find(RT.contexts, handle, "context", C.RT_PARAM_INVALID)


@entry("rt.destroy_context", "k", ret_only)
def destroy_context(context: int) -> int:
    with RT.lock:
        RT.require_init()
        ctx = _context(context)
        if ctx.default:
            raise AclFail(C.RT_PARAM_INVALID, "the default context is released by reset_device")
        models = [m for m in RT.models.values() if m.ctx is ctx]
        if ctx.streams or models:
            RT.violate(
                f"destroy_context({context:#x}) with {len(ctx.streams)} live stream(s) "
                f"and {len(models)} loaded model(s)"
            )
        for handle in list(ctx.streams):
            RT.streams.pop(handle, None)
            RT.retired.add(handle)
        ctx.destroyed = True
        del RT.contexts[context]
        RT.retired.add(context)
        if RT.current_ctx_or_none() is None:
            RT.bind(None)
        return C.SUCCESS


@entry("rt.set_context", "k", ret_only)
def set_context(context: int) -> int:
    with RT.lock:
        RT.require_init()
        RT.bind(_context(context))
        return C.SUCCESS


@entry("rt.get_context", "", value_ret)
def get_context() -> tuple[int, int]:
    with RT.lock:
        return RT.current_ctx().handle, C.SUCCESS


# -- streams ----------------------------------------------------------------------------------


@entry("rt.create_stream", "", value_ret)
def create_stream() -> tuple[int, int]:
    with RT.lock:
        RT.require_init()
        ctx = RT.current_ctx()
        RT.require_alive(ctx.device)
        stream = Stream(RT.new_handle("stream"), ctx)
        RT.streams[stream.handle] = stream
        ctx.streams.add(stream.handle)
        return stream.handle, C.SUCCESS


def stream_in_current_context(handle: int) -> Stream:
    ctx = RT.current_ctx()
    stream = RT.streams.get(handle)
    if stream is None:
        if handle in RT.retired:
            RT.violate(f"use of destroyed stream {handle:#x}")
        raise AclFail(C.RT_PARAM_INVALID, f"stream {handle:#x} does not exist")
    if stream.ctx is not ctx:
        raise AclFail(C.RT_STREAM_CONTEXT, f"stream {handle:#x} belongs to another context")
    return stream


@entry("rt.destroy_stream", "k", ret_only)
def destroy_stream(stream: int) -> int:
    with RT.lock:
        RT.require_init()
        found = stream_in_current_context(stream)
        if found.stuck is not None and found.stuck.is_alive():
            RT.violate(
                f"destroy_stream({stream:#x}) while its work never finished (the real call "
                "waits for that work: forever on a hung device)"
            )
        if found.pending:
            RT.violate(f"destroy_stream({stream:#x}) with unsynchronised work")
            for task in found.pending:
                task.model.busy = None
            found.pending.clear()
        del RT.streams[stream]
        found.ctx.streams.discard(stream)
        RT.retired.add(stream)
        return C.SUCCESS


@entry("rt.synchronize_stream", "k", ret_only, inject=False)
def synchronize_stream(stream: int) -> int:
    """Runs the stream's queued executions. The waits happen without the emulator lock, the way
    the real call releases the GIL, so instances on other threads overlap."""
    found, tasks, device = _take_work(stream)
    return _run_work(found, stream, tasks, device)


def _take_work(stream: int) -> tuple[Stream, list, int]:
    """On the caller's thread (the stream must be in its current context): the queued work."""
    with RT.lock:
        RT.require_init()
        found = stream_in_current_context(stream)
        tasks, found.pending = found.pending, []
        return found, tasks, found.ctx.device


def _run_work(found: Stream, stream: int, tasks: list, device: int) -> int:
    """Run `tasks` in stream order (after any work still stuck on the stream); the code."""
    stuck = found.stuck
    if stuck is not None and stuck is not threading.current_thread():
        stuck.join()  # earlier work that never finished: what follows it waits for it
    with RT.lock:
        RT.syncing[threading.get_ident()] = f"{threading.current_thread().name} on {stream:#x}"
    from . import mdl

    first_error = C.SUCCESS
    try:
        for task in tasks:
            if found.broken:  # after an AI Core exception nothing more runs on this stream
                task.model.busy = None
                RT.set_err(f"stream {stream:#x} is broken by an earlier AI Core exception")
                code = found.broken
            else:
                code = mdl.run_task(task, hold_lock=False)
            if code and not first_error:
                first_error = code
    finally:
        RT.syncing.pop(threading.get_ident(), None)
    injected = RT.take_fault("rt.synchronize_stream", device)
    if injected is not None:
        RT.set_err(f"EZ9999: injected fault in acl.rt.synchronize_stream: error {injected}")
        return injected
    if not first_error and RT.devices[device].lost:
        RT.set_err(f"device {device} lost heartbeat")
        return C.RT_LOST_HEARTBEAT
    return first_error


@entry("rt.synchronize_stream_with_timeout", "ki", ret_only, inject=False)
def _synchronize_stream_with_timeout(stream: int, timeout: int) -> int:
    """aclrtSynchronizeStreamWithTimeout: as synchronize_stream, but gives up after `timeout`
    ms with 507046 (ACL_ERROR_RT_STREAM_SYNC_TIMEOUT); -1 waits forever. The work itself is
    not cancelled: it carries on (the stream's `stuck` thread) and holds what it holds."""
    if timeout == -1:
        return synchronize_stream(stream)
    if timeout <= 0:  # [infer] the docs allow only -1 and > 0
        raise AclFail(C.INVALID_PARAM, f"invalid timeout {timeout} (-1, or > 0 ms)")
    found, tasks, device = _take_work(stream)
    if _cannot_hang(found, tasks):
        # Nothing here can outlast a timeout: the work runs on the caller's thread as in
        # synchronize_stream, so the emulator adds no thread per call that the real binding
        # (one C call) does not have, and timings taken through it stay the binding's.
        return _run_work(found, stream, tasks, device)
    outcome: list = []

    def work() -> None:
        code = _run_work(found, stream, tasks, device)
        outcome.append((code, RT.take_err()))

    worker = threading.Thread(target=work, name=f"stream-{stream:#x}", daemon=True)
    worker.start()
    worker.join(timeout / 1000.0)
    if worker.is_alive():
        with RT.lock:
            found.stuck = worker
        RT.set_err(
            f"EE1002: Stream synchronize timeout: the work on stream {stream:#x} did not "
            f"finish within {timeout} ms"
        )
        return C.RT_STREAM_SYNC_TIMEOUT
    code, message = outcome[0]
    if message:
        RT.set_err(message)
    return code


def _cannot_hang(found: Stream, tasks: list) -> bool:
    """No stuck work on the stream, no hang poison in any of the tasks' models and no execution
    hung in this process so far (one could still hold the device)."""
    with RT.lock:
        if found.stuck is not None or RT.hung:
            return False
    return not any((task.model.spec.poison or {}).get("hang") for task in tasks)


def __getattr__(name: str):
    """An older binding has no synchronize_stream_with_timeout (Config.sync_with_timeout)."""
    if name == "synchronize_stream_with_timeout" and RT.config.sync_with_timeout:
        return _synchronize_stream_with_timeout
    raise AttributeError(f"module 'acl.rt' has no attribute '{name}'")


# -- memory -----------------------------------------------------------------------------------


@entry("rt.malloc", "kk", value_ret)
def malloc(size: int, policy: int) -> tuple[int, int]:
    with RT.lock:
        RT.require_init()
        ctx = RT.current_ctx()
        RT.require_alive(ctx.device)
        if policy not in range(6):
            raise AclFail(C.INVALID_PARAM, f"invalid malloc policy {policy}")
        return RT.memory.allocate(ctx.device, size).ptr, C.SUCCESS


@entry("rt.free", "k", ret_only)
def free(ptr: int) -> int:
    with RT.lock:
        RT.require_init()
        RT.memory.release(ptr)
        return C.SUCCESS


@entry("rt.malloc_host", "k", value_ret)
def malloc_host(size: int) -> tuple[int, int]:
    with RT.lock:
        RT.require_init()
        RT.current_ctx()
        return RT.memory.malloc_host(size), C.SUCCESS


@entry("rt.free_host", "k", ret_only)
def free_host(ptr: int) -> int:
    with RT.lock:
        RT.require_init()
        RT.memory.free_host(ptr)
        return C.SUCCESS


@entry("rt.memcpy", "kkkkk", ret_only)
def memcpy(dst: int, dst_max: int, src: int, count: int, kind: int) -> int:
    with RT.lock:
        RT.require_init()
        RT.current_ctx()
        RT.memory.copy(dst, dst_max, src, count, kind)
        if RT.config.copy_bytes_per_s > 0:  # synchronous, from pageable memory, GIL held
            hold_gil(count / RT.config.copy_bytes_per_s)
        return C.SUCCESS


@entry("rt.memset", "kkkk", ret_only)
def memset(ptr: int, max_size: int, value: int, count: int) -> int:
    with RT.lock:
        RT.require_init()
        RT.current_ctx()
        RT.memory.fill(ptr, max_size, value, count)
        return C.SUCCESS


# -- telemetry --------------------------------------------------------------------------------


@entry("rt.get_mem_info", "k", lambda code: (0, 0, code))
def get_mem_info(attr: int) -> tuple[int, int, int]:
    with RT.lock:
        RT.require_init()
        ctx = RT.current_ctx()
        RT.require_alive(ctx.device)
        dev = RT.devices[ctx.device]
        total = RT.config.memory_bytes
        answers = attr == C.MEM_DDR and not RT.config.has_hbm or attr == C.MEM_HBM
        if not answers:
            return 0, 0, C.SUCCESS
        _, others = dev.timeline.charge(dev.charged, total)  # the device's, every process's
        return max(0, total - dev.charged - others), total, C.SUCCESS


@entry("rt.get_device_utilization_rate", "k", lambda code: ({}, code), device_arg=0)
def get_device_utilization_rate(device_id: int) -> tuple[dict, int]:
    with RT.lock:
        RT.require_init()
        dev = RT.require_device_id(device_id)
        cube = max(0, min(100, int(round(100 * dev.timeline.utilisation()))))
        return (
            {
                "cube_utilization": cube,
                "vector_utilization": -1,
                "aicpu_utilization": 0,
                "memory_utilization": -1,
                "utilization_extend": 0,
            },
            C.SUCCESS,
        )
