"""The hand-over of `--grpc-server threads` (server/grpc/threaded.py): calls submitted from
handler threads all run on the loop and come back to their own thread; a burst of arrivals
wakes the loop once; a cancel from grpc's side ends a call that would never finish."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import pytest

from server.cli import settings_from_args
from server.grpc.loop_bridge import LoopBridge, LoopCall


class _Context:
    """The part of grpc.ServicerContext the bridge uses: the end-of-call callbacks."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def add_callback(self, callback: Any) -> bool:
        self.callbacks.append(callback)
        return True


def test_each_thread_gets_its_own_answer_and_a_burst_wakes_the_loop_once() -> None:
    async def main() -> tuple[list[Any], int]:
        loop = asyncio.get_running_loop()
        bridge = LoopBridge(loop)
        drains = 0
        drain = bridge._drain

        def counted() -> None:
            nonlocal drains
            drains += 1
            drain()

        bridge._drain = counted  # type: ignore[method-assign]

        async def double(value: int) -> int:
            await asyncio.sleep(0)
            return 2 * value

        calls = [LoopCall(functools.partial(double, v)) for v in range(20)]
        for call in calls:  # all arrive before the loop runs again: one burst
            bridge.submit(call)
        answers = await asyncio.gather(*(asyncio.to_thread(call.wait) for call in calls))
        return answers, drains

    answers, drains = asyncio.run(main())
    assert answers == [2 * v for v in range(20)]
    assert drains == 1


def test_calls_from_many_threads_all_come_back() -> None:
    async def main() -> list[Any]:
        bridge = LoopBridge(asyncio.get_running_loop())

        async def echo(value: int) -> int:
            return value

        def client(value: int) -> Any:
            return bridge.run(lambda: echo(value), _Context())

        return await asyncio.gather(*(asyncio.to_thread(client, v) for v in range(50)))

    assert asyncio.run(main()) == list(range(50))


def test_a_cancel_from_grpc_ends_a_call_that_would_never_finish() -> None:
    async def main() -> None:
        bridge = LoopBridge(asyncio.get_running_loop())
        context = _Context()
        started = threading.Event()

        async def forever() -> None:
            started.set()
            await asyncio.Event().wait()

        waiting = asyncio.ensure_future(asyncio.to_thread(bridge.run, lambda: forever(), context))
        await asyncio.to_thread(started.wait, 5)
        for callback in context.callbacks:  # grpc calls them when the RPC ends (a cancel)
            callback()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, 5)

    asyncio.run(main())


def test_the_grpc_server_flags() -> None:
    default = settings_from_args(["--model-repository", "/tmp"])
    assert (default.grpc_server, default.grpc_threads, default.grpc_thread_streams) == (
        "threads",
        None,  # one for each call --grpc-max-concurrent-rpcs admits
        256,
    )
    assert default.grpc_max_concurrent_rpcs == 1024
    assert default.grpc_message_timeout_ms == 60_000
    given = settings_from_args(
        [
            "--model-repository",
            "/tmp",
            "--grpc-server",
            "threads",
            "--grpc-threads",
            "8",
            "--grpc-thread-streams",
            "2",
            "--grpc-max-concurrent-rpcs",
            "16",
            "--grpc-message-timeout",
            "0",
        ]
    )
    assert (given.grpc_server, given.grpc_threads, given.grpc_thread_streams) == ("threads", 8, 2)
    assert given.grpc_max_concurrent_rpcs == 16
    assert given.grpc_message_timeout_ms == 0
    for bad in (["--grpc-server", "sync"], ["--grpc-threads", "0"]):
        with pytest.raises(SystemExit):
            settings_from_args(["--model-repository", "/tmp", *bad])
