"""Queue policy, in one place: priority levels, queue timeouts and their overrides, queue limits.

Triton keeps this in its priority queue (`ModelQueuePolicy` per level); here too one object,
read once from a version's `dynamic_batching` config, answers every question about it: which
level a request joins, how long it may wait, what happens when that time runs out, and how many
requests a level holds. Validation asks it when a request is admitted; the batcher's queue asks
it when the request is queued. Models without `dynamic_batching` have no queue policy: one level,
no timeouts, no limit.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from protocol.errors import InvalidArgument
from protocol.text import shown
from protocol.types import InferRequest

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig, ModelQueuePolicy

_DELAY = 1  # ModelQueuePolicy.TimeoutAction.DELAY


@dataclass(frozen=True, slots=True)
class LevelPolicy:
    """One priority level's ModelQueuePolicy."""

    delay_on_timeout: bool = False
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0 = unbounded

    @classmethod
    def from_config(cls, policy: ModelQueuePolicy) -> LevelPolicy:
        return cls(
            policy.timeout_action == _DELAY,
            int(policy.default_timeout_microseconds),
            bool(policy.allow_timeout_override),
            int(policy.max_queue_size),
        )

    def timeout_us(self, requested_us: int) -> int:
        """The queue timeout a request gets: its own only when allowed, set and shorter than
        a non-zero default (as Triton applies it)."""
        if self.allow_timeout_override and 0 < requested_us < self.default_timeout_us:
            return requested_us
        return self.default_timeout_us


_NO_POLICY = LevelPolicy()


class QueuePolicy:
    """The queue policy of one model version."""

    __slots__ = ("enabled", "levels", "default_level", "_default", "_per_level")

    def __init__(self, config: ModelConfig) -> None:
        self.enabled = config.HasField("dynamic_batching")
        batching = config.dynamic_batching
        self.levels = int(batching.priority_levels) if self.enabled else 0
        self.default_level = int(batching.default_priority_level) if self.levels else 0
        self._default = (
            LevelPolicy.from_config(batching.default_queue_policy) if self.enabled else _NO_POLICY
        )
        self._per_level = (
            {
                int(level): LevelPolicy.from_config(policy)
                for level, policy in batching.priority_queue_policy.items()
            }
            if self.enabled
            else {}
        )

    def level_of(self, priority: int) -> int:
        """The level a requested priority joins: itself when it names a level, else the
        default level (0 when the model has no priority levels)."""
        if not self.levels:
            return 0
        return priority if 1 <= priority <= self.levels else self.default_level

    def for_level(self, level: int) -> LevelPolicy:
        return self._per_level.get(level, self._default) if level else self._default

    def apply(self, request: InferRequest) -> None:
        """Read the request's `priority` and `timeout` parameters (non-negative integers) and
        set the level and queue timeout it gets."""
        if request.parameters:
            priority = _uint_parameter(request, "priority")
            timeout = _uint_parameter(request, "timeout")
        else:
            priority = timeout = 0
        if not self.enabled:
            request.priority = 0
            request.timeout_us = 0
            return
        request.priority = level = self.level_of(priority)
        request.timeout_us = self.for_level(level).timeout_us(timeout)


MAX_RETRY_AFTER_S = 60


class DrainRate:
    """How fast a version's queue empties, and so when a request refused because the queue is
    full should come back (Retry-After).

    Counts the requests handed to instances (once per batch, into buckets of `bucket_s`) over
    the last `window_s` seconds; the rate is only read when a request is refused. Retry-After
    is the time the requests now queued need to leave at that rate, in whole seconds, at
    least 1 and at most MAX_RETRY_AFTER_S. When nothing left the queue in the window (long
    executions, or a queue that filled before anything ran) there is no rate to go by, and
    the answer is the window itself: nothing is known about a shorter time.
    """

    __slots__ = ("_buckets", "_bucket_ns", "_window_ns")

    def __init__(self, window_s: float = 10.0, bucket_s: float = 0.5) -> None:
        self._buckets: deque[list[int]] = deque()  # [start_ns, requests], oldest first
        self._bucket_ns = int(bucket_s * 1e9)
        self._window_ns = int(window_s * 1e9)

    def add(self, requests: int, now_ns: int) -> None:
        """`requests` left the queue for an instance at `now_ns`."""
        buckets = self._buckets
        if not buckets or now_ns - buckets[-1][0] >= self._bucket_ns:
            buckets.append([now_ns, 0])
            self._forget(now_ns)
        buckets[-1][1] += requests

    def per_second(self, now_ns: int) -> float:
        """Requests per second over the window (measured over at least one second, so a
        short burst just after a quiet spell does not read as a high rate)."""
        self._forget(now_ns)
        if not self._buckets:
            return 0.0
        span_ns = max(now_ns - self._buckets[0][0], 1_000_000_000)
        return sum(count for _, count in self._buckets) * 1e9 / span_ns

    def retry_after(self, waiting: int, now_ns: int) -> int:
        """Whole seconds until the `waiting` requests now queued have left."""
        rate = self.per_second(now_ns)
        if rate <= 0.0:
            return min(MAX_RETRY_AFTER_S, max(1, math.ceil(self._window_ns / 1e9)))
        return min(MAX_RETRY_AFTER_S, max(1, math.ceil(waiting / rate)))

    def _forget(self, now_ns: int) -> None:
        buckets, horizon = self._buckets, now_ns - self._window_ns
        while buckets and buckets[0][0] < horizon:
            buckets.popleft()


def _uint_parameter(request: InferRequest, key: str) -> int:
    value: Any = request.parameters.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(
            f"[request id: {shown(request.id) if request.id else '<id_unknown>'}] "
            f"parameter '{shown(key)}' "
            f"must be a non-negative integer, got {value!r}"
        )
    return value
