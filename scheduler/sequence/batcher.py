"""Triton's sequence batcher: the scheduler for models with `sequence_batching`.

Admission reads the request's correlation ID and START / END flags (the `sequence_id`,
`sequence_start` and `sequence_end` parameters both codecs decode), refuses what Triton refuses,
and queues the request in its sequence's slot (scheduler/sequence/slots.py). Dispatch works per
instance, since a sequence's slot lives on one: for each free instance the queue forms a direct
or oldest batch, and this module adds what the client never sends: the control inputs of each
slot, not-ready padding for empty direct slots, and the implicit state of each sequence (the
previous request's state output fed back as this one's state input). Results come back through
the queue scheduler's delivery, padding and state outputs removed.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from protocol.errors import InvalidArgument, Unavailable
from protocol.text import shown
from protocol.types import InferRequest, InferResponse, Tensor
from scheduler.clock import Clock
from scheduler.interface import VersionSpec
from scheduler.pool import BatchRun, Instance, instance_specs
from scheduler.queue_scheduler import Batch, QueueScheduler
from scheduler.rate_limiter import RateLimiter
from scheduler.sequence.config import (
    FLAG_END,
    FLAG_START,
    StateSpec,
    parse_correlation_id,
    read_settings,
)
from scheduler.sequence.slots import Pair, SequenceQueue, Slot
from scheduler.stats import FailureReason, RejectionReason, VersionStatistics

logger = logging.getLogger(__name__)

BACKLOG_TIMEOUT = "timeout of the corresponding sequence has been expired"  # Triton's text


class SequenceBatcher(QueueScheduler):
    """One model version's sequences: slots per instance, direct or oldest batches."""

    def __init__(
        self,
        spec: VersionSpec,
        stats: VersionStatistics,
        *,
        clock: Clock | None = None,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        self.settings = settings = read_settings(spec.config)
        # The pool is built by the base class; its instance list follows the config the same
        # way, so the lanes are known before it exists.
        lanes = [not passive for _, passive in instance_specs(spec.config, spec.name)]
        self._sequences = SequenceQueue(settings, lanes)
        super().__init__(spec, stats, self._sequences, clock=clock, rate_limiter=rate_limiter)
        self._take = self._sequences.take_oldest if settings.oldest else self._sequences.take_direct
        self._state_outputs = frozenset(state.output_name for state in settings.states)
        self._active = -1
        self._drained = False  # after drain(): not even live sequences are admitted

    async def start(self) -> None:
        await super().start()
        self._report_active()

    # -- admission --------------------------------------------------------------------------

    def _admit(self, request: InferRequest) -> asyncio.Future:
        try:
            self._read_sequence(request)
            if not self._accepting and not self._admits_while_draining(request):
                raise self._not_ready()  # retiring: only live sequences go on
            self._sequences.check(request)
        except InvalidArgument:
            self._stats.record_failure(
                FailureReason.OTHER, self._since_arrival(request, self._clock.now_ns())
            )
            raise
        future = super()._admit(request)
        self._report_active()
        return future

    def _read_sequence(self, request: InferRequest) -> None:
        """Set the request's correlation ID and flags from its parameters."""
        model = self.settings.model
        parameters = request.parameters
        corrid = parse_correlation_id(parameters.get("sequence_id")) if parameters else 0
        if corrid == 0 or corrid == "":
            raise InvalidArgument(
                f"inference request to model '{model}' must specify a "
                f"non-zero or non-empty correlation ID"
            )
        if request.batch_size > 1:
            raise InvalidArgument(
                f"inference request to model '{model}' must specify "
                f"batch-size 1 due to requirements of sequence batcher"
            )
        control = self.settings.corrid
        if control is not None and control.wire != "BYTES" and isinstance(corrid, str):
            raise InvalidArgument(
                f"inference request to model '{model}' has the string "
                f"correlation ID '{shown(corrid)}', but its control input "
                f"'{control.name}' takes {control.wire} correlation IDs"
            )
        request.correlation_id = corrid
        # Triton applies a request's `timeout` to a sequence waiting for a slot (validated by
        # the queue policy, which leaves it unset for models without dynamic_batching).
        request.timeout_us = int(parameters.get("timeout") or 0)
        request.sequence_flags = (FLAG_START if parameters.get("sequence_start") else 0) | (
            FLAG_END if parameters.get("sequence_end") else 0
        )

    # -- draining: live sequences finish ---------------------------------------------------

    def continues_sequence(self, request: InferRequest) -> bool:
        parameters = request.parameters
        if not parameters or parameters.get("sequence_start"):
            return False
        return self._sequences.knows(parse_correlation_id(parameters.get("sequence_id")))

    def live_sequences(self) -> int:
        return self._sequences.active_sequences()

    def _admits_while_draining(self, request: InferRequest) -> bool:
        return (
            not self._drained
            and not request.sequence_flags & FLAG_START
            and self._sequences.knows(request.correlation_id)
        )

    def _busy(self) -> bool:
        """Draining waits for live sequences to end (or be released as idle) too."""
        return super()._busy() or (not self._drained and bool(self.live_sequences()))

    async def drain(self, timeout: float) -> None:
        """Stop taking new sequences; live ones may go on until they end, go idle or the
        timeout passes; then what is left fails and every sequence is forgotten."""
        try:
            await super().drain(timeout)
        finally:
            self._drained = True
            self._sequences.forget_sequences()
            self._report_active()

    # -- dispatch -------------------------------------------------------------------------

    def _dispatch(self, defer_due: bool = False) -> int | None:
        """Release idle sequences, then give each free instance its slots' next batch."""
        now = self._clock.now_ns()
        sequences = self._sequences
        released = sequences.reap(now)
        if released:
            for corrid in released:
                logger.info(
                    "sequence %s of model '%s' was idle longer than %d us: its slot is released",
                    corrid,
                    self.settings.model,
                    self.settings.idle_ns // 1000,
                )
            self._stats.sequences_idle_released(len(released))
            self._report_active()
        for entry in sequences.expire_backlogs(now):
            self._fail_waiting(
                entry,
                Unavailable(BACKLOG_TIMEOUT),
                FailureReason.REJECTED,
                now,
                RejectionReason.QUEUE_TIMEOUT,
            )
        wake_at = sequences.next_reap()
        pool = self._pool
        if self._hold:  # TRITONSERVER_DELAY_SCHEDULER, as the queue scheduler honours it
            if len(sequences) < self._hold and self._accepting:
                if self._limited:
                    pool.return_unused()
                return wake_at
            self._hold = 0
        if len(sequences):
            flush = not self._accepting
            for instance in pool.idle_instances():
                lane = instance.spec.index
                # With the rate limiter, an instance whose slots have work asks for its own
                # turn (a sequence stays on its instance); it runs when the turn comes.
                if not pool.may_run(instance) and not (
                    sequences.has_work(lane) and pool.request_turn_for(instance)
                ):
                    continue
                pairs, due = self._take(lane, now, flush)
                if pairs:
                    pool.claim(instance)
                    self._launch_slots(instance, pairs, now)
                elif due is not None and (wake_at is None or due < wake_at):
                    wake_at = due
        if self._limited:
            pool.return_unused()  # a turn that found no batch due
        self._check_settled()
        return wake_at

    def _more_work(self, instance: Instance) -> bool:
        return self._sequences.has_work(instance.spec.index)

    def _launch_slots(self, instance: Instance, pairs: list[Pair], now: int) -> None:
        entries = [entry for _, entry, _ in pairs if entry is not None]
        representative = entries[0].request
        requests: list[InferRequest] = []
        for _, entry, state in pairs:
            if entry is None:
                requests.append(self._padding(representative))
            else:
                requests.append(self._with_controls(entry.request, state))
                entry.started_ns = now
        self._stats.pending_changed(-len(entries))
        self._drain.add(len(entries), now)
        batch = Batch(entries, instance, len(entries), padding=len(pairs) - len(entries))
        self._running.add(batch)
        self._report_active()
        instance.execute(requests, [1] * len(requests), self._slots_finished, (batch, pairs))

    def _with_controls(self, request: InferRequest, state: dict | None) -> InferRequest:
        """The request as the model sees it: its inputs, the slot's controls, the sequence's
        state (initial values at START)."""
        settings = self.settings
        flags = request.sequence_flags
        inputs = request.inputs + settings.control_tensors(flags, request.correlation_id, True)
        if settings.states:
            state = state or {}
            inputs += [
                _state_tensor(spec, state.get(spec.input_name), settings.batching)
                for spec in settings.states
            ]
        return InferRequest(
            request.model_name,
            request.model_version,
            request.id,
            inputs,
            request.outputs,
            request.parameters,
            batch_size=1,
            correlation_id=request.correlation_id,
            sequence_flags=flags,
            arrival_ns=request.arrival_ns,
        )

    def _padding(self, like: InferRequest) -> InferRequest:
        """A padding request for an empty direct slot: zeros shaped like a real request,
        READY false, correlation ID 0; the model runs it and its answer is dropped."""
        settings = self.settings
        inputs = [Tensor(t.name, t.datatype, t.shape, _zeros_like(t.data)) for t in like.inputs]
        inputs += settings.control_tensors(0, 0, False)
        inputs += [_state_tensor(state, None, settings.batching) for state in settings.states]
        return InferRequest(
            like.model_name,
            like.model_version,
            "",
            inputs,
            like.outputs,
            batch_size=1,
            arrival_ns=like.arrival_ns,
        )

    def _slots_finished(self, tag: tuple[Batch, list[Pair]], result: BatchRun) -> None:
        """On the loop, once per batch: keep each sequence's new state, drop the padding's
        answers, then deliver as any batch is delivered."""
        batch, pairs = tag
        outcomes = []
        for (slot, entry, _), outcome in zip(pairs, result.outcomes, strict=False):
            if entry is None:
                continue
            if self._state_outputs and isinstance(outcome, InferResponse):
                self._keep_state(slot, entry.request, outcome)
            outcomes.append(outcome)
        if self.settings.oldest:
            self._sequences.finished([slot for slot, _, _ in pairs])
        result.outcomes = outcomes
        self._batch_finished(batch, result)

    def _keep_state(self, slot: Slot, request: InferRequest, response: InferResponse) -> None:
        states = {t.name: t for t in response.outputs if t.name in self._state_outputs}
        response.outputs = [t for t in response.outputs if t.name not in self._state_outputs]
        if request.sequence_flags & FLAG_END or slot.owner != request.correlation_id:
            return  # the sequence is over: its state goes with it
        kept: dict[str, np.ndarray] = {}
        for state in self.settings.states:
            tensor = states.get(state.output_name)
            if tensor is not None:
                kept[state.input_name] = np.array(tensor.data, copy=True)
        slot.state = kept

    def _report_active(self) -> None:
        active = self._sequences.active_sequences()
        if active != self._active:
            self._active = active
            self._stats.sequences_changed(active)


def _zeros_like(data: np.ndarray) -> np.ndarray:
    if data.dtype == object:
        out = np.empty(data.shape, dtype=object)
        out.fill(b"")
        return out
    return np.zeros_like(data)


def _state_tensor(state: StateSpec, value: np.ndarray | None, batching: bool) -> Tensor:
    """A state input of one request: the sequence's last state, else its initial value."""
    if value is None:
        if state.initial is not None:
            value = state.initial
        else:
            value = np.zeros(tuple(max(1, d) for d in state.dims), dtype=state.dtype)
        if batching:
            value = value.reshape((1,) + value.shape)
    elif batching and value.ndim == len(state.dims):
        value = value.reshape((1,) + value.shape)
    return Tensor(state.input_name, state.wire, tuple(value.shape), value)
