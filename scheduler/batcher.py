"""Triton's dynamic batcher: priority queues with their policies, and the rule that seals a batch.

The dispatcher (scheduler/queue_scheduler.py) asks for a batch only when an instance is free, so
while every instance is busy requests pile up here and the next batch is bigger. Sealing follows
Triton's DynamicBatchScheduler::GetDynamicBatch: walk the queue (level 1 first, FIFO within a level,
delayed requests after the level's others), add whole requests while they fit and share shapes,
remember the last point that hits a preferred size, then either send that, send everything (delay
ran out, batch cannot grow, no delay configured) or wait for the delay.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from protocol.errors import Overloaded
from protocol.types import InferRequest
from scheduler.clock import Clock
from scheduler.interface import VersionSpec
from scheduler.policy import LevelPolicy, QueuePolicy
from scheduler.queue_scheduler import QUEUED, RUNNING, BatchingQueue, Entry, QueueScheduler
from scheduler.rate_limiter import RateLimiter
from scheduler.stats import VersionStatistics

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig


@dataclass(slots=True)
class _Level:
    policy: LevelPolicy
    waiting: deque = field(default_factory=deque)  # in arrival order
    delayed: deque = field(default_factory=deque)  # timed out under DELAY, behind the others
    count: int = 0


class BatchQueue(BatchingQueue):
    """The dynamic batcher's queue and batch-sealing rule for one model version."""

    def __init__(self, config: ModelConfig) -> None:
        batching = config.dynamic_batching
        self._max_rows = max(1, config.max_batch_size)
        preferred = (
            {size for size in batching.preferred_batch_size if 0 < size <= self._max_rows}
            if config.max_batch_size > 0
            else set()
        )
        self._preferred = preferred
        self._max_preferred = max(preferred) if preferred else self._max_rows
        self._delay_ns = batching.max_queue_delay_microseconds * 1000
        self._policy = QueuePolicy(config)
        self._levels: dict[int, _Level] = {}
        self._level_order: list[int] = []  # levels that exist so far, highest priority first
        self._deadlines: list[tuple[int, int, Entry]] = []
        self._left_with_deadline = 0  # heap items whose entry already left the queue
        self._seq = itertools.count()
        self._count = 0
        self._key_inputs = _shape_enforced_inputs(config) if config.max_batch_size > 0 else []
        self._by_input_set = any(inp.optional for inp in config.input)

    # -- admission --------------------------------------------------------------------------

    def push(self, entry: Entry) -> None:
        request = entry.request
        # Admission already resolved the request's level and timeout through the same policy.
        level_no = self._policy.level_of(request.priority)
        level = self._level(level_no)
        policy = level.policy
        if policy.max_queue_size and level.count >= policy.max_queue_size:
            raise Overloaded("Exceeds maximum queue size")  # the scheduler sets retry_after
        entry.level = level_no
        timeout_us = request.timeout_us
        if timeout_us:
            entry.deadline_ns = entry.admitted_ns + timeout_us * 1000
            entry.delay_on_timeout = policy.delay_on_timeout
            self._track_deadline(entry)
        entry.key = self._key(request)
        level.waiting.append(entry)
        level.count += 1
        self._count += 1

    def _level(self, number: int) -> _Level:
        level = self._levels.get(number)
        if level is None:
            level = self._levels[number] = _Level(self._policy.for_level(number))
            bisect.insort(self._level_order, number)
        return level

    def _key(self, request: InferRequest) -> Hashable:
        """Requests may share a batch only when this is equal: the non-batch shape of each
        shape-enforced input (and a shape tensor's values), and the set of inputs given when
        the model has optional inputs."""
        if not self._key_inputs and not self._by_input_set:
            return None
        parts: list[Hashable] = []
        for name, is_shape_tensor in self._key_inputs:
            tensor = request.input(name)
            if tensor is None:
                parts.append(None)
            elif is_shape_tensor:
                parts.append((tuple(tensor.shape[1:]), tensor.data.tobytes()))
            else:
                parts.append(tuple(tensor.shape[1:]))
        if self._by_input_set:
            parts.append(frozenset(tensor.name for tensor in request.inputs))
        return tuple(parts)

    # -- timeouts ---------------------------------------------------------------------------

    def expire(self, now_ns: int) -> list[Entry]:
        rejected: list[Entry] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ns:
            entry = heapq.heappop(deadlines)[2]
            if not entry.live:
                continue
            level = self._levels[entry.level]
            if entry.delay_on_timeout:
                entry.delayed = True  # skipped where it was; waits behind the level's others
                level.delayed.append(entry)
            else:
                level.count -= 1
                self._count -= 1
                rejected.append(entry)
        return rejected

    def next_deadline(self) -> int | None:
        deadlines = self._deadlines
        while deadlines and not deadlines[0][2].live:
            heapq.heappop(deadlines)
            self._left_with_deadline = max(0, self._left_with_deadline - 1)
        return deadlines[0][0] if deadlines else None

    def _left(self, entry: Entry) -> None:
        if entry.deadline_ns and not entry.delayed:
            self._left_with_deadline += 1

    def _track_deadline(self, entry: Entry) -> None:
        """Add a deadline; first, once most of the heap is entries that already left, rebuild
        it, so answered requests (and their tensors) are not kept alive until their deadline."""
        deadlines = self._deadlines
        if self._left_with_deadline > 64 and 2 * self._left_with_deadline > len(deadlines):
            deadlines[:] = [item for item in deadlines if item[2].live]
            heapq.heapify(deadlines)
            self._left_with_deadline = 0
        heapq.heappush(deadlines, (entry.deadline_ns, next(self._seq), entry))

    # -- sealing a batch ----------------------------------------------------------------------

    def take(
        self, now_ns: int, flush: bool, defer_due: bool = False
    ) -> tuple[list[Entry], int | None]:
        self._compact()
        batch: list[Entry] = []
        rows = 0
        best = 0  # entries in the largest batch that hit a preferred size (or saturated)
        send_now = False
        oldest = now_ns
        key: Hashable = None
        for entry in self._in_order():
            if batch:
                if not best and rows + entry.rows > self._max_preferred:
                    best = len(batch)  # cannot grow past the largest preferred size
                if rows + entry.rows > self._max_rows or entry.key != key:
                    send_now = True
                    break
            else:
                key = entry.key
            batch.append(entry)
            rows += entry.rows
            oldest = min(oldest, entry.admitted_ns)
            if rows in self._preferred:
                best = len(batch)
        if not batch:
            return [], None
        delay_exceeded = self._delay_ns > 0 and now_ns - oldest >= self._delay_ns
        complete = best or send_now or rows >= self._max_preferred  # a size worth sending
        if delay_exceeded and defer_due and not flush and not complete:
            return [], oldest + self._delay_ns  # due: the timer's pass seals it this turn
        if best and not delay_exceeded and not flush:
            batch = batch[:best]
        elif not (
            flush
            or send_now
            or delay_exceeded
            or self._delay_ns == 0
            or rows >= self._max_preferred
        ):
            return [], oldest + self._delay_ns
        for entry in batch:
            entry.state = RUNNING
            self._levels[entry.level].count -= 1
            self._left(entry)
        self._count -= len(batch)
        self._compact()  # the batch leaves the queue now, not at the next take
        return batch, None

    def _in_order(self) -> Iterator[Entry]:
        # `Entry.live` written out: every take walks the waiting entries through here
        for number in self._level_order:
            level = self._levels[number]
            for entry in level.waiting:
                if entry.state == QUEUED and not entry.delayed and not entry.future.done():
                    yield entry
            for entry in level.delayed:
                if entry.state == QUEUED and not entry.future.done():
                    yield entry

    def _compact(self) -> None:
        """Drop entries that left (taken, cancelled, rejected, moved) from the queue heads."""
        for level in self._levels.values():
            waiting = level.waiting
            while waiting and (waiting[0].delayed or not waiting[0].live):
                waiting.popleft()
            delayed = level.delayed
            while delayed and not delayed[0].live:
                delayed.popleft()

    # -- leaving ------------------------------------------------------------------------------

    def discard(self, entry: Entry) -> None:
        self._levels[entry.level].count -= 1
        self._count -= 1
        self._left(entry)

    def clear(self) -> list[Entry]:
        left = [
            entry
            for number in self._level_order
            for queue, delayed in (
                (self._levels[number].waiting, False),
                (self._levels[number].delayed, True),
            )
            for entry in queue
            if entry.state == QUEUED and entry.delayed == delayed
        ]
        for level in self._levels.values():
            level.waiting.clear()
            level.delayed.clear()
            level.count = 0
        self._deadlines.clear()
        self._left_with_deadline = 0
        self._count = 0
        return left

    def __len__(self) -> int:
        return self._count


def _shape_enforced_inputs(config: ModelConfig) -> list[tuple[str, bool]]:
    """(name, is_shape_tensor) of inputs whose shapes must match within a batch: those with a
    variable dim that do not allow ragged batches, and shape tensors."""
    return [
        (inp.name, inp.is_shape_tensor)
        for inp in config.input
        if inp.is_shape_tensor or (-1 in inp.dims and not inp.allow_ragged_batch)
    ]


class DynamicBatcher(QueueScheduler):
    """The scheduler for models with `dynamic_batching`."""

    def __init__(
        self,
        spec: VersionSpec,
        stats: VersionStatistics,
        *,
        clock: Clock | None = None,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        super().__init__(
            spec,
            stats,
            BatchQueue(spec.config),
            clock=clock,
            preserve_ordering=spec.config.dynamic_batching.preserve_ordering,
            rate_limiter=rate_limiter,
        )
