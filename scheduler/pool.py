"""The instances of one model version, each with its own Backend object and its own thread.

Every call into a backend (construction, load, each execute, unload) runs on its instance's
single thread: pyACL contexts belong to a thread, and a backend then needs no locking. A whole
batch is one hop to that thread: gather, execute, split and response building all happen there,
and the loop only receives the finished `BatchRun`.

The hop is deliberately plain: the loop puts a job on the instance's `queue.SimpleQueue`, and the
thread hands the result back with one `loop.call_soon_threadsafe` per job. `run_in_executor`
costs a concurrent.futures Future, a work item, an asyncio Future chained to it and an extra loop
callback on the way back; on a small model that was most of the time a request spent in the core.
A thread whose batches cost it little CPU moves onto the event loop's CPU (scheduler/affinity.py),
where each hop is a context switch instead of a wake-up of another CPU.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from backends.base import Backend, BackendError, InstanceSpec, RequestsOutcome
from protocol.datatypes import BY_CONFIG_NAME, numpy_to_wire
from protocol.errors import InternalError, ServerError
from protocol.types import InferRequest, InferResponse, Tensor
from scheduler.affinity import ThreadPlacement
from scheduler.batch import concat_inputs, split_outputs
from scheduler.clock import Clock
from scheduler.interface import LoadError
from scheduler.ragged import RaggedBatching
from scheduler.rate_limiter import GRANTED, IDLE, WAITING, Claimant, RateLimiter, RateLimitError
from scheduler.stats import FailureReason

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig
    from scheduler.interface import VersionSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Failed:
    """One request's failure inside a batch, with the metric reason it counts under."""

    error: ServerError
    reason: str


Outcome = InferResponse | Failed
Tag = TypeVar("Tag")


@dataclass(slots=True)
class BatchRun:
    """What one execution produced, handed from the instance thread back to the loop."""

    outcomes: list[Outcome]
    executed: bool = False  # the model ran (so it counts as an execution)
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    fatal: bool = False  # the instance must get no more work

    @classmethod
    def all_failed(
        cls, count: int, error: ServerError, reason: str, fatal: bool = False
    ) -> BatchRun:
        failure = Failed(error, reason)
        return cls([failure] * count, fatal=fatal)


@dataclass(frozen=True, slots=True)
class _OutputSpec:
    name: str
    wire: str | None  # KServe datatype; None when the config leaves it unset
    dtype: np.dtype | None  # numpy dtype to enforce; None for BYTES or unknown


def _enum_name(message, field_name: str) -> str:
    """The enum value's name without importing the generated config module."""
    enum = message.DESCRIPTOR.fields_by_name[field_name].enum_type
    return enum.values_by_number[getattr(message, field_name)].name


def _output_specs(config: ModelConfig) -> list[_OutputSpec]:
    named = [(output.name, _enum_name(output, "data_type")) for output in config.output]
    # A sequence model's implicit state outputs are kept too: the sequence batcher takes them
    # out of the response and feeds them back as the next request's state inputs.
    if config.HasField("sequence_batching"):
        named += [
            (state.output_name, _enum_name(state, "data_type"))
            for state in config.sequence_batching.state
        ]
    specs: list[_OutputSpec] = []
    for name, type_name in named:
        datatype = BY_CONFIG_NAME.get(type_name)
        if datatype is None:
            specs.append(_OutputSpec(name, None, None))
        else:
            # BYTES arrays vary in dtype, and BF16 travels as uint16 bit patterns: no casting.
            dtype = datatype.numpy if datatype.name not in ("BYTES", "BF16") else None
            specs.append(_OutputSpec(name, datatype.name, dtype))
    return specs


def _backend_error(exc: Exception) -> ServerError:
    """A backend failure as the client sees it: INTERNAL with the backend's own message."""
    if isinstance(exc, BackendError):
        return InternalError(exc.message)
    if isinstance(exc, ServerError):
        return exc
    return InternalError(str(exc) or type(exc).__name__)


def _input_map(request: InferRequest) -> dict[str, np.ndarray]:
    return {tensor.name: tensor.data for tensor in request.inputs}


def instance_specs(config: ModelConfig, model_name: str) -> list[tuple[InstanceSpec, bool]]:
    """(spec, passive) for every instance the config's instance_group asks for.

    Names are `<group name>_<i>`, counting within the group; a group with a `gpus` list gets
    `count` instances on each listed device, as Triton does. Kinds pass through unchanged: the
    backend decides what KIND_GPU means on this machine.
    """
    groups = list(config.instance_group)
    specs: list[tuple[InstanceSpec, bool]] = []
    if not groups:
        specs.append((InstanceSpec(f"{model_name}_0", "KIND_CPU", 0, 0), False))
        return specs
    for group_index, group in enumerate(groups):
        group_name = group.name or (
            model_name if len(groups) == 1 else f"{model_name}_{group_index}"
        )
        kind = _enum_name(group, "kind")
        devices = list(group.gpus) if kind == "KIND_GPU" and len(group.gpus) else [0]
        local = 0
        for _ in range(max(1, group.count)):
            for device in devices:
                spec = InstanceSpec(f"{group_name}_{local}", kind, device, len(specs))
                specs.append((spec, group.passive))
                local += 1
    return specs


def instance_groups(config: ModelConfig) -> list[Any]:
    """The instance_group each of `instance_specs`' instances comes from, in the same order
    (None for the one default instance of a config without groups)."""
    groups = list(config.instance_group)
    if not groups:
        return [None]
    made: list[Any] = []
    for group in groups:
        kind = _enum_name(group, "kind")
        devices = len(group.gpus) if kind == "KIND_GPU" and len(group.gpus) else 1
        made.extend([group] * (max(1, group.count) * devices))
    return made


# A job for an instance thread: (work, args, loop, on_done, tag). The thread runs work(*args),
# which never raises, then on_done(tag, result) on `loop`; on_done None means nobody waits.
_Job = tuple


def _run_safely(job: Callable[[], BatchRun], count: int) -> BatchRun:
    """`job`, with a bug in it failing the batch rather than its caller."""
    try:
        return job()
    except BaseException as exc:
        return BatchRun.all_failed(
            count, InternalError(str(exc) or type(exc).__name__), FailureReason.OTHER
        )


def _capture(function: Callable[[], Any]) -> tuple[BaseException | None, Any]:
    """Run a call (load, unload) on the instance thread, keeping its exception as a value."""
    try:
        return None, function()
    except BaseException as exc:
        return exc, None


def _settle(future: asyncio.Future[Any], outcome: tuple[BaseException | None, Any]) -> None:
    """On the loop: pass a captured call's outcome to the future awaiting it."""
    if future.done():  # the caller was cancelled
        return
    error, value = outcome
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class Instance:
    """One backend copy and the single thread that every call into it runs on.

    The thread starts with the first job (the load) and ends after `unload()`. It runs jobs in
    the order they were queued, so an unload queued behind a running batch waits for it.
    """

    def __init__(
        self,
        spec: InstanceSpec,
        version: VersionSpec,
        clock: Clock,
        outputs: list[_OutputSpec],
        passive: bool = False,
    ) -> None:
        self.spec = spec
        self.passive = passive
        self.healthy = True
        self.backend: Backend | None = None
        self.claimant: Claimant | None = None  # its share of the rate limiter, if it needs one
        self._version = version
        self._version_label = str(version.version)
        self._clock = clock
        self._outputs = outputs
        self._ragged = RaggedBatching.of(version.config)  # None for the usual model
        self._loaded = False
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False  # no more jobs are taken; the thread ends after those queued
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first call
        self._begins = False  # the backend offers begin_requests (set once loaded)

    @property
    def name(self) -> str:
        return self.spec.name

    async def load(self) -> None:
        await self._call(self._load)

    def _load(self) -> None:
        version = self._version
        extra = {"host": version.host} if version.backend_cls.uses_host else {}
        self.backend = version.backend_cls(
            version.config, version.model_dir, version.version_dir, self.spec, **extra
        )
        self.backend.load()
        # A backend that can start a batch from the loop (a Python model) skips the hop.
        self._begins = type(self.backend).begin_requests is not Backend.begin_requests
        self._loaded = True

    async def unload(self) -> None:
        """Unload on the instance thread (after whatever it is running), then end the thread."""
        if self._closed:
            return
        try:
            await self._call(self._unload)
        finally:
            self._close()

    def queue_unload(self) -> None:
        """Unload without waiting: for a load that is being cancelled (runs after it)."""
        if not self._closed:
            self._put((_capture, (self._unload,), None, None, None))
            self._close()

    def _unload(self) -> None:
        if not self._loaded or self.backend is None:
            return
        self._loaded = False
        try:
            self.backend.unload()
        except Exception:  # an unload failure must not stop the other instances unloading
            logger.exception("instance '%s' failed to unload", self.name)

    def execute(
        self,
        requests: Sequence[InferRequest],
        rows: Sequence[int],
        on_done: Callable[[Tag, BatchRun], None],
        tag: Tag,
    ) -> None:
        """Run one batch on the instance thread; `on_done(tag, result)` then runs on the loop.

        No future is made: the thread calls back through `loop.call_soon_threadsafe` once, and
        `tag` (the caller's own record of the batch) saves a closure per batch.
        """
        loop = self._loop or asyncio.get_running_loop()
        if self._closed:  # unloaded under the caller: answer on the loop, as a result would be
            loop.call_soon(
                on_done,
                tag,
                BatchRun.all_failed(
                    len(requests),
                    InternalError(f"instance '{self.name}' is unloaded"),
                    FailureReason.OTHER,
                ),
            )
            return
        if self._begins and self._begin_on_loop(requests, loop, on_done, tag):
            return
        self._put((self._run_batch_safely, (requests, rows), loop, on_done, tag))

    def _begin_on_loop(
        self,
        requests: Sequence[InferRequest],
        loop: asyncio.AbstractEventLoop,
        on_done: Callable[[Tag, BatchRun], None],
        tag: Tag,
    ) -> bool:
        """Start the batch from the loop (Backend.begin_requests): its answer arrives on the
        loop, with no hop to the instance thread and back. False: the backend cannot now."""
        backend = self.backend
        assert backend is not None
        now = self._clock.now_ns
        start = now()
        inputs = [_input_map(request) for request in requests]
        gathered = now()

        def done(outcome: RequestsOutcome) -> None:
            if callable(outcome):  # the rest may wait: it runs on the instance thread
                job = partial(self._list_run, backend, requests, outcome, start, gathered)
                self._put((_run_safely, (job, len(requests)), loop, on_done, tag))
                return
            on_done(
                tag,
                _run_safely(
                    lambda: self._list_run(backend, requests, lambda: outcome, start, gathered),
                    len(requests),
                ),
            )

        try:
            return backend.begin_requests(inputs, requests, done)
        except Exception:  # a bug in the backend's fast path: the instance thread's way
            logger.exception("instance '%s': cannot start a batch from the loop", self.name)
            self._begins = False
            return False

    # -- the hand-off ------------------------------------------------------------------------

    def _call(self, function: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run `function` on the instance thread; the future takes its result or exception."""
        if self._closed:
            raise RuntimeError(f"instance '{self.name}' is unloaded")
        loop = self._loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._put((_capture, (function,), loop, _settle, future))
        return future

    def _put(self, job: _Job) -> None:
        if self._thread is None:
            # A daemon thread: a process that exits without unloading must not hang on it.
            thread = threading.Thread(target=self._serve, name=f"instance-{self.name}", daemon=True)
            try:
                thread.start()
            except RuntimeError as exc:  # a thread or process limit: no thread will serve
                # Recorded only once started, or an unload would queue a job nobody runs.
                self._closed = True
                logger.error("instance '%s': cannot start its thread: %s", self.name, exc)
                raise LoadError(str(exc) or "cannot start a thread") from exc
            self._thread = thread
        self._jobs.put(job)

    def _close(self) -> None:
        """Take no more jobs; the thread ends once those already queued have run."""
        if not self._closed:
            self._closed = True
            if self._thread is not None:
                self._jobs.put(None)

    def _serve(self) -> None:
        """The instance thread: run jobs in order, handing each result back to its loop."""
        placement = ThreadPlacement()
        placement.started()
        get = self._jobs.get
        run_batch = self._run_batch_safely
        thread_time = time.thread_time_ns
        while True:
            job = get()
            if job is None:
                return
            work, args, loop, on_done, tag = job
            begun = thread_time()
            result = work(*args)  # never raises: see _capture and _run_batch_safely
            if on_done is not None:
                try:
                    loop.call_soon_threadsafe(on_done, tag, result)
                except RuntimeError:  # the loop closed meanwhile: nobody waits for this
                    pass
            # Read after the hand-back: the clock is a syscall, and the caller is waiting.
            if work == run_batch:  # loads and unloads say nothing about a batch's cost
                placement.job_done(thread_time() - begun)
            del job, work, args, loop, on_done, tag, result  # drop the batch while idle

    # -- on the instance thread ---------------------------------------------------------

    def _run_batch_safely(self, requests: Sequence[InferRequest], rows: Sequence[int]) -> BatchRun:
        """`_run_batch`, with a bug in it failing the batch rather than the thread."""
        try:
            return self._run_batch(requests, rows)
        except BaseException as exc:
            return BatchRun.all_failed(
                len(requests), InternalError(str(exc) or type(exc).__name__), FailureReason.OTHER
            )

    def _run_batch(self, requests: Sequence[InferRequest], rows: Sequence[int]) -> BatchRun:
        backend = self.backend
        assert backend is not None
        if backend.takes_request_lists:
            return self._run_request_list(backend, requests)
        now = self._clock.now_ns
        start = now()
        ragged = self._ragged
        try:
            if ragged is not None:
                maps = [_input_map(request) for request in requests]
                inputs = ragged.gather(maps)
            elif backend.gathers_batches:  # joined once, where the backend reads them
                inputs = backend.gather([_input_map(request) for request in requests])
            elif len(requests) == 1:  # nothing to join: the request's own arrays, no copy
                inputs = _input_map(requests[0])
            else:
                inputs = concat_inputs([_input_map(request) for request in requests])
        except Exception as exc:
            return BatchRun.all_failed(
                len(requests), InternalError(f"cannot batch inputs: {exc}"), FailureReason.OTHER
            )
        gathered = now()
        try:
            outputs = backend.execute(inputs)
        except Exception as exc:
            return self._execute_failed(backend, exc, len(requests))
        executed = now()
        try:
            if ragged is not None:
                pieces: Sequence[Mapping[str, np.ndarray]] = ragged.split(outputs, rows, maps)
            elif len(requests) == 1:
                pieces = [outputs]
            else:
                pieces = split_outputs(outputs, rows)
            outcomes: list[Outcome] = [
                self._response(request, piece)
                for request, piece in zip(requests, pieces, strict=False)
            ]
        except Exception as exc:
            return BatchRun.all_failed(
                len(requests), InternalError(str(exc)), FailureReason.BACKEND
            )
        done = now()
        return BatchRun(outcomes, True, gathered - start, executed - gathered, done - executed)

    def _run_request_list(self, backend: Backend, requests: Sequence[InferRequest]) -> BatchRun:
        now = self._clock.now_ns
        start = now()
        inputs = [_input_map(request) for request in requests]
        gathered = now()

        def execute() -> Sequence[dict[str, np.ndarray] | BaseException | None]:
            if backend.decoupled:
                # The answers travel through each request's stream; its future only says
                # whether execute took the request.
                for request in requests:
                    request.stream.set_converter(partial(self._response, request))
                return backend.execute_decoupled(requests)
            if backend.wants_request_details:  # ids, parameters, requested outputs
                return backend.execute_requests(inputs, requests)
            return backend.execute_requests(inputs)

        return self._list_run(backend, requests, execute, start, gathered)

    def _list_run(
        self,
        backend: Backend,
        requests: Sequence[InferRequest],
        execute: Callable[[], Sequence[dict[str, np.ndarray] | BaseException | None]],
        start: int,
        gathered: int,
    ) -> BatchRun:
        """The BatchRun of a request list: `execute` gives one result per request."""
        now = self._clock.now_ns
        results: Sequence[dict[str, np.ndarray] | BaseException | None]
        try:
            results = execute()
            if len(results) != len(requests):
                raise BackendError(
                    f"model returned {len(results)} responses for {len(requests)} requests"
                )
        except Exception as exc:
            return self._execute_failed(backend, exc, len(requests))
        executed = now()
        outcomes: list[Outcome] = []
        for request, result in zip(requests, results, strict=False):
            if isinstance(result, BaseException):
                error = (
                    _backend_error(result)
                    if isinstance(result, Exception)
                    else InternalError(repr(result))
                )
                outcomes.append(Failed(error, FailureReason.BACKEND))
            elif result is None:  # decoupled: accepted
                outcomes.append(
                    InferResponse(request.model_name, self._version_label, id=request.id)
                )
            else:
                try:
                    outcomes.append(self._response(request, result))
                except Exception as exc:
                    outcomes.append(Failed(InternalError(str(exc)), FailureReason.BACKEND))
        done = now()
        return BatchRun(outcomes, True, gathered - start, executed - gathered, done - executed)

    def _execute_failed(self, backend: Backend, exc: Exception, count: int) -> BatchRun:
        fatal = isinstance(exc, BackendError) and exc.fatal
        if not fatal:
            try:
                fatal = not backend.healthy()
            except Exception:
                fatal = True
        if fatal:
            logger.error("instance '%s' is unhealthy after: %s", self.name, exc)
        return BatchRun.all_failed(count, _backend_error(exc), FailureReason.BACKEND, fatal)

    def _response(self, request: InferRequest, outputs: Mapping[str, np.ndarray]) -> InferResponse:
        tensors: list[Tensor] = []
        if self._outputs:
            for spec in self._outputs:
                array = outputs.get(spec.name)
                if array is None:
                    continue  # a Python model may return only what was asked for
                array = np.asarray(array)
                if spec.dtype is not None and array.dtype != spec.dtype:
                    array = array.astype(spec.dtype)
                wire = spec.wire or numpy_to_wire(array.dtype)
                tensors.append(Tensor(spec.name, wire, tuple(array.shape), array))
        else:
            for name, array in outputs.items():
                array = np.asarray(array)
                tensors.append(Tensor(name, numpy_to_wire(array.dtype), tuple(array.shape), array))
        return InferResponse(
            request.model_name,
            self._version_label,
            id=request.id,
            outputs=tensors,
            parameters=getattr(outputs, "parameters", None) or {},
        )


class InstancePool:
    """All instances of a version, and which of them are free for the next batch.

    With a rate limiter (scheduler/rate_limiter.py), an instance whose group names resources is
    free for a batch only once the limiter has given it a turn: `request_turn` asks for one,
    `on_grant` is called when it comes later, and a turn not used is given back.
    """

    def __init__(
        self,
        version: VersionSpec,
        clock: Clock,
        limiter: RateLimiter | None = None,
        on_grant: Callable[[], Any] | None = None,
    ) -> None:
        self.version = version
        outputs = _output_specs(version.config)
        self.instances = [
            Instance(spec, version, clock, outputs, passive)
            for spec, passive in instance_specs(version.config, version.name)
        ]
        self._idle: deque[Instance] = deque()
        self._limiter = limiter
        self._claimants: list[Claimant] = []
        if limiter is not None:
            groups = instance_groups(version.config)
            for instance, group in zip(self.instances, groups, strict=True):
                if group is None or instance.passive or not group.HasField("rate_limiter"):
                    continue
                instance.claimant = limiter.claimant(
                    f"{version.name}/{instance.name}",
                    group.rate_limiter,
                    instance.spec.device_id,
                    on_grant or (lambda: None),
                )
                if instance.claimant is not None:
                    self._claimants.append(instance.claimant)
        self.limited = bool(self._claimants)

    async def load(self) -> None:
        """Load every instance at once; if any fails, unload the rest and raise LoadError.
        Resources the server can never provide refuse the load before any instance loads."""
        if self._limiter is not None and self._claimants:
            try:
                self._limiter.admit(self._claimants)
            except RateLimitError as refused:
                raise LoadError(refused.message) from refused
        try:
            results = await asyncio.gather(
                *(instance.load() for instance in self.instances), return_exceptions=True
            )
        except asyncio.CancelledError:
            self._leave_limiter()
            for instance in self.instances:
                instance.queue_unload()
            raise
        failures = [
            (instance, result)
            for instance, result in zip(self.instances, results, strict=False)
            if isinstance(result, BaseException)
        ]
        if failures:
            await self.unload()
            instance, exc = failures[0]
            reason = (
                exc.message
                if isinstance(exc, (BackendError, ServerError))
                else (str(exc) or type(exc).__name__)
            )
            raise LoadError(f"instance '{instance.name}' failed to load: {reason}") from exc
        self._idle.extend(instance for instance in self.instances if not instance.passive)

    def _leave_limiter(self) -> None:
        """Give back the turns of free instances, then leave the limiter (a running batch
        keeps its resources until it ends)."""
        if self._limiter is not None and self._claimants:
            self.return_unused()
            self._limiter.remove(self._claimants)

    async def unload(self) -> None:
        """Unload each instance on its own thread, all in parallel."""
        self._leave_limiter()
        self._idle.clear()
        await asyncio.gather(
            *(instance.unload() for instance in self.instances), return_exceptions=True
        )

    def acquire(self) -> Instance | None:
        """A free healthy instance that may run now, or None while all are busy."""
        idle = self._idle
        if not self.limited:
            while idle:
                instance = idle.popleft()
                if instance.healthy:
                    return instance
            return None
        for instance in list(idle):
            if not instance.healthy:
                idle.remove(instance)
            elif instance.claimant is None or instance.claimant.state == GRANTED:
                idle.remove(instance)
                return instance
        return None

    def has_idle(self) -> bool:
        """Whether `acquire()` would find an instance (asked once per dispatch pass)."""
        for instance in self._idle:
            if instance.healthy and (
                instance.claimant is None or instance.claimant.state == GRANTED
            ):
                return True
        return False

    def request_turn(self, wanted: int = 1) -> bool:
        """Ask the rate limiter turns for free instances, fewest executions first, until
        `wanted` (the requests queued) are waiting; True when one was given at once (`acquire`
        then finds it). Several wait at once so that a blocked device does not hold back a
        free one."""
        limiter = self._limiter
        if not self.limited or limiter is None:
            return False
        waiting = 0
        candidates: list[Claimant] = []
        for instance in self._idle:
            claimant = instance.claimant
            if claimant is None or not instance.healthy:
                continue
            if claimant.state == WAITING:
                waiting += 1
            elif claimant.state == IDLE:
                candidates.append(claimant)
        candidates.sort(key=lambda c: c.pass_)
        for claimant in candidates[: max(0, wanted - waiting)]:
            if limiter.request(claimant):
                return True
        return False

    def may_run(self, instance: Instance) -> bool:
        """Whether a free instance may run now: not limited, or given its turn."""
        claimant = instance.claimant
        return claimant is None or claimant.state == GRANTED

    def request_turn_for(self, instance: Instance) -> bool:
        """Ask a turn for this free instance (a sequence's); True when it may run now."""
        claimant = instance.claimant
        if claimant is None or claimant.state == GRANTED:
            return True
        if claimant.state == WAITING or self._limiter is None:
            return False
        return self._limiter.request(claimant)

    def return_unused(self) -> None:
        """Give back the turns of free instances that got no batch (and stop their waiting,
        when nothing is left to run)."""
        limiter = self._limiter
        if limiter is None:
            return
        for instance in self._idle:
            claimant = instance.claimant
            if claimant is not None and claimant.state == GRANTED:
                limiter.release(claimant, executed=False)

    def idle_instances(self) -> list[Instance]:
        """The free healthy instances, for a scheduler that picks the instance itself (a
        sequence's slot lives on one instance); claim the one it uses with `claim`."""
        return [instance for instance in self._idle if instance.healthy]

    def claim(self, instance: Instance) -> None:
        """Take a free instance that `idle_instances` listed."""
        self._idle.remove(instance)

    def release(self, instance: Instance, more: bool = False) -> None:
        """An instance finished its batch; `more`: its scheduler has work waiting (then it
        waits for its next turn before anyone else is let in, as in Triton)."""
        keep = instance.healthy and not instance.passive
        if keep:
            self._idle.append(instance)
        claimant = instance.claimant
        if claimant is not None and self._limiter is not None:
            self._limiter.release(claimant, executed=True, again=more and keep)

    def healthy(self) -> bool:
        return any(instance.healthy and not instance.passive for instance in self.instances)

    def ready(self) -> bool:
        """Some instance can run work now (a backend restarting its worker cannot)."""
        return any(
            i.healthy and not i.passive and (i.backend is None or i.backend.healthy())
            for i in self.instances
        )
