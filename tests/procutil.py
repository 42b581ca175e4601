"""Process and waiting helpers for tests that start servers or model workers and must leave
nothing behind: whether a pid has stopped running, waiting for that (or for anything) with a
deadline, and killing by pid what a test left running.

Imported like serverproc (tests/conftest.py puts this folder on sys.path)."""
from __future__ import annotations

import os
import signal
import time
from typing import Callable


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


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0,
             interval: float = 0.05) -> None:
    """Poll `predicate` until it holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"gave up waiting for {what}")
