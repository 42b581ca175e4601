"""Ensembles (`platform: "ensemble"`): a request flows through a DAG of other models.

Each step is sent through `infer`, the server core's own entry point, so it is validated,
queued and batched by its model's own scheduler and counted in that model's statistics and
metrics, exactly like a request from a client. A step starts as soon as every tensor it reads
exists, so independent steps run concurrently. The first step to fail fails the request with
an error that names the step (keeping the step's status code), and the steps still running are
cancelled.

The graph is checked once, at load: every step input is an ensemble input or some step's
output, each ensemble tensor is produced once, every ensemble output is produced, no cycles.
Whether the member models exist is checked per request (they load and reload independently).

Back-pressure (`ensemble_scheduling.max_inflight_requests`, 0 = no limit): at most that many
requests are inside the ensemble, from the start of their first step to their answer; the
others wait, first come first served, before their first step (scheduler/inflight_limit.py),
while the requests inside go on. So a slow later step cannot make a fast first one pile up
its outputs without bound: what the ensemble holds between steps is at most N requests'
tensors. Triton counts N at each step; we count N over the whole ensemble (README).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.errors import InternalError, InvalidArgument, ServerError, Unavailable
from protocol.types import InferRequest, InferResponse, Tensor
from scheduler.inflight_limit import InflightLimit
from scheduler.interface import Scheduler, VersionSpec
from scheduler.stats import FailureReason, VersionStatistics

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig


Infer = Callable[[InferRequest], Awaitable[InferResponse]]


class EnsembleConfigError(InvalidArgument):
    """The ensemble's steps do not form a usable graph; the version does not load."""


@dataclass(frozen=True)
class Step:
    """One `ensemble_scheduling.step`: which model, and how its tensors map to the ensemble's."""

    index: int
    model_name: str
    model_version: str  # "" for the latest ready version
    inputs: dict[str, str]  # the model's input name -> ensemble tensor it reads
    outputs: dict[str, str]  # the model's output name -> ensemble tensor it writes

    @property
    def label(self) -> str:
        return f"step {self.index} (model '{self.model_name}')"


def plan_steps(config: ModelConfig) -> list[Step]:
    """The ensemble's steps, after checking that they form a DAG over the declared tensors."""
    name = config.name

    def fail(message: str) -> EnsembleConfigError:
        return EnsembleConfigError(f"ensemble '{name}': {message}")

    if not config.HasField("ensemble_scheduling") or not len(config.ensemble_scheduling.step):
        raise fail("must specify at least one step in 'ensemble_scheduling'")
    if not len(config.input) or not len(config.output):
        raise fail("must specify at least one input and one output")
    steps: list[Step] = []
    produced_by: dict[str, Step] = {}
    ensemble_inputs = {tensor.name for tensor in config.input}
    for index, spec in enumerate(config.ensemble_scheduling.step):
        if not spec.model_name:
            raise fail(f"step {index} must specify 'model_name'")
        if spec.model_name == name:
            raise fail(f"step {index} cannot run the ensemble itself")
        version = str(spec.model_version) if spec.model_version > 0 else ""
        step = Step(index, spec.model_name, version, dict(spec.input_map), dict(spec.output_map))
        if not step.inputs:
            raise fail(f"{step.label} must specify 'input_map'")
        if not step.outputs:
            raise fail(f"{step.label} must specify 'output_map'")
        for tensor in step.outputs.values():
            if tensor in ensemble_inputs:
                raise fail(f"{step.label} writes '{tensor}', which is an ensemble input")
            if tensor in produced_by:
                raise fail(
                    f"tensor '{tensor}' is written by both {produced_by[tensor].label} "
                    f"and {step.label}"
                )
            produced_by[tensor] = step
        steps.append(step)
    for step in steps:
        for tensor in step.inputs.values():
            if tensor not in ensemble_inputs and tensor not in produced_by:
                raise fail(
                    f"{step.label} reads '{tensor}', which is neither an ensemble input "
                    f"nor written by any step"
                )
    for output in config.output:
        if output.name not in produced_by:
            raise fail(f"ensemble output '{output.name}' is not written by any step")
    _check_acyclic(steps, ensemble_inputs, fail)
    return steps


def _check_acyclic(
    steps: list[Step], inputs: set[str], fail: Callable[[str], EnsembleConfigError]
) -> None:
    available = set(inputs)
    left = list(steps)
    while left:
        runnable = [step for step in left if set(step.inputs.values()) <= available]
        if not runnable:
            labels = ", ".join(step.label for step in left)
            raise fail(f"the steps form a cycle: {labels} wait on each other")
        for step in runnable:
            available.update(step.outputs.values())
            left.remove(step)


def _renamed(exc: ServerError, message: str) -> ServerError:
    """The same kind of error (so the same status code) with the step named in its text, and
    what else it carries (a full queue's retry_after)."""
    try:
        renamed = type(exc)(message)
        vars(renamed).update({k: v for k, v in vars(exc).items() if k != "message"})
        return renamed
    except TypeError:
        error = ServerError(message)
        error.code = exc.code
        return error


class EnsembleScheduler(Scheduler):
    """Runs each admitted request's DAG as one asyncio task; the task is the request's future."""

    def __init__(self, spec: VersionSpec, stats: VersionStatistics, infer: Infer) -> None:
        super().__init__(spec, stats)
        self._infer = infer
        self._name = spec.name
        self._steps: list[Step] = []
        self._outputs = [output.name for output in spec.config.output]
        self._tasks: set[asyncio.Task] = set()
        self._accepting = False
        self._aborting = False
        limit = int(spec.config.ensemble_scheduling.max_inflight_requests)
        self._inside = InflightLimit(limit, self._inside_changed)
        self._waiting = 0

    @property
    def max_inflight_requests(self) -> int:
        """0: no limit."""
        return self._inside.limit

    @property
    def inflight(self) -> int:
        """Requests past the start of their first step and not yet answered."""
        return self._inside.holders

    @property
    def steps(self) -> list[Step]:
        return list(self._steps)

    async def start(self) -> None:
        self._steps = plan_steps(self._spec.config)
        self._stats.ensemble_inflight_changed(self._inside.holders)
        self._accepting = True

    def _inside_changed(self, holders: int, waiting: int) -> None:
        """Holders are ascend_ensemble_inflight; waiters count as pending requests."""
        if waiting != self._waiting:
            self._stats.pending_changed(waiting - self._waiting)
            self._waiting = waiting
        if holders != self._stats.ensemble_inflight:
            self._stats.ensemble_inflight_changed(holders)

    def healthy(self) -> bool:
        return self._accepting

    def _admit(self, request: InferRequest) -> asyncio.Future:
        if not self._accepting:
            raise Unavailable(f"'{self._name}' version {self._spec.version} is not at ready state")
        task = asyncio.get_running_loop().create_task(
            self._run(request), name=f"ensemble:{self._name}:{request.id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self, timeout: float) -> None:
        self._accepting = False
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=max(0.0, timeout))
        if self._tasks:
            self._aborting = True
            for task in list(self._tasks):
                task.cancel()
            await asyncio.wait(list(self._tasks))

    async def stop(self) -> None:
        if self._accepting or self._tasks:
            await self.drain(0)

    # ----- one request ----------------------------------------------------------------------

    async def _run(self, request: InferRequest) -> InferResponse:
        waited = 0
        try:
            waited = await self._enter()
            try:
                tensors = await self._run_steps(request)
            finally:
                self._inside.release()
        except asyncio.CancelledError:
            self._stats.record_failure(FailureReason.CANCELED, self._elapsed(request))
            if self._aborting:
                raise Unavailable(
                    f"'{self._name}' version {self._spec.version} was unloaded "
                    f"before the request finished"
                ) from None
            raise
        except ServerError:
            # A step's failure, counted as Triton counts it on an ensemble: reason OTHER, and
            # in the metrics once more for the composing model's failure it reflects.
            self._stats.record_failure(FailureReason.OTHER, self._elapsed(request))
            self._stats.record_member_failure()
            raise
        except Exception as exc:
            self._stats.record_failure(FailureReason.OTHER, self._elapsed(request))
            raise InternalError(f"in ensemble '{self._name}': {type(exc).__name__}: {exc}") from exc
        total = self._elapsed(request)
        # Waiting to enter (max_inflight_requests) is the ensemble's queue time.
        inside = max(0, total - waited)
        self._stats.record_execution(max(1, request.batch_size), 0, inside, 0)
        self._stats.record_success(total, waited, 0, inside, 0)
        self._stats.record_first_response(total)
        outputs = [tensors[name] for name in self._outputs if name in tensors]
        return InferResponse(self._name, str(self._spec.version), id=request.id, outputs=outputs)

    async def _enter(self) -> int:
        """Wait for a place inside the ensemble; the nanoseconds waited."""
        started = time.monotonic_ns()
        await self._inside.acquire()
        return time.monotonic_ns() - started

    async def _run_steps(self, request: InferRequest) -> dict[str, Tensor]:
        """Start each step once its inputs exist; collect what the steps produce."""
        tensors: dict[str, Tensor] = {tensor.name: tensor for tensor in request.inputs}
        pending = list(self._steps)
        running: dict[asyncio.Task, Step] = {}
        loop = asyncio.get_running_loop()
        try:
            while pending or running:
                for step in [s for s in pending if all(t in tensors for t in s.inputs.values())]:
                    pending.remove(step)
                    task = loop.create_task(self._run_step(step, request, tensors))
                    running[task] = step
                if not running:
                    labels = ", ".join(step.label for step in pending)
                    raise InvalidArgument(
                        f"in ensemble '{self._name}': {labels} cannot run: "
                        f"their inputs were not provided"
                    )
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda t: running[t].index):
                    running.pop(task)
                    tensors.update(task.result())
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        return tensors

    async def _run_step(
        self, step: Step, request: InferRequest, tensors: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        inputs = []
        for input_name, tensor_name in step.inputs.items():
            source = tensors[tensor_name]
            inputs.append(Tensor(input_name, source.datatype, source.shape, source.data))
        sub_request = InferRequest(
            step.model_name,
            step.model_version,
            id=request.id,
            inputs=inputs,
            parameters=dict(request.parameters),
        )
        # A traced ensemble request traces its steps as its children
        # (server/observability/tracing.py).
        step_trace = request.trace.child(sub_request) if request.trace is not None else None
        where = f"in ensemble '{self._name}', {step.label}"
        response: InferResponse | None = None
        try:
            response = await self._infer(sub_request)
        except ServerError as exc:
            raise _renamed(exc, f"{where}: {exc.message}") from exc
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise InternalError(f"{where}: {type(exc).__name__}: {exc}") from exc
        finally:
            if step_trace is not None:
                step_trace.end(response)
        by_name = {tensor.name: tensor for tensor in response.outputs}
        produced: dict[str, Tensor] = {}
        for output_name, tensor_name in step.outputs.items():
            tensor = by_name.get(output_name)
            if tensor is None:
                raise InternalError(f"{where}: the model returned no output '{output_name}'")
            produced[tensor_name] = Tensor(tensor_name, tensor.datatype, tensor.shape, tensor.data)
        return produced

    @staticmethod
    def _elapsed(request: InferRequest) -> int:
        return max(0, time.monotonic_ns() - request.arrival_ns)
