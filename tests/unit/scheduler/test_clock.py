"""scheduler/clock.py MonotonicClock: sub-millisecond moments go to the fine timer thread.

No timing is asserted beyond "never early" (a correctness rule: a queue delay must not end
before it is due); how late a timer fires is the benchmark's business."""

from __future__ import annotations

import asyncio

from scheduler.clock import FINE_TIMER_LIMIT_NS, MonotonicClock


async def test_sub_millisecond_timers_fire_in_order_never_early_and_on_the_loop() -> None:
    clock = MonotonicClock()
    loop = asyncio.get_running_loop()
    fired: list[tuple[str, int, bool]] = []
    done = asyncio.Event()
    start = clock.now_ns()

    def note(label: str, due: int) -> None:
        fired.append((label, clock.now_ns() - due, asyncio.get_running_loop() is loop))
        if len(fired) == 3:
            done.set()

    for label, offset in (("c", 600_000), ("a", 100_000), ("b", 300_000)):
        clock.call_at(start + offset, lambda label=label, due=start + offset: note(label, due))
    await asyncio.wait_for(done.wait(), 5)
    assert [label for label, _, _ in fired] == ["a", "b", "c"]
    assert all(late >= 0 and on_loop for _, late, on_loop in fired)


async def test_a_cancelled_fine_timer_never_fires() -> None:
    clock = MonotonicClock()
    fired: list[str] = []
    now = clock.now_ns()
    clock.call_at(now + 200_000, lambda: fired.append("cancelled")).cancel()
    later = asyncio.Event()
    clock.call_at(now + 400_000, later.set)
    await asyncio.wait_for(later.wait(), 5)
    await asyncio.sleep(0.01)
    assert fired == []


async def test_far_moments_and_past_moments_use_the_loop() -> None:
    clock = MonotonicClock()
    past = asyncio.Event()
    clock.call_at(clock.now_ns() - 1, past.set)
    await asyncio.wait_for(past.wait(), 5)
    far = clock.call_at(clock.now_ns() + FINE_TIMER_LIMIT_NS * 10, lambda: None)
    assert isinstance(far, asyncio.TimerHandle)
    far.cancel()
