"""CPU seconds of a process and of its tree, read from /proc.

Why a module: the side-by-side, the handover cost, the frontend scaling and the A/B all charge
CPU to the processes they measure the same way; none of them should import another to do so.
"""

from __future__ import annotations

import os
from pathlib import Path


def process_tree(root: int) -> list[int]:
    """`root` and every process below it (from each process's parent in /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of `pid` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def task_ns(pid: int) -> int:
    """CPU time of all of a process's threads, in ns (schedstat: finer than clock ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except OSError:  # a thread that ended meanwhile
            continue
    return total


def voluntary_switches(pid: int) -> int:
    """Voluntary context switches of every thread of `pid` so far (0 once it is gone): each
    is a thread going to sleep (a GIL hand-over, a wait on a socket, a futex), the count that
    shows how many thread hops a request costs."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
                break
    return total


def tree_switches(root: int) -> int:
    """`voluntary_switches` of `root` and every process below it."""
    return sum(voluntary_switches(pid) for pid in process_tree(root))
