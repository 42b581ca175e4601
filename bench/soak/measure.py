"""What the soak (bench/soak/run.py) measures: the server's process tree (the server and its Python
workers, found through /proc/*/stat), sampled for RSS, descriptors, threads, memfd arenas and
/dev/shm; medians, trends, and the verdicts on growth, on /dev/shm entries left behind and on
processes that outlive the server."""

from __future__ import annotations

import os
import re
import signal
import statistics
import time
from dataclasses import dataclass

from harness.serverproc import ServerProcess

WORKER_MARK = b"backends.python.worker.main"
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


# ----- the process tree --------------------------------------------------------------------


def _stat(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None


def tree_pids(root: int) -> list[int]:
    """`root` and all its descendants (from /proc/*/stat's ppid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[0] != b"Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, ()))
    return sorted(pids)


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the pid, its identity, so a pid
    reused by another process is never taken for one of ours. None once it is gone."""
    fields = _stat(pid)
    return None if fields is None or fields[0] == b"Z" else int(fields[19])


def tree_identities(root: int) -> set[tuple[int, int]]:
    return {(pid, start) for pid in tree_pids(root) if (start := start_time(pid)) is not None}


def worker_pids(server_pid: int) -> list[int]:
    found = []
    for pid in tree_pids(server_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if WORKER_MARK in handle.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def parent_pid(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[1]) if fields is not None else 0


def process_age(pid: int) -> float:
    fields = _stat(pid)
    if fields is None:
        return 0.0
    start_ticks = int(fields[19])
    with open("/proc/uptime") as handle:
        uptime = float(handle.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def sample_tree(server_pid: int) -> dict:
    """RSS (kB, summed over the tree), descriptors, threads, memfd arenas (distinct inodes open
    or mapped), /dev/shm entries open or mapped by the tree, and processes."""
    rss = fds = threads = procs = 0
    per_process: dict[int, int] = {}
    memfds: set[int] = set()
    shm_held: set[str] = set()
    for pid in tree_pids(server_pid):
        try:
            with open(f"/proc/{pid}/statm") as handle:
                per_process[pid] = int(handle.read().split()[1]) * PAGE_KB
                rss += per_process[pid]
            with open(f"/proc/{pid}/status") as handle:
                found = re.search(r"^Threads:\s+(\d+)", handle.read(), re.M)
                if found is not None:  # absent once the process is a zombie
                    threads += int(found.group(1))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                fds += 1
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("/memfd:"):
                    try:
                        memfds.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
                    except OSError:
                        pass
                elif target.startswith("/dev/shm/"):
                    shm_held.add(target)
            with open(f"/proc/{pid}/maps") as handle:
                for line in handle:
                    parts = line.split(None, 5)
                    if len(parts) == 6:
                        path = parts[5].strip()
                        if path.startswith("/memfd:"):
                            memfds.add(int(parts[4]))
                        elif path.startswith("/dev/shm/"):
                            shm_held.add(path)
            procs += 1
        except (OSError, AttributeError):
            continue  # the process went while we looked (a killed worker)
    return {
        "time": time.time(),
        "rss_kb": rss,
        "fds": fds,
        "threads": threads,
        "memfds": len(memfds),
        "shm_held": len(shm_held),
        "processes": procs,
        "shm_entries": len(shm_entries()),
        "server_rss_kb": per_process.get(server_pid, 0),
        "rss_kb_by_pid": per_process,
    }


# ----- medians, trends and verdicts --------------------------------------------------------


@dataclass
class Limits:
    rss_mb: float
    rss_fraction: float
    fds: int
    threads: int
    memfds: int
    shm: int


def median_sample(samples: list[dict]) -> dict:
    keys = [k for k in samples[0] if k not in ("time", "rss_kb_by_pid")]
    return {k: statistics.median(s[k] for s in samples) for k in keys}


def settle_and_sample(server: ServerProcess, seconds: float, count: int = 3) -> list[dict]:
    time.sleep(seconds)
    samples = []
    for i in range(count):
        if i:
            time.sleep(1.0)
        samples.append(sample_tree(server.pid))
    return samples


def trend_per_minute(samples: list[dict], key: str) -> float:
    if len(samples) < 3:
        return 0.0
    t0 = samples[0]["time"]
    xs = [(s["time"] - t0) / 60 for s in samples]
    ys = [s[key] for s in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=False)) / den if den else 0.0


def verdict(growth: float, limit: float, unit: str = "", extra: dict | None = None) -> dict:
    return {
        "pass": growth <= limit,
        "growth": growth,
        "limit": limit,
        "unit": unit,
        **(extra or {}),
    }


def new_shm_entries(before: set[str]) -> tuple[list[str], list[str]]:
    """/dev/shm entries made during the run and still there once the server has stopped: those
    no process holds (a leaked name), and those some other process on the machine has open or
    mapped (not the server's: its whole tree is gone by now)."""
    new = shm_entries() - before
    held: set[str] = set()
    if new:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/maps") as handle:
                    text = handle.read()
                names = [
                    os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")
                ]
            except OSError:
                continue
            for name in new - held:
                if f"/dev/shm/{name}" in text or f"/dev/shm/{name}" in names:
                    held.add(name)
    return sorted(new - held), sorted(held)


def left_behind(processes: set[tuple[int, int]]) -> list[int]:
    """Processes of the tree still running after the server stopped (given 5 s to go); each is
    killed, by pid and only while its start time still says it is ours, so nothing is left
    behind even when the verdict fails."""
    deadline = time.monotonic() + 5
    left = [pid for pid, start in processes if start_time(pid) == start]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [pid for pid, start in processes if start_time(pid) == start]
    for pid, start in processes:
        if start_time(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return sorted(left)
