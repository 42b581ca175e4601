"""A Python model's batch started from the event loop (PythonBackend.begin_requests): the loop
sends the work and reads the worker's reply itself, with real worker processes. The answers
must be those of execute_requests, failures included; a worker that dies mid-call leaves the
verdict to a thread, and a decoupled model never takes this way."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvloop

from backends.python.backend import PythonBackend
from protocol.errors import InternalError, InvalidArgument, Unavailable
from protocol.types import InferRequest
from tests.unit.backends.python.test_backend import (
    ADD_SUB,
    ADD_SUB_CONFIG,
    make_backend,
    pair,
    wait_healthy,
    write_model,
)


@pytest.fixture
def add_sub(tmp_path: Path) -> Iterator[PythonBackend]:
    config_text = ADD_SUB_CONFIG % ""
    backend = make_backend(write_model(tmp_path, "add_sub", ADD_SUB, config_text), config_text)
    backend.load()
    yield backend
    backend.unload()


def details(count: int) -> list[InferRequest]:
    return [InferRequest("add_sub") for _ in range(count)]


async def begun(backend: PythonBackend, requests: list[dict[str, np.ndarray]]):
    """What `done` receives, on the loop; the outcome of a callable run on a thread."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future = loop.create_future()
    assert backend.begin_requests(requests, details(len(requests)), answer.set_result)
    outcome = await asyncio.wait_for(answer, 10)
    if callable(outcome):
        return "thread", await asyncio.to_thread(outcome)
    return "loop", outcome


def run_on_uvloop(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` on a uvloop loop of its own (it makes a watched descriptor non-blocking,
    which the default loop does not)."""
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(work)
    finally:
        loop.close()


async def test_the_loop_gets_the_same_answers_as_execute_requests(add_sub) -> None:
    where, results = await begun(add_sub, [pair(1, 2), pair(10, 20, n=3)])
    assert where == "loop"
    assert np.array_equal(results[0]["OUTPUT0"], np.full((1, 4), 3, np.float32))
    assert np.array_equal(results[1]["OUTPUT0"], np.full((1, 3), 30, np.float32))
    big = np.random.default_rng(1).standard_normal((1, 500_000)).astype(np.float32)
    _, (grown,) = await begun(add_sub, [{"INPUT0": big, "INPUT1": big}])  # arenas grow
    assert np.array_equal(grown["OUTPUT0"], big + big)
    # the instance thread's way still works after the loop's, on the same worker
    thread_results = await asyncio.to_thread(add_sub.execute_requests, [pair(2, 2)])
    assert np.array_equal(thread_results[0]["OUTPUT0"], np.full((1, 4), 4, np.float32))


async def test_model_errors_and_a_raising_execute_fail_as_on_the_thread(add_sub) -> None:
    _, results = await begun(add_sub, [pair(1, 2), {"INPUT0": np.zeros((1, 2), np.float32)}])
    assert "OUTPUT0" in results[0]
    assert isinstance(results[1], InvalidArgument) and "INPUT1 missing" in results[1].message
    _, failed = await begun(add_sub, [pair(1, 2), pair(1, -1)])
    assert all(isinstance(r, InternalError) for r in failed)
    assert "ValueError: asked to fail" in failed[0].message
    assert add_sub.healthy() and add_sub.restarts == 0


async def test_a_worker_killed_mid_call_fails_the_batch_and_is_restarted(add_sub) -> None:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future = loop.create_future()
    assert add_sub.begin_requests([pair(1, -2), pair(1, 2)], details(2), answer.set_result)
    await asyncio.sleep(0.3)  # the first request now sleeps inside the worker
    os.kill(add_sub._worker.pid, signal.SIGKILL)  # type: ignore[union-attr]
    outcome = await asyncio.wait_for(answer, 5)
    assert callable(outcome)  # the verdict may wait: left to a thread
    results = await asyncio.to_thread(outcome)
    assert len(results) == 2 and all(isinstance(r, Unavailable) for r in results)
    assert "was killed by SIGKILL" in results[0].message
    await asyncio.to_thread(wait_healthy, add_sub)
    _, (after,) = await begun(add_sub, [pair(2, 3)])
    assert np.array_equal(after["OUTPUT0"], np.full((1, 4), 5, np.float32))


async def test_a_decoupled_model_and_a_stopped_one_take_the_thread(add_sub) -> None:
    never = asyncio.get_running_loop().create_future()
    add_sub.decoupled = True
    assert not add_sub.begin_requests([pair(1, 2)], details(1), never.set_result)
    add_sub.decoupled = False
    await asyncio.to_thread(add_sub.unload)
    assert not add_sub.begin_requests([pair(1, 2)], details(1), never.set_result)
    assert not never.done()


def test_under_uvloop_the_thread_way_and_finalize_still_work_after_the_loops(
    tmp_path: Path,
) -> None:
    """uvloop makes a watched fd non-blocking; the worker's socket must not stay so, or the
    next call from a thread (a batch, the finalize at unload) finds the worker 'dead'."""
    config_text = ADD_SUB_CONFIG % ""
    model_dir = write_model(tmp_path, "add_sub", ADD_SUB, config_text)
    backend = make_backend(model_dir, config_text)
    backend.load()

    async def main() -> None:
        for n in range(1, 6):
            _, (result,) = await begun(backend, [pair(n, n)])
            assert np.array_equal(result["OUTPUT0"], np.full((1, 4), 2 * n, np.float32))
            (threaded,) = await asyncio.to_thread(backend.execute_requests, [pair(n, 1)])
            assert np.array_equal(threaded["OUTPUT0"], np.full((1, 4), n + 1, np.float32))

    run_on_uvloop(main())
    assert backend.restarts == 0 and backend.healthy()
    backend.unload()
    assert (model_dir / "finalized").read_text() == "yes"


def test_under_uvloop_the_socket_is_watched_once_and_a_worker_dying_idle_is_survived(
    tmp_path: Path,
) -> None:
    """The loop watches the worker's socket from its first batch on, not per batch; a worker
    that dies between batches ends that watch (its end-of-file), and the restarted worker's
    socket, which may get the same descriptor number, is watched afresh and answers."""
    config_text = ADD_SUB_CONFIG % ""
    backend = make_backend(write_model(tmp_path, "add_sub", ADD_SUB, config_text), config_text)
    backend.load()

    async def main() -> None:
        worker = backend._worker
        assert worker is not None
        watches = set()
        for n in range(1, 4):
            _, (result,) = await begun(backend, [pair(n, n)])
            assert np.array_equal(result["OUTPUT0"], np.full((1, 4), 2 * n, np.float32))
            watches.add(id(worker._watch))
        assert len(watches) == 1 and worker._watch is not None
        os.kill(worker.pid, signal.SIGKILL)  # idle: no batch of the loop's in progress
        for _ in range(100):
            if worker._watch is None:
                break
            await asyncio.sleep(0.05)
        assert worker._watch is None  # the end-of-file ended it
        await asyncio.to_thread(wait_healthy, backend)
        assert backend._worker is not worker
        _, (after,) = await begun(backend, [pair(4, 5)])
        assert np.array_equal(after["OUTPUT0"], np.full((1, 4), 9, np.float32))

    run_on_uvloop(main())
    assert backend.restarts == 1 and backend.healthy()
    backend.unload()
