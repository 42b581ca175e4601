"""The emulator's process-wide state: devices, contexts, streams, handles, faults, violations.

Everything lives on one `Runtime` object (`RT`) guarded by one re-entrant lock. Time is modelled
the way the real binding spends it (shared reference/pyacl.md, section 6): the calls whose
wrappers keep the GIL (a synchronous execute, memcpy, load_from_file, get_desc, gear setting,
the first set_device) wait in `hold_gil`, a C sleep made through `ctypes.PyDLL` that keeps the
real GIL, so every other Python thread of the process, an event loop included, stalls as it
would on hardware. `synchronize_stream` waits with `time.sleep`, which releases it. Each
device runs one execution at a time (`Device.timeline`, _timeline.py): streams on one device
serialise, whichever process submitted them (with `timeline_dir` set), and devices run in parallel.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _codes as C
from ._timeline import DeviceTimeline


class EmulatorViolation(AssertionError):
    """Misuse that real hardware would punish silently or undefinedly; it fails the test."""


class DoubleFree(EmulatorViolation):
    pass


class ConcurrentModelUse(EmulatorViolation):
    pass


class DanglingHostPointer(EmulatorViolation):
    pass


class AclFail(Exception):
    """Raised inside an emulated call; the entry wrapper turns it into the call's error return."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Config:
    device_count: int = 2
    memory_bytes: int = 1 << 30  # per device
    soc_name: str = "Ascend310P3"
    has_hbm: bool = False  # 310P: HBM queries are redirected to DDR
    run_mode: int = C.RUN_MODE_HOST
    strict_dynamic_sizes: bool = False  # flag dynamic inputs whose buffer is not gear-sized
    require_gear_before_execute: bool = True  # dynamic model executed without a gear -> 145013
    dims_show_max_gear: bool = False  # input dims give the largest gear instead of -1
    # CANN 8 documents memcpy's `kind` as reserved: the direction comes from the pointers.
    # False gives older CANN's check of kind against the pointers (107000 on a mismatch).
    memcpy_kind_reserved: bool = True
    latency_scale: float = 1.0  # multiplies every model's latency_ms
    # A synchronous memcpy from pageable host memory holds the GIL for count / this (bytes/s);
    # 0: copies take no time.
    copy_bytes_per_s: float = 4e9
    # The gear setters (set_dynamic_batch_size / _hw_size / set_input_dynamic_dims) copy each
    # value they write to the device with its own synchronous aclrtMemcpy (GE's ge_executor.cc:
    # 1 for a batch, 2 for H and W, one per dynamic dim) and, like every pyACL wrapper but the
    # waits, never release the GIL: each such copy holds it this long.
    gear_copy_s: float = 20e-6
    # Seconds a call holds the GIL besides its copies and the model's load_ms / latency, by
    # call name ("mdl.get_desc", "mdl.set_dynamic_batch_size", ...; "rt.set_device" counts
    # only for a device's first set_device in the process).
    gil_s: dict = field(default_factory=dict)
    fill_byte: int = 0xA5  # fresh device memory is not zeroed
    # The binding has acl.rt.synchronize_stream_with_timeout (CANN 8 does); False: an older
    # binding without it, where `getattr(acl.rt, name)` raises AttributeError.
    sync_with_timeout: bool = True
    # A directory shared by the processes of one test (tests/support/om_fixtures.emulator_env
    # makes one): each device's execution timeline is a file there, so executions submitted by
    # several processes queue on the same emulated device, as on a card. Empty: per process.
    timeline_dir: str = ""


@dataclass
class Fault:
    fn: str
    ret: int
    count: int | None = 1  # None: forever
    after: int = 0  # let this many matching calls succeed first
    device: int | None = None

    def take(self, fn: str, device: int | None) -> bool:
        if fn != self.fn or (self.device is not None and device != self.device):
            return False
        if self.after > 0:
            self.after -= 1
            return False
        if self.count is not None:
            if self.count <= 0:
                return False
            self.count -= 1
        return True


@dataclass(eq=False)
class Context:
    handle: int
    device: int
    default: bool
    destroyed: bool = False
    streams: set = field(default_factory=set)


@dataclass(eq=False)
class Stream:
    handle: int
    ctx: Context
    pending: list = field(default_factory=list)
    broken: int = 0  # an AI Core exception leaves the stream failing until it is destroyed
    # The thread still running this stream's work after a synchronize_stream_with_timeout ran
    # out (a hung execution): later work on the stream waits behind it, as on the device.
    stuck: threading.Thread | None = None


@dataclass(eq=False)
class Device:
    id: int
    base: int
    refcount: int = 0
    opened: bool = False  # set_device ran once in this process (the slow first open)
    default_ctx: Context | None = None
    charged: int = 0
    lost: bool = False
    next_addr: int = 0
    # When the device is free next and how long it was busy (shared across processes when
    # Config.timeline_dir is set): one execution at a time per device, whatever the stream.
    timeline: DeviceTimeline = field(default_factory=lambda: DeviceTimeline(0))


@dataclass(eq=False)
class DataBuffer:
    handle: int
    addr: int
    size: int


@dataclass(eq=False)
class Dataset:
    handle: int
    buffers: list = field(default_factory=list)
    gear: int | None = None


_HANDLE_BASES = {
    "context": 0x7A10_0000_0000,
    "stream": 0x7A20_0000_0000,
    "desc": 0x7A30_0000_0000,
    "dataset": 0x7A40_0000_0000,
    "buffer": 0x7A50_0000_0000,
    "aipp": 0x7A60_0000_0000,
}
DEVICE_BASE = 1 << 48
DEVICE_SPAN = 1 << 40  # address range per device


class Runtime:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.reset()

    def reset(self, config: Config | None = None) -> None:
        with self.lock:
            self.config = config or config_from_env()
            self.tls = threading.local()
            self.initialised = False
            self.ever_initialised = False
            for old in getattr(self, "devices", {}).values():
                old.timeline.unblock()  # a hang of this process ends with the reset
                old.timeline.charge(0, 0)  # and its device memory is given back
                old.timeline.close()
            self.devices = {d: new_device(d, self.config) for d in range(self.config.device_count)}
            self._counters = {kind: itertools.count(1) for kind in _HANDLE_BASES}
            self._model_ids = itertools.count(1)
            self.contexts: dict[int, Context] = {}
            self.streams: dict[int, Stream] = {}
            self.buffers: dict[int, DataBuffer] = {}
            self.datasets: dict[int, Dataset] = {}
            self.descs: dict[int, Any] = {}
            self.models: dict[int, Any] = {}
            self.retired: set[int] = set()  # destroyed handles, to tell a double destroy
            self.faults: list[Fault] = []
            self.violations: list[str] = []
            self.executions: dict[int, dict] = {}
            self.aipps: dict[int, Any] = {}
            self.syncing: dict[int, str] = {}  # thread id -> stream it waits on, for finalize
            # A hung execution (poison "hang") waits for this: set by _emu.release_hangs and by
            # a reset, so a test process never keeps a thread that waits forever.
            previous = getattr(self, "unhang", None)
            if previous is not None:
                previous.set()
            self.unhang = threading.Event()
            self.hung = 0  # executions that hung so far
            from . import _memory

            self.memory = _memory.Ledger(self)
            for spec in _env_faults():
                self.faults.append(Fault(**spec))
            for dev in _env_lost_devices():
                if dev in self.devices:
                    self.devices[dev].lost = True

    # -- handles ------------------------------------------------------------------------------
    def new_handle(self, kind: str) -> int:
        return _HANDLE_BASES[kind] + next(self._counters[kind]) * 0x40

    def new_model_id(self) -> int:
        return next(self._model_ids)

    # -- errors and violations ----------------------------------------------------------------
    def set_err(self, message: str) -> None:
        self.tls.err = message

    def take_err(self) -> str | None:
        message = getattr(self.tls, "err", None)
        self.tls.err = None
        return message

    def violate(self, message: str, exc: type[EmulatorViolation] | None = None) -> None:
        """Record misuse; `assert_clean` fails on it even when the caller swallowed the error."""
        with self.lock:
            self.violations.append(message)
        if exc is not None:
            raise exc(message)

    def find(self, table: dict, handle: int, what: str, code: int = C.INVALID_PARAM) -> Any:
        """The live object behind a handle; a destroyed one is also recorded as misuse."""
        found = table.get(handle)
        if found is None:
            if handle in self.retired:
                self.violate(f"use of destroyed {what} {handle:#x}")
            raise AclFail(code, f"{what} {handle:#x} does not exist")
        return found

    # -- preconditions ------------------------------------------------------------------------
    def require_init(self) -> None:
        if not self.initialised:
            raise AclFail(C.UNINITIALIZE, "acl.init has not been called (or acl.finalize was)")

    def require_device_id(self, device: int) -> Device:
        if device not in self.devices:
            raise AclFail(
                C.RT_INVALID_DEVICEID,
                f"invalid device id {device}: {len(self.devices)} device(s) visible",
            )
        return self.devices[device]

    def current_ctx(self) -> Context:
        ctx = getattr(self.tls, "ctx", None)
        if ctx is None or ctx.destroyed:
            raise AclFail(
                C.RT_CONTEXT_NULL,
                "no context is current on this thread: call acl.rt.set_device or "
                "acl.rt.set_context on this thread first",
            )
        return ctx

    def current_ctx_or_none(self) -> Context | None:
        ctx = getattr(self.tls, "ctx", None)
        return None if ctx is None or ctx.destroyed else ctx

    def bind(self, ctx: Context | None) -> None:
        self.tls.ctx = ctx

    def require_alive(self, device: int) -> None:
        if self.devices[device].lost:
            raise AclFail(
                C.RT_LOST_HEARTBEAT,
                f"device {device} lost heartbeat (device fault; reset required)",
            )

    # -- faults -------------------------------------------------------------------------------
    def take_fault(self, fn: str, device: int | None) -> int | None:
        with self.lock:
            for fault in self.faults:
                if fault.take(fn, device):
                    if fault.ret == C.RT_LOST_HEARTBEAT and device is not None:
                        self.devices[device].lost = True
                    return fault.ret
        return None


def new_device(device: int, config: Config) -> Device:
    base = DEVICE_BASE + device * DEVICE_SPAN
    timeline = DeviceTimeline(device, config.timeline_dir or None)
    return Device(device, base, next_addr=base, timeline=timeline)


def config_from_env() -> Config:
    raw = json.loads(os.environ.get("ACL_EMU_CONFIG", "{}") or "{}")
    fields = {k: v for k, v in raw.items() if k in Config.__dataclass_fields__}
    return Config(**fields)


def _env_faults() -> list[dict]:
    return list(json.loads(os.environ.get("ACL_EMU_CONFIG", "{}") or "{}").get("faults", []))


def _env_lost_devices() -> list[int]:
    return list(json.loads(os.environ.get("ACL_EMU_CONFIG", "{}") or "{}").get("lost_devices", []))


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_GIL_HOLDER = ctypes.PyDLL(None)  # PyDLL: the GIL stays held for the whole foreign call
_GIL_HOLDER.nanosleep.argtypes = [ctypes.POINTER(_Timespec), ctypes.POINTER(_Timespec)]


def hold_gil(seconds: float) -> None:
    """Sleep without releasing the GIL, as a pyACL call that never calls PyEval_SaveThread
    does: no other Python thread of this process runs meanwhile."""
    if seconds <= 0:
        return
    whole = int(seconds)
    request = _Timespec(whole, int((seconds - whole) * 1e9))
    remaining = _Timespec(0, 0)
    while _GIL_HOLDER.nanosleep(ctypes.byref(request), ctypes.byref(remaining)) != 0:
        if remaining.tv_sec <= 0 and remaining.tv_nsec <= 0:
            break  # interrupted by a signal right at the end
        request = _Timespec(remaining.tv_sec, remaining.tv_nsec)


def hold_gil_for_call(name: str) -> None:
    """The configured extra GIL time of one call (Config.gil_s)."""
    extra = RT.config.gil_s.get(name) if RT.config.gil_s else None
    if extra:
        hold_gil(float(extra))


_INT_CODES = frozenset("kKIibhB")


def _check_args(name: str, spec: str, args: tuple) -> None:
    """PyArg_ParseTuple's view: integer codes take ints, "f" numbers, "s" str, "O" anything."""
    required, _, optional = spec.partition("|")
    if not len(required) <= len(args) <= len(required) + len(optional):
        raise TypeError(f"acl.{name} args parse failed")
    for code, value in zip(required + optional, args, strict=False):
        ok = (
            isinstance(value, int)
            if code in _INT_CODES
            else isinstance(value, (int, float))
            if code == "f"
            else isinstance(value, str)
            if code == "s"
            else True
        )
        if not ok:
            raise TypeError(f"acl.{name} args parse failed")


def entry(
    name: str,
    spec: str,
    fail: Callable[[int], Any] | None = None,
    device_arg: int | None = None,
    inject: bool = True,
) -> Callable:
    """Wrap one emulated call: argument parsing like the C binding ("k" = int, "s" = str),
    injected faults, and AclFail turned into this call's own error-return shape."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args: Any) -> Any:
            _check_args(name, spec, args)
            if fail is not None and inject and RT.faults:
                if device_arg is not None:
                    device = args[device_arg]
                else:
                    ctx = RT.current_ctx_or_none()
                    device = ctx.device if ctx else None
                code = RT.take_fault(name, device)
                if code is not None:
                    RT.set_err(f"EZ9999: injected fault in acl.{name}: error {code}")
                    return fail(code)
            try:
                return fn(*args)
            except AclFail as failure:
                if fail is None:
                    raise
                RT.set_err(failure.message)
                return fail(failure.code)
            finally:
                if name != "rt.set_device" and RT.config.gil_s:
                    hold_gil_for_call(name)

        return call

    return decorate


def ret_only(code: int) -> int:
    return code


def value_ret(code: int) -> tuple[int, int]:
    return 0, code


def dict_ret(code: int) -> tuple[dict, int]:
    return {}, code


RT = Runtime()
