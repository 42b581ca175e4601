"""scheduler/policy.py: the one owner of queue policy (levels, timeouts, overrides, limits)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from protocol.errors import InvalidArgument
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.types import InferRequest
from scheduler.policy import LevelPolicy, QueuePolicy


def policy(batching: str | None) -> QueuePolicy:
    text = 'name: "m" max_batch_size: 8'
    if batching is not None:
        text += f" dynamic_batching {{ {batching} }}"
    return QueuePolicy(text_format.Parse(text, ModelConfig()))


LEVELS = """
  priority_levels: 3 default_priority_level: 2
  default_queue_policy { default_timeout_microseconds: 1000 allow_timeout_override: true }
  priority_queue_policy { key: 1 value { default_timeout_microseconds: 100
                                         timeout_action: DELAY max_queue_size: 4 } }
"""


def admitted(queue_policy: QueuePolicy, **parameters: object) -> InferRequest:
    request = InferRequest("m", parameters=dict(parameters))
    queue_policy.apply(request)
    return request


def test_a_priority_that_names_a_level_joins_it_others_join_the_default_level() -> None:
    p = policy(LEVELS)
    assert [p.level_of(n) for n in (0, 1, 2, 3, 4)] == [2, 1, 2, 3, 2]
    assert (admitted(p, priority=1).priority, admitted(p).priority) == (1, 2)


def test_each_level_has_its_own_policy_falling_back_to_the_default() -> None:
    p = policy(LEVELS)
    assert p.for_level(1) == LevelPolicy(True, 100, False, 4)
    assert p.for_level(3) == p.for_level(2) == LevelPolicy(False, 1000, True, 0)


def test_a_timeout_override_applies_only_when_allowed_and_shorter() -> None:
    p = policy(LEVELS)
    assert admitted(p, timeout=500).timeout_us == 500  # default level: allowed, shorter
    assert admitted(p, timeout=5000).timeout_us == 1000  # longer: the default stays
    assert admitted(p, timeout=50, priority=1).timeout_us == 100  # level 1: not allowed
    assert admitted(p).timeout_us == 1000


def test_without_dynamic_batching_there_is_one_level_and_no_timeout() -> None:
    p = policy(None)
    request = admitted(p, priority=3, timeout=10)
    assert (request.priority, request.timeout_us) == (0, 0)
    assert p.for_level(0) == LevelPolicy()


@pytest.mark.parametrize("parameters", [{"priority": -1}, {"timeout": "soon"}, {"priority": True}])
def test_priority_and_timeout_must_be_non_negative_integers(parameters: dict) -> None:
    with pytest.raises(InvalidArgument, match="must be a non-negative integer"):
        admitted(policy(LEVELS), **parameters)


# -- drain rate: the Retry-After of a full queue ---------------------------------------------
S = 1_000_000_000


def test_retry_after_is_the_time_the_queue_needs_to_drain_at_its_recent_rate() -> None:
    from scheduler.policy import DrainRate

    rate = DrainRate(window_s=10, bucket_s=0.5)
    for tick in range(41):  # 2 requests every 0.25 s for 10 s: 8 per second
        rate.add(2, 100 * S + tick * S // 4)
    now = 110 * S
    assert rate.per_second(now) == pytest.approx(8, rel=0.1)
    assert rate.retry_after(40, now) == 5  # 40 queued at 8/s
    assert rate.retry_after(3, now) == 1  # never under a second
    assert rate.retry_after(10_000, now) == 60  # never over a minute


def test_retry_after_forgets_old_traffic_and_is_the_window_when_nothing_drains() -> None:
    from scheduler.policy import DrainRate

    rate = DrainRate(window_s=10, bucket_s=0.5)
    assert rate.retry_after(1, 5 * S) == 10  # nothing ever left the queue: no rate to go by
    rate.add(1000, 5 * S)
    assert rate.retry_after(100, 5 * S) == 1  # 1000 in the last second (at least 1 s measured)
    assert rate.retry_after(100, 30 * S) == 10  # nothing left in the last 10 s
