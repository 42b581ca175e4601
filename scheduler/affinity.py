"""Which CPUs the event loop and the instance threads run on (Linux; elsewhere nothing moves).

Handing a batch to an instance thread that sleeps on another CPU, and the result back, each cost
an inter-processor wake-up: about 40-50 µs each way on the 2-vCPU machine the benchmark runs on,
against 5-15 µs when both threads share a CPU (bench/FINDINGS.md section 7). For a model whose
jobs cost its instance thread little CPU (`simple`, a small MLP, most NPU graphs, whose thread
mostly waits for the device), those two hops are a large part of what the server adds, and
the other CPU is better left to everything else. So, once the server is up:

- the event loop's thread stays on the CPU it is running on (`pin_event_loop`);
- an instance thread whose recent jobs cost it less than COLOCATE_BELOW_NS of CPU each moves onto
  that CPU, where a hand-over is a context switch; one whose jobs cost more than
  MOVE_AWAY_ABOVE_NS (real compute on the thread) keeps, or gets back, every CPU the process
  may use (`ThreadPlacement`). The gap between the two avoids flapping.

Threads and processes inherit the CPU set of the thread that starts them, so instance threads
and the loop's default executor start from the process's whole set (`release_thread`): a model
loaded later, an ONNX Runtime pool or a Python model's worker process is never confined to the
loop's CPU by inheritance. `--colocate-cheap-instances=false` turns all of this off.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

COLOCATE_BELOW_NS = 200_000  # thread CPU per job, smoothed
MOVE_AWAY_ABOVE_NS = 1_000_000
SETTLE_JOBS = 8  # jobs seen before an instance first moves
_SMOOTHING = 0.2  # weight of the newest job in the running average

_process_cpus: frozenset[int] | None = None  # the whole set, saved before the loop is pinned
_loop_cpu: int | None = None


def supported() -> bool:
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def loop_cpu() -> int | None:
    """The CPU the event loop is pinned to, or None when nothing is pinned."""
    return _loop_cpu


def pin_event_loop(loop: object = None) -> int | None:
    """Keep the calling (event loop) thread on its current CPU; None when that cannot help
    (unsupported, or the process may use a single CPU). Call once, on the loop's thread."""
    global _process_cpus, _loop_cpu
    if not supported():
        return None
    cpus = frozenset(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    current = _current_cpu()
    cpu = current if current in cpus else min(cpus)
    _process_cpus = cpus
    os.sched_setaffinity(0, {cpu})
    _loop_cpu = cpu
    if loop is not None and hasattr(loop, "set_default_executor"):
        # asyncio.to_thread work (repository reads, polling) must not inherit the pin.
        loop.set_default_executor(
            ThreadPoolExecutor(initializer=release_thread, thread_name_prefix="asyncio")
        )
    log.info(
        "event loop pinned to CPU %d; instances that cost their thread under %d µs of CPU "
        "per batch share it",
        cpu,
        COLOCATE_BELOW_NS // 1000,
    )
    return cpu


def unpin_event_loop() -> None:
    """Undo pin_event_loop (tests, or a server that stops and starts in one process)."""
    global _process_cpus, _loop_cpu
    if _process_cpus is not None:
        os.sched_setaffinity(0, _process_cpus)
    _process_cpus = _loop_cpu = None


def release_thread() -> None:
    """Give the calling thread the process's whole CPU set (it inherited the loop's pin)."""
    if _process_cpus is not None:
        os.sched_setaffinity(0, _process_cpus)


def _current_cpu() -> int | None:
    """The CPU the calling thread last ran on (field 39 of /proc/thread-self/stat)."""
    try:
        with open("/proc/thread-self/stat", "rb") as handle:
            stat = handle.read()
        return int(stat.rsplit(b")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


class ThreadPlacement:
    """Moves one instance thread onto the loop's CPU while its jobs are cheap, and off it when
    they are not. Lives on that thread: `started()` once, `job_done(cpu_ns)` after each job."""

    def __init__(
        self,
        setter: Callable[[set[int]], None] | None = None,
        target: Callable[[], int | None] = loop_cpu,
    ) -> None:
        self._set = setter or (lambda cpus: os.sched_setaffinity(0, cpus))
        self._target = target
        self._average: float | None = None
        self._jobs = 0
        self.colocated = False

    def started(self) -> None:
        release_thread()

    def job_done(self, cpu_ns: int) -> None:
        self._jobs += 1
        average = (
            cpu_ns
            if self._average is None
            else self._average + _SMOOTHING * (cpu_ns - self._average)
        )
        self._average = average
        cpu = self._target()
        if cpu is None:
            return
        if not self.colocated and self._jobs >= SETTLE_JOBS and average < COLOCATE_BELOW_NS:
            self._move({cpu}, True)
        elif self.colocated and average > MOVE_AWAY_ABOVE_NS:
            self._move(set(_process_cpus or ()), False)

    def _move(self, cpus: set[int], colocated: bool) -> None:
        if not cpus:
            return
        try:
            self._set(cpus)
        except OSError as exc:  # a CPU set changed under us (cgroup): stay where we are
            log.debug("could not move an instance thread to %s: %s", sorted(cpus), exc)
            return
        self.colocated = colocated
