"""Queueing and dispatch for one model version, and the default (non-batching) scheduler.

`QueueScheduler` owns what every queueing scheduler shares: admission, the pending count,
dispatch (handing a batch to whichever instance is free), cancellation, scattering results onto
futures, statistics, drain and stop. What goes into the next batch is its queue's job:
`FifoQueue` here (one request per execution, oldest first) and the dynamic batcher's queue in
scheduler/batcher.py.

Dispatch happens where something changed, without a task switch on the hot path: `submit()` runs
a dispatch pass itself (so a request that finds an idle instance is launched before `submit`
returns), and so does the callback that delivers a finished batch (so the instance gets its next
batch at once). A dispatch task remains for what happens later: the queue delay and queue
timeouts (one timer, always set for the next moment a pass is due), cancellation and drain.
Requests admitted together inside `admission_group()` (the model owner admitting a frontend
process's frame of requests) share one pass per scheduler, run when the group ends.

Every admitted request ends in exactly one of: answered, failed by its batch, rejected on queue
timeout, cancelled, or failed by drain/stop. Each of those paths records its statistics once and
takes the request out of the pending count exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

from protocol.errors import InternalError, Overloaded, ServerError, Unavailable
from protocol.types import InferRequest
from scheduler.clock import Clock, MonotonicClock, TimerHandle
from scheduler.interface import Scheduler, VersionSpec
from scheduler.policy import DrainRate
from scheduler.pool import BatchRun, Failed, Instance, InstancePool
from scheduler.rate_limiter import RateLimiter
from scheduler.stats import FailureReason, RejectionReason, VersionStatistics

logger = logging.getLogger(__name__)


class _Group(threading.local):
    """The admission group open on this thread: the schedulers that owe a dispatch pass."""

    owing: list[QueueScheduler] | None = None


_GROUP = _Group()


@contextmanager
def admission_group() -> Iterator[None]:
    """Requests submitted inside are queued, and each scheduler they went to runs one dispatch
    pass when the group ends, not one per request: the pass walks the queue, and a batch formed
    after the last of them takes them all. Nested groups join the outer one."""
    if _GROUP.owing is not None:
        yield
        return
    owing: list[QueueScheduler] = []
    _GROUP.owing = owing
    try:
        yield
    finally:
        _GROUP.owing = None
        for scheduler in owing:
            scheduler._owes_pass = False
            scheduler._dispatch_now(defer_due=True)


def _delay_scheduler() -> int:
    """TRITONSERVER_DELAY_SCHEDULER=N, Triton's test hook, read once when the server starts:
    each model version's scheduler forms no batch until N requests are queued (then works as
    usual), so that tests can fix what one batch holds (NVIDIA's qa L0_batcher sets it)."""
    value = os.environ.get("TRITONSERVER_DELAY_SCHEDULER", "").strip()
    if not value:
        return 0
    try:
        count = max(0, int(value))
    except ValueError:
        logger.warning("ignoring TRITONSERVER_DELAY_SCHEDULER=%r: not a count", value)
        return 0
    logger.warning(
        "TRITONSERVER_DELAY_SCHEDULER=%d: every scheduler holds its first batch until "
        "%d requests are queued (a test hook)",
        count,
        count,
    )
    return count


DELAY_SCHEDULER = _delay_scheduler()

# Entry states. QUEUED -> RUNNING -> DONE, or QUEUED/RUNNING -> CANCELLED, or QUEUED -> DONE.
QUEUED, RUNNING, DONE, CANCELLED = range(4)


@dataclass(slots=True, eq=False)
class Entry:
    """One admitted request and what the queue needs to know about it."""

    request: InferRequest
    future: asyncio.Future
    rows: int  # batch elements it adds (1 for a model that does not batch)
    admitted_ns: int
    level: int = 0
    deadline_ns: int = 0  # queue timeout; 0 = none
    delay_on_timeout: bool = False
    delayed: bool = False
    key: Hashable = None  # requests share a batch only with equal keys
    started_ns: int = 0
    state: int = QUEUED
    on_cancel: Callable[[asyncio.Future], None] | None = None  # its future's done callback

    @property
    def live(self) -> bool:
        """Still waiting in a queue (a cancelled future's callback may not have run yet)."""
        return self.state == QUEUED and not self.future.done()


class RequestQueue(ABC):
    """Where admitted requests wait, and the rule for which of them form the next batch.

    Queues may keep left entries around and skip them lazily (`Entry.live`); `len()` counts only
    the entries still waiting, and each method that removes entries adjusts it.
    """

    @abstractmethod
    def push(self, entry: Entry) -> None:
        """Queue `entry` (setting its level, deadline and key); raise Unavailable when full."""

    def expire(self, now_ns: int) -> list[Entry]:
        """Entries whose queue timeout ran out and must be rejected (removed from the queue)."""
        return []

    def next_deadline(self) -> int | None:
        """The earliest queue timeout still ahead, for the dispatcher's timer."""
        return None

    @abstractmethod
    def discard(self, entry: Entry) -> None:
        """A waiting entry left on its own (cancelled)."""

    @abstractmethod
    def clear(self) -> list[Entry]:
        """Remove and return every entry still QUEUED (a cancelled one included)."""

    @abstractmethod
    def __len__(self) -> int: ...


class BatchingQueue(RequestQueue):
    """A queue the default dispatcher asks for "the next batch for a free instance". (The
    sequence batcher's queue forms batches per instance instead and dispatches on its own.)"""

    @abstractmethod
    def take(
        self, now_ns: int, flush: bool, defer_due: bool = False
    ) -> tuple[list[Entry], int | None]:
        """The next batch for a free instance (removed from the queue and marked RUNNING), or
        ([], when to look again: None for 'on the next arrival'). `flush` means no more
        requests will come: send without waiting. `defer_due` means the caller runs in the
        middle of a loop turn (`submit()`, or an instance's answer coming back): a batch that is
        due only because its queue delay ran out is then left to the timer's pass (return it as
        due, not the batch), which also takes what else arrives in this loop turn; sealing it
        mid-turn would cut those off and make batches smaller. A due batch that already holds a
        preferred size, or cannot grow, is sealed at once: the timer's pass comes loop turns
        later, and the instance would wait for it (bench/FINDINGS.md 39)."""


class FifoQueue(BatchingQueue):
    """Oldest first, one request per execution: the default scheduler's queue."""

    def __init__(self) -> None:
        self._entries: deque[Entry] = deque()
        self._count = 0

    def push(self, entry: Entry) -> None:
        self._entries.append(entry)
        self._count += 1

    def take(
        self, now_ns: int, flush: bool, defer_due: bool = False
    ) -> tuple[list[Entry], int | None]:
        entries = self._entries
        while entries:
            entry = entries.popleft()
            if entry.live:
                self._count -= 1
                entry.state = RUNNING
                return [entry], None
        return [], None

    def discard(self, entry: Entry) -> None:
        self._count -= 1

    def clear(self) -> list[Entry]:
        left = [entry for entry in self._entries if entry.state == QUEUED]
        self._entries.clear()
        self._count = 0
        return left

    def __len__(self) -> int:
        return self._count


@dataclass(slots=True, eq=False)
class Batch:
    """One batch on its way to an instance: the requests it holds, and what running it gave."""

    entries: list[Entry]
    instance: Instance
    rows: int
    result: BatchRun | None = None
    padding: int = 0  # not-ready rows the sequence batcher added (executed, not inferences)


class QueueScheduler(Scheduler):
    """Admission, dispatch to free instances, and result delivery for one model version."""

    def __init__(
        self,
        spec: VersionSpec,
        stats: VersionStatistics,
        queue: RequestQueue,
        *,
        clock: Clock | None = None,
        preserve_ordering: bool = False,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        super().__init__(spec, stats)
        self._queue = queue
        self._clock: Clock = clock or MonotonicClock()
        self._pool = InstancePool(spec, self._clock, rate_limiter, self._turn_given)
        self._limited = self._pool.limited  # some instance runs only when given a turn
        self._preserve_ordering = preserve_ordering
        self._batching = spec.config.max_batch_size > 0
        self._accepting = False
        self._usable = True
        self.failure_reason = ""  # why the last instance was lost (shown in the index)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._timer: TimerHandle | None = None
        self._timer_at: int | None = None  # when `_timer` fires
        self._running: set[Batch] = set()
        self._in_order: deque[Batch] = deque()
        self._settled: asyncio.Event | None = None
        self._drain = DrainRate()  # how fast the queue empties: a full queue's Retry-After
        # Kept at start: asking asyncio for the running loop costs a getpid() syscall per call
        # on Python 3.11, and submit() would ask once per request.
        self._loop: asyncio.AbstractEventLoop | None = None
        # Triton's test hook: form no batch until this many requests are queued (once).
        self._hold = DELAY_SCHEDULER
        self._owes_pass = False  # admitted in an open admission_group(): its pass comes at the end

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def pool(self) -> InstancePool:
        return self._pool

    async def start(self) -> None:
        await self._pool.load()
        self._accepting = True
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(
            self._dispatch_forever(), name=f"scheduler:{self._spec.name}:{self._spec.version}"
        )

    def healthy(self) -> bool:
        return self._usable and self._pool.ready()

    async def drain(self, timeout: float) -> None:
        self._accepting = False
        self._wake.set()
        if self._busy():
            settled = self._settled = asyncio.Event()
            deadline = self._clock.now_ns() + max(0, int(timeout * 1e9))
            timer = self._clock.call_at(deadline, settled.set)
            try:
                await settled.wait()
            finally:
                timer.cancel()
                self._settled = None
        self._fail_all(self._not_ready())

    async def stop(self) -> None:
        if self._accepting or self._busy():
            await self.drain(0)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._set_timer(None)
        await self._pool.unload()

    # -- admission ------------------------------------------------------------------------

    def _now_ns(self) -> int:
        return self._clock.now_ns()

    def _admit(self, request: InferRequest) -> asyncio.Future:
        if not self._usable or not (self._accepting or self._admits_while_draining(request)):
            raise self._not_ready()
        now = self._clock.now_ns()
        rows = request.batch_size if self._batching and request.batch_size > 0 else 1
        future = (self._loop or asyncio.get_running_loop()).create_future()
        entry = Entry(request, future, rows, now)
        try:
            self._queue.push(entry)
        except Overloaded as full:
            full.retry_after = self._drain.retry_after(len(self._queue), now)
            self._stats.record_rejection(
                RejectionReason.QUEUE_FULL, self._since_arrival(request, now)
            )
            raise
        except ServerError:
            self._stats.record_failure(FailureReason.REJECTED, self._since_arrival(request, now))
            raise
        self._stats.pending_changed(+1)
        entry.on_cancel = partial(self._future_done, entry)
        future.add_done_callback(entry.on_cancel)
        owing = _GROUP.owing
        if owing is None:
            self._dispatch_now(defer_due=True)  # launched before we return, when the rules allow
        elif not self._owes_pass:  # one pass when the group ends
            self._owes_pass = True
            owing.append(self)
        return future

    def _admits_while_draining(self, request: InferRequest) -> bool:
        """A request still taken after drain began (a live sequence's next one)."""
        return False

    def _not_ready(self) -> Unavailable:
        return Unavailable(
            f"'{self._spec.name}' version {self._spec.version} is not at ready state"
        )

    # -- dispatch -------------------------------------------------------------------------

    async def _dispatch_forever(self) -> None:
        """Run a pass whenever woken: by a cancellation or drain (the timer runs its own)."""
        wake = self._wake
        while True:
            wake.clear()
            self._dispatch_now()
            await wake.wait()

    def _dispatch_now(self, defer_due: bool = False) -> None:
        """One dispatch pass here and now, then the timer for the next one."""
        try:
            self._set_timer(self._dispatch(defer_due))
        except Exception:  # a bug here must not strand queued requests
            logger.exception(
                "scheduler for '%s' version %s failed", self._spec.name, self._spec.version
            )
            self._usable = False
            self._fail_queued(InternalError("scheduler failed"), FailureReason.OTHER)

    def _set_timer(self, when: int | None) -> None:
        """Keep one timer, at `when` (None: none), that wakes the task for a pass.

        Every pass says when the next is due, so the timer follows the last pass, as a fresh
        timer per pass would; it is only kept, not remade, when the moment did not change.
        """
        if when == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._clock.call_at(when, self._timer_fired) if when is not None else None

    def _more_work(self, instance: Instance) -> bool:
        """Whether `instance` has work waiting now (it then asks for its next turn at once)."""
        return bool(len(self._queue))

    def _turn_given(self) -> None:
        """The rate limiter gave a waiting instance its turn: dispatch (on the loop)."""
        if self._task is not None:
            self._dispatch_now()
        else:  # stopped meanwhile, or not yet started: nothing runs on this turn
            self._pool.return_unused()

    def _timer_fired(self) -> None:
        """The timer's pass comes at the end of this loop turn, so what arrives in the turn the
        delay runs out joins the batch (bench/FINDINGS.md 25). A callback of its own, not the
        task woken through its Event: the same moment, without the task step and the Event's
        future per timed batch (FINDINGS 36)."""
        self._timer = self._timer_at = None
        loop = self._loop
        if loop is not None:
            loop.call_soon(self._timed_pass)

    def _timed_pass(self) -> None:
        if self._task is not None:  # started and not stopped meanwhile
            self._dispatch_now()

    def _dispatch(self, defer_due: bool = False) -> int | None:
        """Reject expired requests, give batches to free instances; return when to look again.
        `defer_due`: a pass in the middle of a loop turn (see `BatchingQueue.take`)."""
        now = self._clock.now_ns()
        queue: BatchingQueue = self._queue  # type: ignore[assignment]  # the default dispatcher's
        for entry in queue.expire(now):
            self._fail_waiting(
                entry,
                Unavailable("Request timeout expired"),
                FailureReason.REJECTED,
                now,
                RejectionReason.QUEUE_TIMEOUT,
            )
        pool = self._pool
        if self._hold:
            if len(queue) < self._hold and self._accepting:
                if self._limited:
                    pool.return_unused()
                return queue.next_deadline()
            self._hold = 0
        wake_at: int | None = None
        while len(queue):
            # With the rate limiter an instance waits for its turn; the batch is formed when
            # the turn comes, so it holds what arrived meanwhile.
            if not pool.has_idle() and not pool.request_turn(len(queue)):
                break
            batch, wake_at = queue.take(now, not self._accepting, defer_due)
            if not batch:
                break
            instance = pool.acquire()
            assert instance is not None
            self._launch(instance, batch, now)
        if self._limited:
            pool.return_unused()  # a turn that found no batch (due later, or cancelled)
        deadline = queue.next_deadline()
        if deadline is not None and (wake_at is None or deadline < wake_at):
            wake_at = deadline
        self._check_settled()
        return wake_at

    def _launch(self, instance: Instance, entries: list[Entry], now: int) -> None:
        for entry in entries:
            entry.state = RUNNING
            entry.started_ns = now
        self._stats.pending_changed(-len(entries))
        self._drain.add(len(entries), now)
        rows = [entry.rows for entry in entries]
        batch = Batch(entries, instance, sum(rows))
        self._running.add(batch)
        if self._preserve_ordering:
            self._in_order.append(batch)
        instance.execute([entry.request for entry in entries], rows, self._batch_finished, batch)

    def _batch_finished(self, batch: Batch, result: BatchRun) -> None:
        """On the loop, once per batch (the instance thread's only call back)."""
        batch.result = result
        instance = batch.instance
        if result.fatal:
            instance.healthy = False
            self.failure_reason = next(
                (o.error.message for o in result.outcomes if isinstance(o, Failed)), ""
            )
        self._pool.release(instance, self._limited and self._more_work(instance))
        if len(self._queue) and self._pool.has_idle():
            # The next batch first, so the instance need not wait for the loop; but one that is
            # due only by its delay, and short of a preferred size, waits for the timer's pass
            # with this turn's arrivals (sealed here, HTTP batches halved: bench/FINDINGS.md
            # 25; one already at a preferred size goes now: FINDINGS 39).
            self._dispatch_now(defer_due=True)
        if result.executed:
            self._stats.record_execution(
                batch.rows + batch.padding,
                result.input_ns,
                result.infer_ns,
                result.output_ns,
                batch.rows,
            )
        if self._preserve_ordering:
            in_order = self._in_order
            while in_order and in_order[0].result is not None:
                self._deliver(in_order.popleft())
        else:
            self._deliver(batch)
        # Only a fatal result takes an instance out, so only then can the last one be gone.
        if result.fatal and self._usable and not self._pool.healthy():
            logger.error(
                "'%s' version %s has no healthy instance left", self._spec.name, self._spec.version
            )
            self._usable = False
            self._fail_queued(self._not_ready(), FailureReason.OTHER)
        self._check_settled()

    def _deliver(self, batch: Batch) -> None:
        """Set each request's result or error, and record it, once."""
        self._running.discard(batch)
        result = batch.result
        assert result is not None
        now = self._clock.now_ns()
        stats = self._stats
        answered: list[tuple[int, int]] = []  # (total, queue) of each success, recorded once
        for entry, outcome in zip(batch.entries, result.outcomes, strict=False):
            if entry.state != RUNNING:
                continue  # cancelled meanwhile, or already failed by drain
            entry.state = DONE
            arrival_ns = entry.request.arrival_ns
            total = max(0, now - arrival_ns)
            future = entry.future
            if future.done():  # cancelled; its callback has not run yet
                stats.record_failure(FailureReason.CANCELED, total)
                continue
            # Answered now, so the cancel watch has nothing left to do: unhooking it saves
            # the loop a callback per request.
            future.remove_done_callback(entry.on_cancel)  # type: ignore[arg-type]  # set at admission
            # And dropped: the callback holds the entry, which holds the future and so the
            # answer; the cycle kept every answer's tensors until the collector ran (rarely:
            # server/app.py), and with them the NPU executor's output buffers.
            entry.on_cancel = None
            if isinstance(outcome, Failed):
                future.set_exception(outcome.error)
                stats.record_failure(outcome.reason, total)
            else:
                future.set_result(outcome)
                if (
                    entry.request.trace is not None
                ):  # a sampled request (server/observability/tracing.py)
                    entry.request.trace.computed(
                        entry.started_ns,
                        result.input_ns,
                        result.infer_ns,
                        result.output_ns,
                        batch.rows,
                    )
                answered.append((total, max(0, entry.started_ns - arrival_ns)))
        # a decoupled model's first answers came through their streams
        stats.record_successes(
            answered, result.input_ns, result.infer_ns, result.output_ns, not self.rules.decoupled
        )

    # -- leaving without running ------------------------------------------------------------

    def _future_done(self, entry: Entry, future: asyncio.Future) -> None:
        """The caller cancelled: drop the request if it waits, forget its answer if it runs."""
        if not future.cancelled() or entry.state not in (QUEUED, RUNNING):
            return
        was_queued = entry.state == QUEUED
        entry.state = CANCELLED
        if was_queued:
            self._queue.discard(entry)
            self._stats.pending_changed(-1)
        self._stats.record_failure(
            FailureReason.CANCELED, self._since_arrival(entry.request, self._clock.now_ns())
        )
        self._check_settled()
        self._wake.set()

    def _fail_waiting(
        self, entry: Entry, error: ServerError, reason: str, now: int, rejection: str = ""
    ) -> None:
        """Fail an entry that its queue has already removed (`rejection`: the
        RejectionReason of a REJECTED one)."""
        entry.state = DONE
        self._stats.pending_changed(-1)
        if entry.future.cancelled():
            reason = FailureReason.CANCELED  # its callback has not run yet
        elif not entry.future.done():
            entry.future.set_exception(error)
        if rejection and reason == FailureReason.REJECTED:
            self._stats.record_rejection(rejection, self._since_arrival(entry.request, now))
        else:
            self._stats.record_failure(reason, self._since_arrival(entry.request, now))

    def _fail_queued(self, error: ServerError, reason: str) -> None:
        now = self._clock.now_ns()
        for entry in self._queue.clear():
            self._fail_waiting(entry, error, reason, now)
        self._check_settled()

    def _fail_all(self, error: ServerError) -> None:
        """After drain: fail what waits and what still runs; late results are then dropped."""
        self._fail_queued(error, FailureReason.OTHER)
        now = self._clock.now_ns()
        for batch in list(self._running):
            for entry in batch.entries:
                if entry.state == RUNNING:
                    entry.state = DONE
                    if not entry.future.done():
                        entry.future.set_exception(error)
                    self._stats.record_failure(
                        FailureReason.OTHER, self._since_arrival(entry.request, now)
                    )
        self._running.clear()
        self._in_order.clear()

    # -- helpers ----------------------------------------------------------------------------

    def _busy(self) -> bool:
        return bool(len(self._queue) or self._running)

    def _check_settled(self) -> None:
        if self._settled is not None and not self._busy():
            self._settled.set()

    @staticmethod
    def _since_arrival(request: InferRequest, now: int) -> int:
        return max(0, now - request.arrival_ns)


class DefaultScheduler(QueueScheduler):
    """For models without dynamic_batching: each instance runs one request at a time, all
    instances in parallel, requests taken oldest first."""

    def __init__(
        self,
        spec: VersionSpec,
        stats: VersionStatistics,
        *,
        clock: Clock | None = None,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        super().__init__(spec, stats, FifoQueue(), clock=clock, rate_limiter=rate_limiter)
