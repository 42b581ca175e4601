"""Queue policy, in one place: priority levels, queue timeouts and their overrides, queue limits.

Triton keeps this in its priority queue (`ModelQueuePolicy` per level); here too one object,
read once from a version's `dynamic_batching` config, answers every question about it: which
level a request joins, how long it may wait, what happens when that time runs out, and how many
requests a level holds. Validation asks it when a request is admitted; the batcher's queue asks
it when the request is queued. Models without `dynamic_batching` have no queue policy: one level,
no timeouts, no limit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from protocol.errors import InvalidArgument
from protocol.types import InferRequest

if TYPE_CHECKING:  # pragma: no cover
    from protocol.model_config_pb2 import ModelConfig, ModelQueuePolicy

_DELAY = 1  # ModelQueuePolicy.TimeoutAction.DELAY


@dataclass(frozen=True, slots=True)
class LevelPolicy:
    """One priority level's ModelQueuePolicy."""

    delay_on_timeout: bool = False
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0 = unbounded

    @classmethod
    def from_config(cls, policy: "ModelQueuePolicy") -> "LevelPolicy":
        return cls(policy.timeout_action == _DELAY, int(policy.default_timeout_microseconds),
                   bool(policy.allow_timeout_override), int(policy.max_queue_size))

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

    def __init__(self, config: "ModelConfig") -> None:
        self.enabled = config.HasField("dynamic_batching")
        batching = config.dynamic_batching
        self.levels = int(batching.priority_levels) if self.enabled else 0
        self.default_level = int(batching.default_priority_level) if self.levels else 0
        self._default = LevelPolicy.from_config(batching.default_queue_policy) \
            if self.enabled else _NO_POLICY
        self._per_level = {int(level): LevelPolicy.from_config(policy)
                           for level, policy in batching.priority_queue_policy.items()} \
            if self.enabled else {}

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


def _uint_parameter(request: InferRequest, key: str) -> int:
    value: Any = request.parameters.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"[request id: {request.id or '<id_unknown>'}] parameter '{key}' "
                              f"must be a non-negative integer, got {value!r}")
    return value
