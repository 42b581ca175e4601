"""The `ascend` backend the server loads: each instance runs in an NPU executor process.

The first instance of a model version's instance group on a device starts the executor
(npu/executor/main.py) through the Python backend's spawner, so it dies with the server
(parent-death signal) and is killed at the exit deadline like any worker; each instance then
gets a channel of its own into it (a socket passed over the control channel) and loads its
`AscendBackend` there. A batch crosses in the shared-memory arenas of backends/python/wire/.
Nothing here imports pyACL: a load of seconds, every copy and every gear change stall only
the executor, never the event loop, and another model's executor not at all.

Supervision: when the process dies, the batches it was running fail at once (UNAVAILABLE,
naming the exit), `healthy()` is False, and a supervisor thread starts a new process and
loads every instance of it again; batches that arrive meanwhile wait for that (up to
RESTART_WAIT_S). After `max_worker_crashes` crashes within `worker_crash_window_s` (config
parameters, as for Python models; defaults 3 in 60 s) the instances stay down.

A hung execution (npu/deadline.py) answers this side as a "hung" UNAVAILABLE reply: the
batch fails with 503, the instance turns unhealthy for good, and the timeout is counted and
logged here, in the process whose metrics endpoint and log a person reads.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from backends.base import Backend, BackendError, InstanceSpec, ParameterBound
from backends.python import process as workers
from backends.python.backend import (
    CRASH_PARAMETER_BOUNDS,
    RESTART_BACKOFF_S,
    RESTART_WAIT_S,
    CrashWindow,
    crash_window,
    number_parameter,
)
from backends.python.process import WorkerDied, WorkerProcess
from backends.python.wire.framing import ArenaReader
from npu import config as npu_config
from npu import deadline as npu_deadline
from npu.executor.buffers import InputArena, OutputSlabs
from protocol import errors

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

MODULE = "npu.executor.main"
# Output slabs per instance (config parameter `executor_output_buffers`; 0: copy outputs out).
DEFAULT_OUTPUT_BUFFERS = 4
MAX_OUTPUT_BUFFERS = 64
LOAD_TIMEOUT_S = 600.0  # a large model's load may take minutes
FINALIZE_TIMEOUT_S = 10.0  # the executor's own teardown (unload, reset, acl.finalize)

# Instances of one group on one NPU that share an executor process (config parameter
# `executor_instances_per_process`; 0: all of them). One process per instance by default: the
# GIL-holding copies and the reply of one instance then never delay another's return from the
# device or its next batch (bench/FINDINGS.md, "the device never waits for the host"); each
# process pays its own pyACL runtime and copy of the model's host state.
DEFAULT_INSTANCES_PER_PROCESS = 1
MAX_INSTANCES_PER_PROCESS = 64

Key = tuple[str, str, str, int, int]  # (model, version dir, instance group, device, process)

_lock = threading.Lock()
_executors: dict[Key, Executor] = {}


class Executor:
    """One executor process and the instances attached to it."""

    _READY, _RESTARTING, _FAILED, _STOPPED = "ready", "restarting", "failed", "stopped"

    def __init__(self, key: Key, crashes: CrashWindow) -> None:
        self.key = key
        self.label = f"NPU executor {key[4]} for model '{key[0]}' group '{key[2]}' on NPU {key[3]}"
        self.crashes = crashes
        self.cond = threading.Condition()
        self.state = self._STOPPED
        self.failure = ""
        self.control: WorkerProcess | None = None
        self.instances: list[AscendExecutorBackend] = []
        self.restarts = 0

    # -- process -------------------------------------------------------------------------
    def args(self) -> list[str]:
        """What `ps` shows after the module: which model, group, device and process this is."""
        model, _, group, device, process = self.key
        return [
            "--model",
            model,
            "--group",
            group,
            "--device",
            str(device),
            "--process",
            str(process),
        ]

    def start(self) -> None:
        try:
            control = WorkerProcess.spawn(module=MODULE, extra_args=self.args())
        except WorkerDied as exc:
            raise BackendError(f"the NPU executor process {exc.detail}") from None
        with self.cond:
            self.control = control
            self.state = self._READY
            self.cond.notify_all()
        threading.Thread(
            target=self._supervise, args=(control,), name=f"supervisor-{self.label}", daemon=True
        ).start()

    def call(self, message: dict, timeout: float | None = None) -> dict:
        """One control-channel call; BackendError when it fails."""
        control = self.control
        if control is None:
            raise BackendError(f"{self.label} is not running")
        try:
            reply, _ = control.call(message, timeout=timeout)
        except WorkerDied as exc:
            raise BackendError(f"{self.label}: the process {exc.detail}") from None
        if not reply.get("ok"):
            raise BackendError(reply.get("error", f"{message.get('op')} failed"))
        return reply

    def attach(self, name: str) -> WorkerProcess:
        """A new channel into the process for one instance."""
        control = self.control
        if control is None:
            raise BackendError(f"{self.label} is not running")
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            control.call({"op": "attach", "name": name}, [child.fileno()])
        except WorkerDied as exc:
            parent.close()
            raise BackendError(f"{self.label}: the process {exc.detail}") from None
        finally:
            child.close()
        return WorkerProcess(control.process, parent, owns_process=False)

    def stop(self) -> None:
        """No instance is left: let the process finish its teardown and exit."""
        with self.cond:
            self.state = self._STOPPED
            control, self.control = self.control, None
            self.cond.notify_all()
        if control is not None:
            control.finalize(FINALIZE_TIMEOUT_S)

    # -- supervision -----------------------------------------------------------------------
    def _supervise(self, control: WorkerProcess) -> None:
        while True:
            code = control.wait()
            control.sever()
            detail = workers.describe_exit(code)
            with self.cond:
                if self.state == self._STOPPED or control is not self.control:
                    return
                if workers.workers_ended():
                    self.state = self._STOPPED
                elif self.crashes.record(time.monotonic()):
                    self.state = self._RESTARTING
                else:
                    self._give_up(detail)
                self.cond.notify_all()
                verdict = self.state
            with _lock:
                instances = list(self.instances)
            for instance in instances:
                instance._lost()
            control.close(0.1)
            if verdict != self._RESTARTING:
                return
            log.error("%s: the process (pid %d) %s; restarting it", self.label, control.pid, detail)
            replacement = self._restart(instances)
            if replacement is None:
                return
            control = replacement

    def _restart(self, instances: list[AscendExecutorBackend]) -> WorkerProcess | None:
        while True:
            with self.cond:
                if self.state == self._STOPPED:
                    return None
            spawned: WorkerProcess | None = None
            try:
                control = spawned = WorkerProcess.spawn(module=MODULE, extra_args=self.args())
                self.control = control
                for instance in instances:
                    instance._attach(self)
            except (BackendError, WorkerDied) as exc:
                if spawned is not None:  # an instance failed to load again: end this try's process
                    spawned.finalize(FINALIZE_TIMEOUT_S)
                detail = exc.message if isinstance(exc, BackendError) else exc.detail
                log.error("%s: restart failed: %s", self.label, detail)
                with self.cond:
                    if self.state == self._STOPPED:
                        return None
                    if not self.crashes.record(time.monotonic()):
                        self._give_up(f"restart failed: {detail}")
                        return None
                time.sleep(RESTART_BACKOFF_S)
                continue
            with self.cond:
                if self.state == self._STOPPED:
                    control.finalize(FINALIZE_TIMEOUT_S)
                    return None
                self.state = self._READY
                self.restarts += 1
                self.cond.notify_all()
            log.warning("%s: restarted (pid %d)", self.label, control.pid)
            return control

    def _give_up(self, detail: str) -> None:
        """With the lock held: the instances stay down."""
        self.state = self._FAILED
        self.failure = (
            f"{self.label}: the process crashed {self.crashes.count} times within "
            f"{self.crashes.window_s:g} s (last: {detail}); not restarting it"
        )
        log.error("%s", self.failure)

    def ready(self) -> None:
        """Wait out a restart; BackendError (fatal) when the executor is down for good."""
        deadline = time.monotonic() + RESTART_WAIT_S
        with self.cond:
            while self.state == self._RESTARTING:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise errors.Unavailable(f"{self.label} is restarting")
                self.cond.wait(remaining)
            if self.state == self._FAILED:
                raise BackendError(self.failure, fatal=True)
            if self.state == self._STOPPED:
                raise BackendError(f"{self.label} is not running", fatal=True)

    def healthy(self) -> bool:
        with self.cond:
            return self.state == self._READY

    def failed(self) -> bool:
        with self.cond:
            return self.state == self._FAILED


def _executor_with_room(
    place: tuple[str, str, str, int], per_process: int, config: ModelConfig
) -> Executor:
    """The first executor of this group on this NPU with room for one more instance
    (`per_process`; 0: no limit), a new one started when none has (called with _lock held)."""
    process = 0
    while True:
        key = (*place, process)
        executor = _executors.get(key)
        if executor is None:
            executor = Executor(key, crash_window(config))
            executor.start()
            _executors[key] = executor
            return executor
        if per_process <= 0 or len(executor.instances) < per_process:
            return executor
        process += 1


def readings() -> list[tuple[int, Any]]:
    """(device, DeviceReading) from every running executor, one per device (the first: the
    device's memory and utilisation are the same whichever process reads them)."""
    with _lock:
        executors = list(_executors.values())
    seen: set[int] = set()
    found: list[tuple[int, Any]] = []
    for executor in executors:
        if not executor.healthy() or not executor.instances:
            continue
        try:
            answer = executor.call({"op": "telemetry"})
        except BackendError as exc:
            log.debug("%s telemetry failed: %s", executor.label, exc.message)
            continue
        for device_id, reading in answer.get("readings", []):
            if device_id not in seen:
                seen.add(device_id)
                found.append((device_id, reading))
    return found


def close_executors() -> None:
    """At exit: let every executor still running tear down and exit."""
    with _lock:
        executors = list(_executors.values())
        _executors.clear()
    for executor in executors:
        executor.stop()


atexit.register(close_executors)  # after end_workers was registered: runs before it


class AscendExecutorBackend(Backend):
    """One Ascend instance, run by its executor process."""

    backend_name: ClassVar[str] = "ascend"
    platforms: ClassVar[tuple[str, ...]] = ("ascend_om",)
    default_model_filename: ClassVar[str] = "model.om"
    parameter_bounds: ClassVar[Mapping[str, ParameterBound]] = {
        **CRASH_PARAMETER_BOUNDS,
        **npu_deadline.PARAMETER_BOUNDS,
        "executor_output_buffers": ParameterBound(0, MAX_OUTPUT_BUFFERS, integer=True),
        "executor_instances_per_process": ParameterBound(
            0, MAX_INSTANCES_PER_PROCESS, integer=True
        ),
    }
    gathers_batches: ClassVar[bool] = True  # requests join straight into the shared arena

    def __init__(
        self, config: ModelConfig, model_dir: Path, version_dir: Path, instance: InstanceSpec
    ) -> None:
        super().__init__(config, model_dir, version_dir, instance)
        self.batch_gears: tuple[int, ...] = ()
        self._executor: Executor | None = None
        self._channel: WorkerProcess | None = None
        self._healthy = True
        self._inputs = InputArena()
        self._fallback = ArenaReader()  # the executor's arena, when no output slab was free
        self._slabs: OutputSlabs | None = None
        self._slab_limit = int(
            number_parameter(config, "executor_output_buffers", DEFAULT_OUTPUT_BUFFERS)
        )
        self._per_process = int(
            number_parameter(
                config, "executor_instances_per_process", DEFAULT_INSTANCES_PER_PROCESS
            )
        )

    @classmethod
    def place_instances(cls, config: ModelConfig) -> None:
        npu_config.place(config)

    @classmethod
    def auto_complete(cls, config: ModelConfig, model_dir: Path, version_dir: Path) -> None:
        """Read the `.om` in a short-lived executor (reading it is pyACL calls too)."""
        key = (config.name, str(version_dir), "<auto-complete>", npu_config.probe_device(config), 0)
        executor = Executor(key, CrashWindow(0, 0.0))
        executor.start()
        try:
            reply = executor.call(
                {
                    "op": "auto_complete",
                    "config": config.SerializeToString(),
                    "model_dir": str(model_dir),
                    "version_dir": str(version_dir),
                },
                timeout=LOAD_TIMEOUT_S,
            )
        finally:
            executor.stop()
        config.ParseFromString(reply["config"])

    def load(self) -> None:
        group = self.instance.name.rsplit("_", 1)[0]
        place = (self.config.name, str(self.version_dir), group, self.instance.device_id)
        with _lock:  # listed before it attaches, so a last unload meanwhile keeps the process
            executor = _executor_with_room(place, self._per_process, self.config)
            executor.instances.append(self)
        try:
            self._attach(executor)
        except BaseException:
            self._detach(executor)
            raise

    def _attach(self, executor: Executor) -> None:
        """Open this instance's channel into `executor` and load the model there."""
        channel = executor.attach(self.instance.name)
        try:
            reply, _ = channel.call(
                {
                    "op": "load",
                    "config": self.config.SerializeToString(),
                    "model_dir": str(self.model_dir),
                    "version_dir": str(self.version_dir),
                    "instance": (
                        self.instance.name,
                        self.instance.kind,
                        self.instance.device_id,
                        self.instance.index,
                    ),
                },
                timeout=LOAD_TIMEOUT_S,
            )
        except WorkerDied as exc:
            channel.close()
            raise BackendError(f"{executor.label}: the process {exc.detail} during load") from None
        if not reply.get("ok"):
            channel.close()
            raise BackendError(reply.get("error", "load failed"))
        self.batch_gears = tuple(reply.get("gears", ()))
        if self._slabs is None and self._slab_limit > 0:
            self._slabs = OutputSlabs(int(reply.get("output_bytes", 0)), self._slab_limit)
        elif self._slabs is not None:
            self._slabs.reset()  # a new process: the slabs are mapped there afresh
        self._inputs.resend()
        previous = self._channel  # the channel into a process that died (a restart)
        self._executor, self._channel, self._healthy = executor, channel, True
        if previous is not None:
            previous.close()

    def _lost(self) -> None:
        """The process died (supervisor thread): wake a batch waiting on it."""
        channel = self._channel
        if channel is not None:
            channel.sever()

    def gather(self, requests: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The batch's inputs, joined once, straight into the arena the executor reads."""
        return self._inputs.gather(requests)

    def execute(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        executor = self._executor
        if executor is None:
            raise BackendError(f"instance {self.instance.name} has no model loaded", fatal=True)
        executor.ready()
        channel = self._channel
        assert channel is not None
        if inputs is not self._inputs.gathered:  # not from gather(): a direct call
            self.gather([inputs])
        message: dict[str, Any] = {"op": "execute", "requests": [self._inputs.refs]}
        fds: list[int] = []
        new_inputs = self._inputs.take_new_fd()
        if new_inputs is not None:
            message["new_inputs"] = True
            fds.append(new_inputs)
        slabs = self._slabs
        slab = slabs.acquire() if slabs is not None else None
        if slab is not None:
            message["slab"] = slab[0]
            if slab[1] is not None:
                message["new_slab"] = True
                fds.append(slab[1])
        try:
            reply, reply_fds = channel.call(message, fds)
        except WorkerDied as exc:
            if slab is not None and slabs is not None:
                slabs.give_back(slab[0])
            raise errors.Unavailable(
                f"{executor.label}: the process {exc.detail} while running this batch; "
                "it is being restarted"
            ) from None
        placed = reply.get("slab_outputs")
        if slab is not None and placed is None:
            assert slabs is not None
            slabs.give_back(slab[0])
        if not reply.get("ok"):
            for fd in reply_fds:
                os.close(fd)
            self._healthy = bool(reply.get("healthy", True))
            text = reply.get("error", "execute failed")
            if reply.get("kind") == "invalid":
                raise errors.InvalidArgument(text)
            if reply.get("kind") == "unavailable":
                if reply.get("hung"):
                    self._hung(text)
                raise errors.Unavailable(text)
            raise BackendError(text, fatal=bool(reply.get("fatal")))
        self._healthy = bool(reply.get("healthy", True))
        if placed is not None:
            assert slabs is not None and slab is not None
            return slabs.views(slab[0], placed)
        if reply_fds:
            self._fallback.adopt(reply_fds[0])
            for extra in reply_fds[1:]:
                os.close(extra)
        return {ref[0]: self._fallback.copy(ref) for ref in reply["outputs"][0]}

    def _hung(self, message: str) -> None:
        """The executor says an execution never finished: the instance is out of service
        (healthy() False, so the pool gives it no more work), counted and logged here."""
        self._healthy = False
        npu_deadline.record_timeout(self.config.name, self.instance.device_id)
        log.error(
            "model '%s' instance %s on NPU %s taken out of service: %s",
            self.config.name,
            self.instance.name,
            self.instance.device_id,
            message,
        )

    def unload(self) -> None:
        executor, channel = self._executor, self._channel
        self._executor = self._channel = None
        if channel is not None:
            try:
                channel.call({"op": "unload"}, timeout=FINALIZE_TIMEOUT_S)
            except WorkerDied:
                pass
            channel.close()
        self._inputs.close()
        self._fallback.close()
        if self._slabs is not None:
            self._slabs.close()
            self._slabs = None
        if executor is not None:
            self._detach(executor)

    def _detach(self, executor: Executor) -> None:
        """Leave the executor; the last instance to leave ends its process."""
        with _lock:
            if self in executor.instances:
                executor.instances.remove(self)
            last = not executor.instances and _executors.get(executor.key) is executor
            if last:
                del _executors[executor.key]
        if last:
            executor.stop()

    def healthy(self) -> bool:
        """False once the device failed the instance, or its executor gave up restarting;
        while the executor restarts it stays True (the batch that saw the crash failed
        alone, and the next ones wait for the restart)."""
        executor = self._executor
        return self._healthy and executor is not None and not executor.failed()

    # end_child_processes: the base's 0. Executors are Python-backend workers, which
    # PythonBackend.end_child_processes ends (this module imports it, so the registry calls
    # it); ending them here too counted every worker twice.
