"""The rate limiter on its own: resource counts (default, explicit, per device, global), the
load-time refusals with Triton's texts, and how turns are shared by priority."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from protocol.proto.model_config_pb2 import ModelRateLimiter
from scheduler.rate_limiter import (
    GLOBAL,
    GRANTED,
    Claimant,
    RateLimiter,
    RateLimitError,
    ResourceLimit,
    parse_resource_flag,
)


def limiter(*flags: str) -> RateLimiter:
    """A limiter whose announcements run at once (the server's go through the loop)."""
    return RateLimiter([parse_resource_flag(flag) for flag in flags], schedule=lambda f: f())


def claimant(
    rl: RateLimiter, label: str, config: str, device: int = 0, told: list[str] | None = None
) -> Claimant:
    parsed = text_format.Parse(config, ModelRateLimiter())
    heard = told if told is not None else []
    made = rl.claimant(label, parsed, device, lambda: heard.append(label))
    assert made is not None
    return made


# -- the flag ------------------------------------------------------------------------------------


def test_the_flag_takes_name_count_and_an_optional_device_case_insensitively():
    assert parse_resource_flag("R1:4") == ResourceLimit("r1", 4, None)
    assert parse_resource_flag("Mem:10:1") == ResourceLimit("mem", 10, 1)


@pytest.mark.parametrize("text", ["R1", "R1:x", "R1:-1", ":3", "R1:2:a", "R1:2:0:1"])
def test_a_malformed_flag_says_the_form_it_expects(text):
    with pytest.raises(ValueError, match="expected <name>:<count>|whole number|device id"):
        parse_resource_flag(text)


# -- counts and refusals ---------------------------------------------------------------------------


def test_by_default_a_resource_has_the_most_any_instance_asks_for():
    rl = limiter()
    a = claimant(rl, "a", 'resources [{ name: "R1" count: 4 }, { name: "R2" count: 4 }]')
    b = claimant(rl, "b", 'resources [{ name: "R2" count: 5 }, { name: "R3" count: 10 }]')
    rl.admit([a])
    rl.admit([b])
    assert rl.capacity((0, "r1")) == 4
    assert rl.capacity((0, "r2")) == 5
    assert rl.capacity((0, "r3")) == 10
    rl.remove([b])  # the default follows what is loaded
    assert rl.capacity((0, "r2")) == 4


def test_flags_set_counts_per_device_and_once_for_a_global_resource():
    rl = limiter("R1:10", "R2:5:0", "R2:8:1", "R3:2")
    dev0 = claimant(rl, "x0", 'resources [{ name: "R1" count: 1 }, { name: "R2" count: 1 }]', 0)
    dev1 = claimant(rl, "x1", 'resources [{ name: "R1" count: 1 }, { name: "R2" count: 1 }]', 1)
    glob = claimant(rl, "g", 'resources [{ name: "R3" global: true count: 1 }]', 1)
    rl.admit([dev0, dev1, glob])
    assert sorted(rl.resources()) == [
        ("0", "r1", 10, 0),
        ("0", "r2", 5, 0),
        ("1", "r1", 10, 0),
        ("1", "r2", 8, 0),
        ("GLOBAL", "r3", 2, 0),
    ]


def test_an_instance_asking_more_than_the_flag_gives_is_refused_with_tritons_text():
    rl = limiter("resource1:3")
    big = claimant(rl, "m/m_0", 'resources [{ name: "resource1" count: 4 }]')
    with pytest.raises(RateLimitError) as info:
        rl.admit([big])
    assert info.value.message == (
        'Resource count for "resource1" is limited to 3 which will prevent scheduling of one '
        "or more model instances, the minimum required count is 4"
    )
    assert rl.resources() == []  # nothing of the refused model stays


def test_a_flag_for_another_device_leaves_none_on_this_one():
    rl = limiter("resource1:10:10")
    one = claimant(rl, "m/m_0", 'resources [{ name: "resource1" count: 4 }]', device=0)
    with pytest.raises(RateLimitError, match='"resource1" is limited to 0 '):
        rl.admit([one])


def test_a_resource_named_both_global_and_per_device_is_refused():
    rl = limiter()
    rl.admit([claimant(rl, "a", 'resources [{ name: "resource2" global: true count: 2 }]')])
    local = claimant(rl, "b", 'resources [{ name: "resource2" count: 2 }]')
    with pytest.raises(RateLimitError) as info:
        rl.admit([local])
    assert info.value.message == (
        'Resource "resource2" is present as both global and device-specific resource in the '
        "model configuration."
    )


def test_a_group_asking_for_nothing_is_not_limited():
    rl = limiter()
    assert rl.claimant("m/m_0", ModelRateLimiter(priority=3), 0, lambda: None) is None
    parsed = text_format.Parse('resources [{ name: "R" count: 0 }]', ModelRateLimiter())
    assert rl.claimant("m/m_0", parsed, 0, lambda: None) is None


# -- turns -----------------------------------------------------------------------------------------


def run_turns(rl: RateLimiter, claimants: list[Claimant], turns: int) -> list[str]:
    """Everyone always has work: each finished turn asks again at once."""
    order: list[str] = []
    for c in claimants:
        rl.request(c)
    for _ in range(turns):
        running = [c for c in claimants if c.state == GRANTED]
        assert len(running) == 1, "one copy of R: one runs at a time"
        order.append(running[0].label)
        rl.release(running[0], executed=True, again=True)
    return order


def test_priority_two_gets_half_the_turns_of_priority_one():
    rl = limiter()
    one = claimant(rl, "one", 'resources [{ name: "R" count: 1 }] priority: 1')
    two = claimant(rl, "two", 'resources [{ name: "R" count: 1 }] priority: 2')
    rl.admit([one, two])
    order = run_turns(rl, [one, two], 300)
    assert order.count("one") == 200 and order.count("two") == 100


def test_equal_priorities_take_turns_and_priority_zero_counts_as_one():
    rl = limiter()
    a = claimant(rl, "a", 'resources [{ name: "R" count: 1 }]')
    b = claimant(rl, "b", 'resources [{ name: "R" count: 1 }] priority: 0')
    rl.admit([a, b])
    order = run_turns(rl, [a, b], 10)
    assert order == ["a", "b"] * 5


def test_a_model_loaded_late_gets_its_share_not_every_turn():
    rl = limiter()
    old = claimant(rl, "old", 'resources [{ name: "R" count: 1 }]')
    rl.admit([old])
    run_turns(rl, [old], 100)
    rl.release(old, executed=False)
    new = claimant(rl, "new", 'resources [{ name: "R" count: 1 }]')
    rl.admit([new])
    order = run_turns(rl, [old, new], 20)
    assert order.count("new") == 10


def test_a_turn_that_comes_later_is_announced_and_one_given_at_once_is_not():
    rl = limiter()
    told: list[str] = []
    a = claimant(rl, "a", 'resources [{ name: "R" count: 1 }]', told=told)
    b = claimant(rl, "b", 'resources [{ name: "R" count: 1 }]', told=told)
    rl.admit([a, b])
    assert rl.request(a) is True
    assert rl.request(b) is False
    assert told == []
    rl.release(a, executed=True)
    assert b.state == GRANTED and told == ["b"]


def test_a_large_waiter_is_not_starved_by_small_ones_but_other_devices_go_on():
    rl = limiter("R:4")
    small1 = claimant(rl, "small1", 'resources [{ name: "R" count: 1 }]')
    small2 = claimant(rl, "small2", 'resources [{ name: "R" count: 1 }]')
    big = claimant(rl, "big", 'resources [{ name: "R" count: 4 }]')
    other = claimant(rl, "other", 'resources [{ name: "R" count: 1 }]', device=1)
    rl.admit([small1, small2, big, other])
    assert rl.request(small1)
    assert not rl.request(big)  # 3 of 4 free
    assert not rl.request(small2)  # would fit, but waits behind big
    assert rl.request(other)  # device 1's R: nobody waits for it
    rl.release(small1, executed=True)
    assert big.state == GRANTED and small2.state != GRANTED
    assert rl.in_use((0, "r")) == 4
    rl.release(big, executed=True)
    assert small2.state == GRANTED


def test_global_resources_are_shared_across_devices():
    rl = limiter()
    d0 = claimant(rl, "d0", 'resources [{ name: "G" global: true count: 1 }]', device=0)
    d1 = claimant(rl, "d1", 'resources [{ name: "G" global: true count: 1 }]', device=1)
    rl.admit([d0, d1])
    assert rl.request(d0)
    assert not rl.request(d1)
    assert rl.in_use((GLOBAL, "g")) == 1


def test_a_removed_claimant_keeps_what_it_holds_until_its_batch_ends():
    rl = limiter()
    a = claimant(rl, "a", 'resources [{ name: "R" count: 1 }]')
    b = claimant(rl, "b", 'resources [{ name: "R" count: 1 }]')
    c = claimant(rl, "c", 'resources [{ name: "R" count: 1 }]')
    rl.admit([a, b, c])
    rl.request(a)
    rl.request(b)
    rl.request(c)
    rl.remove([a, b])  # a runs, b waits
    assert c.state != GRANTED and rl.in_use((0, "r")) == 1
    rl.release(a, executed=True, again=True)  # a's batch ends: it does not wait again
    assert c.state == GRANTED and a.state != GRANTED and rl.in_use((0, "r")) == 1
