"""server/http/parser_pool.py: the HTTP parser processes run jobs off the server's GIL, a process
that dies fails only its own job and is started again, and every process ends with its owner,
SIGKILL included (issue 28 item 8: multiprocessing's forkserver, its worker and its resource
tracker used to outlive a SIGKILLed server). Every test kills by pid what it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from harness.procutil import descendants, kill_quietly, wait_for, wait_gone
from protocol.errors import InvalidArgument
from server.http.parser_pool import ParserPool
from server.http.parsers import parse_json_document

ROOT = Path(__file__).resolve().parents[4]

OWNER = """
import sys, time
from server.http.parser_pool import ParserPool

pool = ParserPool(2, 0, "server.http.parsers")
pool.start()
print(" ".join(map(str, pool.pids())), flush=True)
time.sleep(120)
"""


@pytest.fixture
def pool() -> Iterator[ParserPool]:
    pool = ParserPool(1, 0, "server.http.parsers")
    pool.start()
    started = pool.pids()
    yield pool
    pool.close()
    for pid in started + pool.pids():
        if not wait_gone(pid, 10):
            kill_quietly(pid)


def test_a_job_runs_in_a_parser_process_and_its_error_comes_back(pool: ParserPool) -> None:
    assert pool.submit(os.getpid).result(30) == pool.pids()[0] != os.getpid()
    assert pool.submit(parse_json_document, b'{"a": [1]}', None, 100, 10).result(30) == {"a": [1]}
    with pytest.raises(InvalidArgument, match="failed to parse the request JSON buffer"):
        pool.submit(parse_json_document, b'{"a": tru', None, 100, 10).result(30)


def test_a_process_that_dies_fails_its_job_alone_and_is_started_again(pool: ParserPool) -> None:
    (first,) = pool.pids()
    running = pool.submit(time.sleep, 60)
    time.sleep(0.3)  # the job is in the process now
    os.kill(first, signal.SIGKILL)
    with pytest.raises(BrokenProcessPool):
        running.result(30)
    second = pool.submit(os.getpid).result(30)
    assert second != first and pool.pids() == [second]


def test_close_cancels_what_waits_and_ends_the_processes(pool: ParserPool) -> None:
    (pid,) = pool.pids()
    busy = pool.submit(time.sleep, 0.5)
    wait_for(busy.running, "the first job to start", 10)
    waiting = pool.submit(os.getpid)
    pool.close()
    assert waiting.cancelled()
    busy.result(30)
    assert wait_gone(pid, 10)
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(os.getpid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_parser_processes_end_when_their_owner_is_sigkilled() -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
    )
    pids: list[int] = []
    try:
        pids = [int(pid) for pid in owner.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(pids) == 2
        wait_for(lambda: set(pids) <= descendants(owner.pid), "the parser processes", 10)
        everything = descendants(owner.pid)
        owner.kill()
        owner.wait(10)
        left = [pid for pid in everything if not wait_gone(pid, 10)]
        assert not left, f"processes outlived their SIGKILLed owner: {left}"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
        for pid in pids:
            kill_quietly(pid)
