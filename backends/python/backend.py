"""Triton-style Python models: `<version>/model.py` defining `TritonPythonModel`.

Each instance runs its model in its own worker process (backends/python/worker/main.py), so Python
models escape the server's GIL and a crashing model cannot take the server down. Tensors cross
through shared memory (backends/python/wire/framing.py); BYTES tensors are pickled into it.

The backend supervises its worker: when the process dies, the requests it was running fail at
once with UNAVAILABLE, `healthy()` turns False, and a supervisor thread starts a new worker;
requests that arrive meanwhile wait for it. After `max_worker_crashes` crashes (default 3)
within `worker_crash_window_s` seconds (default 60) it gives up: `healthy()` stays False and
every later call raises a fatal BackendError naming the reason. Both numbers can be set as
config `parameters`.

A model's `request.requested_output_names()` lists the outputs the client asked for (every
output in the config when it asked for none), `request_id()` and `parameters()` are the
client's. Decoupled models (`execute_decoupled`) answer through each request's stream
(backends/python/streams.py); BLS calls reach the server's infer path through the BackendHost
handed to the constructor.

Streaming limits, as config `parameters`: `response_buffer_size` (default 64): how many answers
of one decoupled request may wait for a slow client before the model's `send` blocks;
`response_send_timeout_s` (default 60): how long `send` blocks before it raises;
`response_ring_bytes` (default 8 MiB): the worker's shared-memory ring for those answers and
BLS inputs (a bigger message gets a bigger ring). Their ranges are `parameter_bounds`, checked
when the config loads (repository/bounds.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.base import Backend, BackendError, BackendHost, ParameterBound, RequestsOutcome
from backends.python.process import (
    Result,
    WorkerDied,
    WorkerProcess,
    WorkerReplyError,
    describe_exit,
    end_workers,
    workers_ended,
)
from backends.python.streams import StreamRouter, error_from_code
from protocol import errors
from protocol.config_json import config_to_json
from protocol.types import InferRequest

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

INIT_TIMEOUT_S = 600.0  # initialize may load large weights
FINALIZE_TIMEOUT_S = 10.0
AUTO_COMPLETE_TIMEOUT_S = 120.0
RESTART_WAIT_S = 30.0  # how long a request waits for a restarting worker
RESTART_BACKOFF_S = 0.5


class CrashWindow:
    """Counts crashes in a sliding window; says when restarting should stop."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self._times: deque[float] = deque()

    def record(self, now: float) -> bool:
        """Record one crash; True while another restart is still allowed."""
        self._times.append(now)
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()
        return len(self._times) < self.limit

    @property
    def count(self) -> int:
        return len(self._times)


# The config parameters that bound restarts, for every backend whose instances run in a
# supervised worker process (Python models, NPU executors).
CRASH_PARAMETER_BOUNDS: dict[str, ParameterBound] = {
    "max_worker_crashes": ParameterBound(0, 1_000_000, integer=True),
    "worker_crash_window_s": ParameterBound(0.0, 86400.0 * 365),
}


def crash_window(config: ModelConfig) -> CrashWindow:
    """The restart budget a config asks for (defaults: 3 crashes within 60 s)."""
    return CrashWindow(
        int(number_parameter(config, "max_worker_crashes", 3)),
        number_parameter(config, "worker_crash_window_s", 60.0),
    )


def number_parameter(config: ModelConfig, key: str, default: float) -> float:
    """A numeric config `parameters` entry, or `default`; BackendError naming it otherwise."""
    if key in config.parameters:
        try:
            return float(config.parameters[key].string_value)
        except ValueError:
            raise BackendError(
                f"model '{config.name}': parameter '{key}' must be a number, got "
                f"'{config.parameters[key].string_value}'"
            ) from None
    return default


class PythonBackend(Backend):
    backend_name = "python"
    default_model_filename = "model.py"
    takes_request_lists = True
    wants_request_details = True
    uses_host = True
    # Checked when the config loads (repository/bounds.py): the ring is shared memory mapped
    # in the worker, the window is answers held per request, the timeouts are waits.
    parameter_bounds = {
        "response_buffer_size": ParameterBound(1, 65536, integer=True),
        "response_send_timeout_s": ParameterBound(0.001, 86400.0),
        "response_ring_bytes": ParameterBound(
            4096,
            1 << 30,
            integer=True,
            setting="max_response_ring_bytes",
            flag="--python-max-response-ring-bytes",
        ),
        **CRASH_PARAMETER_BOUNDS,
    }

    _READY, _RESTARTING, _FAILED, _STOPPED = "ready", "restarting", "failed", "stopped"

    def __init__(self, *args: Any, host: BackendHost | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = self.config
        self.decoupled = bool(config.model_transaction_policy.decoupled)
        self._router = StreamRouter(config.name, host)
        self._stream_settings = {
            "window": int(number_parameter(config, "response_buffer_size", 64)),
            "send_timeout_s": number_parameter(config, "response_send_timeout_s", 60.0),
            "ring_bytes": int(number_parameter(config, "response_ring_bytes", 8 << 20)),
        }
        if self._stream_settings["window"] < 1:
            raise BackendError(
                f"model '{config.name}': parameter 'response_buffer_size' must be at least 1"
            )
        self._crashes = crash_window(config)
        self._output_names = [output.name for output in config.output]
        self._label = f"python model '{config.name}' instance '{self.instance.name}'"
        self._cond = threading.Condition()
        self._worker: WorkerProcess | None = None
        self._state = self._STOPPED
        self._failure = ""
        self._supervisor: threading.Thread | None = None
        self.restarts = 0  # worker restarts so far (for metrics and tests)

    # ----- auto-complete ---------------------------------------------------------------

    @classmethod
    def auto_complete(cls, config: ModelConfig, model_dir: Path, version_dir: Path) -> None:
        """Run the model's `auto_complete_config`, in a worker, when model.py defines one."""
        from google.protobuf import json_format

        from protocol.proto.model_config_pb2 import ModelConfig

        path = version_dir / (config.default_model_filename or cls.default_model_filename)
        try:
            source = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return  # load reports the missing file
        if "auto_complete_config" not in source:
            return  # skip a process start for the (common) model without one
        worker = WorkerProcess.spawn()
        try:
            completed = worker.auto_complete(
                path, version_dir, config_to_json(config), AUTO_COMPLETE_TIMEOUT_S
            )
        except (WorkerReplyError, WorkerDied) as exc:
            raise BackendError(f"auto_complete_config of '{path}': {exc}") from None
        finally:
            worker.close()
        merged = ModelConfig()
        try:
            json_format.ParseDict(completed, merged)
        except json_format.ParseError as exc:
            raise BackendError(
                f"auto_complete_config of '{path}' produced an invalid config: {exc}"
            ) from None
        config.CopyFrom(merged)

    # ----- lifecycle -------------------------------------------------------------------

    def load(self) -> None:
        if not self.model_path().is_file():
            raise BackendError(
                f"unable to find '{self.model_path()}' for model '{self.config.name}'"
            )
        worker = self._start_worker()
        with self._cond:
            self._worker = worker
            self._state = self._READY
        self._supervisor = threading.Thread(
            target=self._supervise,
            args=(worker,),
            name=f"supervisor-{self.instance.name}",
            daemon=True,
        )
        self._supervisor.start()

    def unload(self) -> None:
        with self._cond:
            worker = self._worker
            self._worker = None
            self._state = self._STOPPED
            self._cond.notify_all()
        if worker is not None:
            worker.finalize(FINALIZE_TIMEOUT_S)
        if self._supervisor is not None:
            self._supervisor.join(FINALIZE_TIMEOUT_S)

    def healthy(self) -> bool:
        with self._cond:
            return self._state == self._READY

    @classmethod
    def end_child_processes(cls) -> int:
        """Kill every worker still running (a model's execute past the server's exit
        deadline) and start no more."""
        return end_workers()

    def _args(self) -> dict[str, str]:
        """The `args` dict Triton's python backend passes to `initialize`."""
        return {
            "model_config": json.dumps(config_to_json(self.config)),
            "model_instance_kind": self.instance.kind.removeprefix("KIND_"),
            "model_instance_name": self.instance.name,
            "model_instance_device_id": str(self.instance.device_id),
            "model_repository": str(self.model_dir),
            "model_version": self.version_dir.name,
            "model_name": self.config.name,
        }

    def _start_worker(self) -> WorkerProcess:
        try:
            worker = WorkerProcess.spawn(self._router.handle, pumped=self.decoupled)
        except WorkerDied as exc:  # the server is past its exit deadline
            raise BackendError(f"the worker process {exc.detail}") from None
        try:
            worker.initialize(
                self.model_path(),
                self.version_dir,
                self._args(),
                INIT_TIMEOUT_S,
                self._stream_settings,
            )
        except (WorkerReplyError, WorkerDied) as exc:
            worker.close()
            detail = (
                str(exc)
                if isinstance(exc, WorkerReplyError)
                else f"the worker process {exc.detail} during initialize"
            )
            raise BackendError(detail) from None
        except BaseException:
            worker.close()
            raise
        if self.decoupled:  # its answers arrive while no call waits: read them as they come
            threading.Thread(
                target=worker.pump, name=f"responses-{self.instance.name}", daemon=True
            ).start()
        return worker

    # ----- supervision (on the supervisor thread) ----------------------------------------

    def _supervise(self, worker: WorkerProcess) -> None:
        """Wait for the worker to exit; unless the backend is stopping, restart it."""
        while True:
            code = worker.wait()
            worker.sever()
            detail = describe_exit(code)
            self._router.fail_all(
                worker,
                errors.Unavailable(
                    f"{self._label}: the worker process {detail} while this request was running"
                ),
            )
            with self._cond:
                if self._state == self._STOPPED or worker is not self._worker:
                    return
                # Decided at once, so a call that saw the death learns the verdict right away.
                if workers_ended():  # killed at the server's exit deadline: no restart
                    self._state = self._STOPPED
                    self._worker = None
                    self._cond.notify_all()
                elif self._crashes.record(time.monotonic()):
                    self._state = self._RESTARTING
                    self._cond.notify_all()
                else:
                    self._give_up(detail)
                verdict = self._state
            worker.close(0.1)
            if verdict != self._RESTARTING:
                return
            log.error(
                "%s: the worker process (pid %d) %s; restarting it", self._label, worker.pid, detail
            )
            replacement = self._restart()
            if replacement is None:
                return
            worker = replacement

    def _restart(self) -> WorkerProcess | None:
        """Start a new worker; None when stopping, or giving up after failed restarts."""
        while True:
            with self._cond:
                if self._state == self._STOPPED:
                    return None
            try:
                worker = self._start_worker()
            except BackendError as exc:
                log.error("%s: restart failed: %s", self._label, exc.message)
                with self._cond:
                    if self._state == self._STOPPED:
                        return None
                    if not self._crashes.record(time.monotonic()):
                        self._give_up(f"restart failed: {exc.message}")
                        return None
                time.sleep(RESTART_BACKOFF_S)
                continue
            with self._cond:
                if self._state == self._STOPPED:
                    worker.close()
                    return None
                self._worker = worker
                self._state = self._READY
                self.restarts += 1
                self._cond.notify_all()
            log.warning(
                "%s: worker restarted (pid %d), restart %d", self._label, worker.pid, self.restarts
            )
            return worker

    def _give_up(self, detail: str) -> None:
        """Called with the lock held: the instance stays down for good."""
        self._state = self._FAILED
        self._worker = None
        self._failure = (
            f"{self._label}: the worker process crashed {self._crashes.count} times "
            f"within {self._crashes.window_s:g} s (last: {detail}); not restarting "
            f"it"
        )
        self._cond.notify_all()
        log.error("%s", self._failure)

    # ----- execution (on the instance thread) ---------------------------------------------

    def execute(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self.execute_requests([inputs])[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def execute_requests(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        details: Sequence[InferRequest] | None = None,
    ) -> list[dict[str, np.ndarray] | BaseException]:
        """Run the list in the worker. While the worker restarts this waits for it; a worker
        that dies fails only these requests (UNAVAILABLE). Raises only when the instance is
        gone for good (fatal), so the pool stops sending it work."""
        for attempt in range(2):
            worker = self._ready_worker()
            if worker is None:
                return self._unavailable(len(requests), "the worker process is restarting")
            try:
                results = worker.execute(
                    requests,
                    self._output_names,
                    None,
                    _request_details(details, self._output_names),
                )
            except WorkerReplyError as exc:
                return [errors.InternalError(str(exc)) for _ in requests]
            except WorkerDied as exc:
                if self._wait_for_verdict(worker) == self._FAILED:
                    raise BackendError(self._failure, fatal=True) from None
                if exc.before_send and attempt == 0:
                    continue  # it died idle, before getting this work: run it on the next one
                return self._unavailable(
                    len(requests),
                    f"the worker process {exc.detail} "
                    f"while running this request; it is being restarted",
                )
            return [self._result(result) for result in results]
        return self._unavailable(len(requests), "the worker process is restarting")

    def begin_requests(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        details: Sequence[InferRequest],
        done: Callable[[RequestsOutcome], None],
    ) -> bool:
        """`execute_requests` without the instance thread (see Backend.begin_requests): the
        loop sends the list and reads the worker's reply itself. Only a model that is not
        decoupled, with its worker ready; anything else (a restart to wait for, a decoupled
        model's pump) takes the instance thread as before."""
        if self.decoupled:
            return False
        worker = self._worker  # read without the lock: a stale one fails the call, as below
        if worker is None or self._state != self._READY:
            return False
        count = len(requests)

        def replied(outcome: list[Result] | Exception) -> None:
            if isinstance(outcome, WorkerReplyError):
                done([errors.InternalError(str(outcome)) for _ in range(count)])
            elif isinstance(outcome, Exception):  # the channel closed: the worker went
                done(lambda: self._after_death(worker, count))
            else:
                done([self._result(result) for result in outcome])

        return worker.begin_execute(
            requests, self._output_names, _request_details(details, self._output_names), replied
        )

    def _after_death(self, worker: WorkerProcess, count: int) -> list[Any]:
        """On the instance thread, after a call begun on the loop saw the worker go: what
        execute_requests answers then (a restart that is under way, or the end)."""
        detail = worker.exit_detail()
        if self._wait_for_verdict(worker) == self._FAILED:
            raise BackendError(self._failure, fatal=True)
        return self._unavailable(
            count,
            f"the worker process {detail} while running this request; it is being restarted",
        )

    def execute_decoupled(self, requests: Sequence[InferRequest]) -> list[None | BaseException]:
        """Hand the requests to the worker; their answers come through their streams. Like
        execute_requests, a worker that dies fails only these requests."""
        worker = self._ready_worker()
        if worker is None:
            return self._unavailable(len(requests), "the worker process is restarting")
        rids = self._router.open(worker, requests)
        inputs = [{t.name: t.data for t in request.inputs} for request in requests]
        try:
            worker.execute(
                inputs, self._output_names, rids, _request_details(requests, self._output_names)
            )
        except WorkerReplyError as exc:
            self._router.close(rids)
            return [errors.InternalError(str(exc)) for _ in requests]
        except WorkerDied as exc:
            self._router.close(rids)
            if self._wait_for_verdict(worker) == self._FAILED:
                raise BackendError(self._failure, fatal=True) from None
            return self._unavailable(
                len(requests),
                f"the worker process {exc.detail} while "
                f"running this request; it is being restarted",
            )
        return [None] * len(requests)

    def _ready_worker(self) -> WorkerProcess | None:
        """The live worker, waiting for a restart to finish; None if it takes too long."""
        deadline = time.monotonic() + RESTART_WAIT_S
        with self._cond:
            while self._state == self._RESTARTING:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if self._state == self._FAILED:
                raise BackendError(self._failure, fatal=True)
            if self._state == self._STOPPED or self._worker is None:
                raise BackendError(f"{self._label} is not loaded", fatal=True)
            return self._worker

    def _wait_for_verdict(self, worker: WorkerProcess) -> str:
        """After a call saw the worker die: wait (briefly) until the supervisor has decided
        between restarting and giving up."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._worker is not worker or self._state != self._READY, timeout=2.0
            )
            return self._state

    def _unavailable(self, count: int, detail: str) -> list[Any]:
        return [errors.Unavailable(f"{self._label}: {detail}") for _ in range(count)]

    @staticmethod
    def _result(result: Result) -> dict[str, np.ndarray] | BaseException:
        if isinstance(result, tuple):
            code, message = result
            return error_from_code(code, message)
        return result


def _request_details(
    requests: Sequence[InferRequest] | None, output_names: Sequence[str]
) -> dict[str, Any]:
    """What a model's `request_id()`, `parameters()`, `requested_output_names()`,
    `correlation_id()` and `flags()` return, sent only when some request has any (most send
    none: nothing extra to pickle). A request that asks for every output in the config's
    order (tritonclient and perf_analyzer name them all) reads as one that named none: the
    worker answers `requested_output_names()` with the config's list, the same list."""
    if not requests:
        return {}
    requested = meta = sequence = False
    for request in requests:  # one pass over what every request carries
        if request.outputs is not None and not requested:
            requested = [output.name for output in request.outputs] != output_names
        if request.id or request.parameters:
            meta = True
        if request.correlation_id or request.sequence_flags:
            sequence = True
    details: dict[str, Any] = {}
    if requested:
        details["requested"] = [
            None if request.outputs is None else [output.name for output in request.outputs]
            for request in requests
        ]
    if meta:
        details["meta"] = [
            (request.id, _plain(request.parameters) if request.parameters else {})
            for request in requests
        ]
    if sequence:
        # A sequence model's `correlation_id()` and `flags()` (padding requests: 0, 0).
        details["sequence"] = [
            (request.correlation_id, request.sequence_flags) for request in requests
        ]
    return details


def _plain(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Request parameters a model may see (the JSON kinds; the server's own are left in)."""
    return {
        key: value
        for key, value in parameters.items()
        if isinstance(value, (bool, int, float, str))
    }
