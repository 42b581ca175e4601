"""Process-wide pyACL state and the per-instance device binding.

`acl.init` may run once per process, so it is done here behind a lock (a second init's
"already initialised" counts as success); `npu/teardown.py` finalizes at exit, after every
session still open is closed (it hands this module that cleanup through `set_exit_cleanup`, so
this state never imports the teardown that reads it). Each instance opens its own
`DeviceSession` on its own thread: a device reference, an explicit context bound to that
thread, and one stream. Open sessions are listed for the telemetry collector and for that
teardown.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, TypeVar

from backends.base import BackendError
from npu import constants as K
from npu.deadline import ExecutionDeadline
from npu.errors import AclError, check, recent_message, unwrap

log = logging.getLogger(__name__)
T = TypeVar("T")

_init_lock = threading.Lock()
_initialised: ModuleType | None = None  # the acl module this process initialised
_atexit_registered = False
_exit_cleanup: Callable[[], None] | None = None  # npu/teardown.py `at_exit`, once it is imported

_registry_lock = threading.Lock()
_sessions: list[DeviceSession] = []  # those telemetry reads
_open: list[DeviceSession] = []  # every session not closed yet, for the teardown at exit
_current = threading.local()  # .session: the DeviceSession whose context this thread has current
_closing = False  # set at exit: no new execution starts

CLOSING = "the server is shutting down: the NPU takes no new work"


def initialised() -> ModuleType | None:
    return _initialised


def stop_new_work() -> None:
    global _closing
    _closing = True


def open_sessions() -> list[DeviceSession]:
    with _registry_lock:
        return list(_open)


def forget(acl: ModuleType) -> None:
    """acl.finalize ran: a later session initialises again."""
    global _initialised
    with _init_lock:
        if _initialised is acl:
            _initialised = None


def reset() -> None:
    """Forget every session and take new work again, as in a fresh process: for a test that ran
    the exit teardown, or failed before unloading (its sessions would stay listed)."""
    global _closing
    _closing = False
    with _registry_lock:
        _sessions.clear()
        _open.clear()


def set_exit_cleanup(cleanup: Callable[[], None]) -> None:
    """What runs at exit once acl.init has run (registered with atexit by the first init)."""
    global _exit_cleanup
    _exit_cleanup = cleanup


def _at_exit() -> None:
    if _exit_cleanup is not None:
        _exit_cleanup()


def ensure_initialised(acl: ModuleType) -> None:
    """acl.init once per process (per acl module object, which is the same thing outside tests)."""
    global _initialised, _atexit_registered
    with _init_lock:
        if _initialised is acl:
            return
        ret = acl.init()
        if ret not in (K.SUCCESS, K.REPEAT_INITIALIZE):
            raise AclError("acl.init", ret, recent_message(acl))
        _initialised = acl
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True


class DeviceSession:
    """One instance's hold on one NPU: set_device, its own context (current on the thread that
    opened it) and its own stream. Every method runs on the instance's thread."""

    def __init__(self, acl: ModuleType, device_id: int) -> None:
        self.acl = acl
        self.device_id = device_id
        self.context = 0
        self.stream = 0
        self.run_mode = K.RUN_MODE_HOST
        self._device_set = False
        self._listed = False
        self.models: list[Any] = []  # OmModels loaded in this session's context
        self.deadline = ExecutionDeadline()  # the instance hands in its own (npu/deadline.py)
        # Set when an execution on the stream never finished: nothing here may be destroyed
        # any more (destroy_stream would wait for that execution), so the teardown at exit
        # leaves the session to the driver, which reclaims it when the process ends.
        self.abandoned = False
        # Held while a batch runs and while resources are released, so the teardown at exit
        # never destroys what a thread is still executing with.
        self.lock = threading.RLock()

    @classmethod
    def open(
        cls, acl: ModuleType, device_id: int, *, stream: bool = True, telemetry: bool = True
    ) -> DeviceSession:
        ensure_initialised(acl)
        _require_device(acl, device_id)
        session = cls(acl, device_id)
        try:
            check(acl, acl.rt.set_device(device_id), f"acl.rt.set_device({device_id})")
            session._device_set = True
            session.context = unwrap(
                acl, acl.rt.create_context(device_id), f"acl.rt.create_context({device_id})"
            )
            _current.session = session  # create_context made it current on this thread
            if stream:
                session.stream = unwrap(acl, acl.rt.create_stream(), "acl.rt.create_stream")
            session.run_mode = unwrap(acl, acl.rt.get_run_mode(), "acl.rt.get_run_mode")
        except BaseException:
            session.close()
            raise
        with _registry_lock:
            _open.append(session)
            if telemetry:
                _sessions.append(session)
                session._listed = True
        return session

    @contextmanager
    def running(self) -> Iterator[None]:
        """Around one execution: refused once the process is shutting down."""
        if _closing:
            raise BackendError(CLOSING)
        with self.lock:
            yield

    @property
    def h2d(self) -> int:
        """Copy kind for host numpy -> device (on-device programs copy device to device)."""
        on_host = self.run_mode == K.RUN_MODE_HOST
        return K.MEMCPY_HOST_TO_DEVICE if on_host else K.MEMCPY_DEVICE_TO_DEVICE

    @property
    def d2h(self) -> int:
        on_host = self.run_mode == K.RUN_MODE_HOST
        return K.MEMCPY_DEVICE_TO_HOST if on_host else K.MEMCPY_DEVICE_TO_DEVICE

    def bind(self) -> None:
        """Make this session's context current, if this thread has not got it already."""
        if getattr(_current, "session", None) is not self:
            check(self.acl, self.acl.rt.set_context(self.context), "acl.rt.set_context")
            _current.session = self

    def synchronize(self) -> None:
        """Wait for the stream (pyACL releases the GIL here, so other instances keep running),
        for at most the deadline's timeout where the binding can: a hung execution then fails
        with 507046 instead of holding the instance forever."""
        acl, deadline = self.acl, self.deadline
        with_timeout = getattr(acl.rt, "synchronize_stream_with_timeout", None)
        started = time.monotonic()
        if with_timeout is None:
            _no_timeout_once()
            check(acl, acl.rt.synchronize_stream(self.stream), "acl.rt.synchronize_stream")
        else:
            ret = with_timeout(self.stream, deadline.timeout_ms())
            check(acl, ret, "acl.rt.synchronize_stream_with_timeout")
        deadline.observe(time.monotonic() - started)

    def close(self) -> list[str]:
        """Destroy stream, then context, then drop the device reference (the documented order).
        Carries on past failures and returns them, so one bad step leaks nothing else."""
        with self.lock:
            return self._close()

    def _close(self) -> list[str]:
        with _registry_lock:  # after this the telemetry thread no longer touches the context
            if self in _sessions:
                _sessions.remove(self)
            if self in _open:
                _open.remove(self)
            self._listed = False
        problems: list[str] = []
        acl = self.acl
        if self.stream:
            _collect(problems, acl, acl.rt.destroy_stream(self.stream), "acl.rt.destroy_stream")
            self.stream = 0
        if self.context:
            _collect(problems, acl, acl.rt.destroy_context(self.context), "acl.rt.destroy_context")
            self.context = 0
        if getattr(_current, "session", None) is self:
            _current.session = None
        if self._device_set:
            _collect(
                problems,
                acl,
                acl.rt.reset_device(self.device_id),
                f"acl.rt.reset_device({self.device_id})",
            )
            self._device_set = False
        return problems


_warned_no_timeout = False


def _no_timeout_once() -> None:
    """An older binding without synchronize_stream_with_timeout: say once per process that a
    hung device will hold its instances."""
    global _warned_no_timeout
    if not _warned_no_timeout:
        _warned_no_timeout = True
        log.warning(
            "this pyACL has no acl.rt.synchronize_stream_with_timeout (CANN older than 8?): "
            "executions wait with acl.rt.synchronize_stream, without a timeout, so a hung "
            "NPU holds its instances until the process is killed"
        )


def _require_device(acl: ModuleType, device_id: int) -> None:
    """A device id this process cannot see refuses the instance by name, before set_device
    (whose own error says only 'invalid parameter'). Device ids are logical: numbered from 0
    among the NPUs ASCEND_RT_VISIBLE_DEVICES leaves visible."""
    count_of = getattr(acl.rt, "get_device_count", None)
    if count_of is None:
        return
    count = unwrap(acl, count_of(), "acl.rt.get_device_count")
    if not 0 <= device_id < count:
        seen = f"NPUs 0-{count - 1}" if count > 1 else ("NPU 0" if count else "no NPU")
        raise BackendError(
            f"NPU {device_id} does not exist: this process sees {seen} "
            "(instance_group gpus and the device_ids parameter take logical ids, numbered "
            "from 0 among the NPUs ASCEND_RT_VISIBLE_DEVICES leaves visible; npu-smi info "
            "lists them)"
        )


def _collect(problems: list[str], acl: ModuleType, ret: int, call: str) -> None:
    try:
        check(acl, ret, call)
    except AclError as exc:
        problems.append(exc.message)


def for_each_open_device(read: Callable[[ModuleType, int], T]) -> list[tuple[int, T]]:
    """Call `read(acl, device_id)` once per device an instance has open, on the calling thread
    with that instance's context made current, holding the registry lock so the context is not
    destroyed meanwhile. Returns [] without touching acl when no NPU model is loaded; a device
    whose query fails is left out (and logged)."""
    results: list[tuple[int, T]] = []
    with _registry_lock:
        seen: set[int] = set()
        for session in _sessions:
            if session.device_id in seen:
                continue
            seen.add(session.device_id)
            try:
                session.bind()
                results.append((session.device_id, read(session.acl, session.device_id)))
            except Exception as exc:  # telemetry must never break a scrape
                log.debug("NPU %s telemetry failed: %s", session.device_id, exc)
    return results
