"""bench/cpu_time.py: what the A/B studies charge to a server process."""

from __future__ import annotations

import os

from bench.cpu_time import task_ns


def test_task_ns_grows_with_the_work_of_the_process() -> None:
    before = task_ns(os.getpid())
    sum(range(2_000_000))
    assert task_ns(os.getpid()) > before > 0
