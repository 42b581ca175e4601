"""The server's threads and processes under Linux's SCHED_BATCH policy (`--thread-scheduling`),
and the interval after which a thread that wants the GIL makes its holder let go
(`--gil-switch-interval`).

Why: one request passes between threads that share the GIL (the event loop, grpcio's handler
and completion-queue threads, a Python model's instance thread) and processes (its worker).
Under the default policy a thread woken on a busy core preempts its waker at once; the waker
usually still holds the GIL, so the woken thread runs only to find it taken and sleep again,
and the waker's `sem_post` spans both switches: 64-70 % of the GIL-holding samples of a gRPC
request on one core (bench/FINDINGS.md sections 23 and 30). SCHED_BATCH threads are never
preempted by a wake-up of each other: the woken thread runs when its waker sleeps or its slice
ends, and then finds the GIL free. Nothing else changes: the same nice value, the same share
of the CPU against other processes; where cores are idle a woken thread runs on one of them
as before. The cost: a server thread woken while another process's thread runs on its core
no longer preempts that one either, so on a core shared with other busy programs a wake-up
may wait for the end of their slice (`--thread-scheduling normal` keeps the default).

Applied once at start, to every thread the process has; threads and processes made later
inherit it. A policy an operator set already (realtime, SCHED_IDLE) is left as it is.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

POLICIES = ("batch", "normal")  # the default: server/settings.py's THREAD_SCHEDULING


def _threads() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # no /proc: the calling thread (the only one this early)


def apply_thread_scheduling(policy: str) -> str:
    """Put the process's threads under `policy`; say what they run under now."""
    if policy not in POLICIES:
        raise ValueError(f"unknown thread scheduling {policy!r} (one of {', '.join(POLICIES)})")
    setter = getattr(os, "sched_setscheduler", None)
    batch = getattr(os, "SCHED_BATCH", None)
    if setter is None or batch is None:
        return "normal (SCHED_BATCH is Linux's; this system has none)"
    if policy == "normal":
        return "normal"
    if os.sched_getscheduler(0) not in (os.SCHED_OTHER, batch):
        return "left as set (not SCHED_OTHER)"
    for thread in _threads():
        try:
            setter(thread, batch, os.sched_param(0))
        except ProcessLookupError:
            continue  # a thread that ended since the list was read
        except OSError as exc:  # a sandbox that forbids it: serve anyway, on the default
            log.warning("--thread-scheduling batch not applied (%s): threads stay SCHED_OTHER", exc)
            return f"normal (SCHED_BATCH refused: {exc.strerror or exc})"
    return "batch"


def apply_switch_interval(microseconds: int) -> None:
    """Python's switch interval for every thread of this process (children forked later keep
    it). Why it is a setting: an event loop that is never idle gives the GIL up only when a
    waiting thread asks, after this interval; a model instance's thread back from its model
    (ONNX Runtime runs without the GIL) needs it to start the next batch, so under load the
    instance idles for up to this long per batch (bench/FINDINGS.md 39)."""
    sys.setswitchinterval(microseconds / 1e6)
