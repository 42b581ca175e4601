"""Process and waiting helpers for tests that start servers or model workers and must leave
nothing behind: whether a pid has stopped running, waiting for that (or for anything) with a
deadline, killing by pid what a test left running, and which processes of a server hold its
connections (--frontend-processes)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path


def gone(pid: int) -> bool:
    """No such process, or a zombie (it has stopped running; its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    """Whether `pid` stopped running within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def kill_quietly(pid: int) -> None:
    """SIGKILL `pid` if it still exists."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_for(
    predicate: Callable[[], bool], what: str, timeout: float = 30.0, interval: float = 0.05
) -> None:
    """Poll `predicate` until it holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"gave up waiting for {what}")


def frontend_children(server_pid: int) -> list[int]:
    """Pids of a server's frontend processes (--frontend-processes)."""
    return children_running(server_pid, b"server.multiprocess.child")


def children_running(server_pid: int, marker: bytes) -> list[int]:
    """Pids of a server's child processes whose command line holds `marker` (a module name:
    b"npu.executor.main" finds the NPU executors)."""
    children = []
    for task in Path(f"/proc/{server_pid}/task").iterdir():
        try:
            pids = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        for pid in pids:
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                    children.append(int(pid))
            except FileNotFoundError:
                pass
    return children


def connection_owners(port: int) -> dict[int, int]:
    """pid -> established server-side TCP connections on local `port` that pid holds."""
    owners: dict[int, int] = {}
    for pid in connection_peers(port).values():
        owners[pid] = owners.get(pid, 0) + 1
    return owners


def connection_peers(port: int) -> dict[int, int]:
    """The client's port -> the pid holding the server side, for connections to local `port`."""
    peers = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                peers[fields[9]] = int(fields[2].rsplit(":", 1)[1], 16)
    found: dict[int, int] = {}
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            for fd in (pid_dir / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in peers:
                    found[peers[target[8:-1]]] = int(pid_dir.name)
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return found


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now running (zombies included)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        parents[int(entry.name)] = int(stat.rsplit(b")", 1)[1].split()[1])
    return parents


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (children, theirs, ...), not `pid` itself."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def marked(name: str, value: str) -> set[int]:
    """Running processes whose environment has `name=value`: a server's processes that may have
    been re-parented (orphans go to PID 1 or a subreaper), found by what they inherited."""
    needle = f"{name}={value}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0") and not gone(
                int(entry.name)
            ):
                found.add(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def command_line(pid: int) -> str:
    """A process's command line, for messages ("?" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return "?"
