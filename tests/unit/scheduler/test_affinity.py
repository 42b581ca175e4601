"""Instance threads move onto the event loop's CPU while their batches are cheap, and back off
it when they are not; nothing moves when the loop is not pinned."""

from __future__ import annotations

import os
import threading

import pytest

from scheduler import affinity
from scheduler.affinity import COLOCATE_BELOW_NS, MOVE_AWAY_ABOVE_NS, SETTLE_JOBS, ThreadPlacement


def placement(target: int | None = 1) -> tuple[ThreadPlacement, list[set[int]]]:
    moves: list[set[int]] = []
    return ThreadPlacement(setter=moves.append, target=lambda: target), moves


def test_cheap_batches_move_the_thread_onto_the_loop_cpu_after_settling() -> None:
    place, moves = placement(target=1)
    for _ in range(SETTLE_JOBS - 1):
        place.job_done(COLOCATE_BELOW_NS // 4)
    assert moves == [] and not place.colocated  # not on the first few batches
    place.job_done(COLOCATE_BELOW_NS // 4)
    assert moves == [{1}] and place.colocated
    place.job_done(COLOCATE_BELOW_NS // 4)
    assert moves == [{1}]  # moved once, not per batch


def test_expensive_batches_never_move_the_thread() -> None:
    place, moves = placement()
    for _ in range(50):
        place.job_done(COLOCATE_BELOW_NS * 5)
    assert moves == [] and not place.colocated


def test_a_thread_whose_batches_grow_expensive_gets_every_cpu_back(monkeypatch) -> None:
    monkeypatch.setattr(affinity, "_process_cpus", frozenset({0, 1, 2}))
    place, moves = placement(target=0)
    for _ in range(SETTLE_JOBS):
        place.job_done(10_000)
    assert moves == [{0}]
    # between the two thresholds nothing changes (no flapping)
    for _ in range(20):
        place.job_done((COLOCATE_BELOW_NS + MOVE_AWAY_ABOVE_NS) // 2)
    assert moves == [{0}]
    for _ in range(20):
        place.job_done(MOVE_AWAY_ABOVE_NS * 3)
    assert moves == [{0}, {0, 1, 2}] and not place.colocated


def test_nothing_moves_while_the_loop_is_not_pinned() -> None:
    place, moves = placement(target=None)
    for _ in range(50):
        place.job_done(1_000)
    assert moves == []


@pytest.mark.skipif(
    not affinity.supported() or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux CPU affinity and two CPUs",
)
def test_pinning_the_loop_keeps_new_threads_off_its_cpu_only_until_released() -> None:
    """Threads inherit the CPU set of their creator: release_thread gives them the whole set
    back, so a model loaded later is not confined to the loop's CPU."""
    whole = os.sched_getaffinity(0)
    seen: dict[str, set[int]] = {}

    def child(release: bool) -> None:
        if release:
            affinity.release_thread()
        seen["released" if release else "inherited"] = os.sched_getaffinity(0)

    try:
        cpu = affinity.pin_event_loop()
        assert cpu in whole and os.sched_getaffinity(0) == {cpu}
        assert affinity.loop_cpu() == cpu
        for release in (False, True):
            thread = threading.Thread(target=child, args=(release,))
            thread.start()
            thread.join()
    finally:
        affinity.unpin_event_loop()
    assert seen == {"inherited": {cpu}, "released": whole}
    assert os.sched_getaffinity(0) == whole and affinity.loop_cpu() is None
