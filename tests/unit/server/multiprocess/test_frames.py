"""What a frontend link sends in one loop turn crosses as one frame (server/multiprocess/link.py),
and the model owner admits that frame's requests together (server/multiprocess/pool.py): the
frame put back together however the socket splits it, each answer reaching the client that asked,
and a frontend process dying mid-batch costing no other frontend's requests."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import numpy as np
import pytest

from protocol.errors import Unavailable
from protocol.types import InferRequest, InferResponse, Tensor
from scheduler import queue_scheduler
from server.multiprocess.arena import Arena
from server.multiprocess.link import BATCH, HEAD, FrontendLink
from server.multiprocess.pool import FrontendProcess
from server.multiprocess.remote_core import RemoteCore
from server.settings import ServerSettings


class _Capture:
    """A transport that keeps what is written."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.writes = 0

    def writelines(self, parts: list) -> None:
        self.writes += 1
        for part in parts:
            self.data += part


def _frames(wire: bytes) -> int:
    count, pos = 0, 0
    while pos < len(wire):
        pos += 4 + HEAD.unpack_from(wire, pos)[0]
        count += 1
    assert pos == len(wire)
    return count


@pytest.mark.parametrize("chunk", [1, 5, 64, 1 << 20])
def test_one_loop_turns_messages_cross_as_one_frame_however_the_socket_splits_it(
    chunk: int,
) -> None:
    frames: list[list[tuple]] = []
    sender = FrontendLink(Arena(1 << 16), Arena(1 << 16), lambda m: None, lambda e: None)
    receiver = FrontendLink(
        Arena(1 << 16), Arena(1 << 16), lambda m: None, lambda e: None, frames.append
    )
    capture = _Capture()
    sender.transport = capture  # type: ignore[assignment]
    loop = asyncio.new_event_loop()
    sender.loop = loop
    for index in range(5):
        sender.send((9, index, np.full(10 + index, index, dtype=np.int16)))
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    wire = bytes(capture.data)
    assert capture.writes == 1 and _frames(wire) == 1
    for start in range(0, len(wire), chunk):
        receiver.data_received(wire[start : start + chunk])
    (frame,) = frames  # delivered together, once whole
    assert [m[1] for m in frame] == [0, 1, 2, 3, 4]
    for index, message in enumerate(frame):
        np.testing.assert_array_equal(message[2], np.full(10 + index, index))


def test_a_message_that_cannot_be_pickled_does_not_take_the_others() -> None:
    got: list[tuple] = []
    sender = FrontendLink(Arena(1 << 16), Arena(1 << 16), lambda m: None, lambda e: None)
    receiver = FrontendLink(Arena(1 << 16), Arena(1 << 16), got.append, lambda e: None)
    capture = _Capture()
    sender.transport = capture  # type: ignore[assignment]
    loop = asyncio.new_event_loop()
    sender.loop = loop
    sender.send((9, 1, "first"))
    sender.send((9, 2, lambda: None))  # not picklable
    sender.send((9, 3, "third"))
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    receiver.data_received(bytes(capture.data))
    assert [(m[1], m[2]) for m in got] == [(1, "first"), (3, "third")]


def test_large_tensors_of_one_frame_share_one_region_of_the_arena() -> None:
    async def scenario() -> None:
        size = 1 << 20
        a_out, b_out = Arena(size), Arena(size)
        got: list[list[tuple]] = []
        a = FrontendLink(a_out, Arena(size, os.dup(b_out.fd)), lambda m: None, lambda e: None)
        b = FrontendLink(
            b_out, Arena(size, os.dup(a_out.fd)), lambda m: None, lambda e: None, got.append
        )
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        await loop.connect_accepted_socket(lambda: a, left)
        await loop.connect_accepted_socket(lambda: b, right)
        arrays = [np.full((64, 64), n, np.float32) for n in range(3)]  # 16 KiB each
        for n, data in enumerate(arrays):
            a.send((9, n, data))
        await asyncio.sleep(0)
        assert len(a.allocator.live) == 1 and a.allocator.used >= 3 * arrays[0].nbytes
        for _ in range(200):
            if got:
                break
            await asyncio.sleep(0.005)
        (frame,) = got
        for n, message in enumerate(frame):
            assert not message[2].flags.owndata  # views over the shared pages
            np.testing.assert_array_equal(message[2], arrays[n])
        del frame, message
        got.clear()
        for _ in range(200):  # the region comes back once the last view is gone
            if a.allocator.used == 0:
                break
            await asyncio.sleep(0.005)
        assert a.allocator.used == 0
        assert BATCH not in {m[0] for m in got}

    asyncio.run(scenario())


class _Core:
    """The owner's core as FrontendProcess calls it: each request's answer is given by hand;
    `grouped` records whether each was admitted inside an admission group."""

    def __init__(self) -> None:
        self.path = None
        self.waiting: list[tuple[InferRequest, Any, asyncio.Future]] = []
        self.grouped: list[bool] = []

    def infer_nowait(self, request: InferRequest, on_done: Any, *endpoint: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((request, on_done, future))
        self.grouped.append(queue_scheduler._GROUP.owing is not None)
        return future

    def answer(self, index: int) -> None:
        request, on_done, future = self.waiting[index]
        value = request.inputs[0].data * 10
        future.set_result(None)
        on_done(
            InferResponse("m", "1", request.id, [Tensor("Y", "INT32", value.shape, value)]), None
        )


async def _frontend(core: _Core, index: int) -> tuple[RemoteCore, FrontendProcess]:
    """A frontend process's RemoteCore and the owner's FrontendProcess, linked in this loop."""
    loop = asyncio.get_running_loop()
    size = 1 << 20
    to_owner, to_frontend = Arena(size), Arena(size)
    remote = RemoteCore(
        ServerSettings(),
        None,  # type: ignore[arg-type]  # no control calls here
        None,  # type: ignore[arg-type]
        loop,
        to_owner,
        Arena(size, os.dup(to_frontend.fd)),
    )
    remote.started = True
    owner = FrontendProcess(index, ServerSettings(), core)  # type: ignore[arg-type]
    owner.link = FrontendLink(
        to_frontend,
        Arena(size, os.dup(to_owner.fd)),
        owner._on_message,
        owner._on_lost,
        owner._on_frame,
    )
    here, there = socket.socketpair()
    await loop.connect_accepted_socket(lambda: owner.link, here)  # type: ignore[arg-type,return-value]
    await loop.connect_accepted_socket(lambda: remote.link, there)
    return remote, owner


def _ask(remote: RemoteCore, value: int) -> asyncio.Task:
    data = np.full(4, value, np.int32)
    request = InferRequest("m", "", f"req-{value}", [Tensor("X", "INT32", (4,), data)])
    return asyncio.ensure_future(remote.infer(request))


async def _until(condition: Any) -> None:
    for _ in range(400):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("not reached")


def test_a_frame_of_requests_is_admitted_together_and_each_answer_finds_its_client() -> None:
    async def scenario() -> None:
        core = _Core()
        remote, owner = await _frontend(core, 1)
        clients = [_ask(remote, value) for value in (1, 2, 3, 4)]
        await _until(lambda: len(core.waiting) == 4)
        assert core.grouped == [True] * 4  # one frame: one admission group
        for index in (2, 0, 3, 1):  # answered out of order, some in one turn
            core.answer(index)
        responses = await asyncio.gather(*clients)
        assert [r.id for r in responses] == ["req-1", "req-2", "req-3", "req-4"]
        assert [int(r.outputs[0].data[0]) for r in responses] == [10, 20, 30, 40]
        assert not owner.inflight and not remote._pending

    asyncio.run(scenario())


def test_a_frontend_dying_mid_batch_costs_the_other_frontend_nothing() -> None:
    async def scenario() -> None:
        core = _Core()
        first, first_owner = await _frontend(core, 1)
        second, second_owner = await _frontend(core, 2)
        kept = [_ask(first, value) for value in (1, 2)]
        doomed = [_ask(second, value) for value in (7, 8)]
        await _until(lambda: len(core.waiting) == 4)
        assert len(second_owner.inflight) == 2
        second.link.transport.abort()  # type: ignore[union-attr]  # the process died
        await _until(lambda: not second_owner.inflight)
        by_id = {request.id: n for n, (request, _, _) in enumerate(core.waiting)}
        assert all(core.waiting[by_id[f"req-{v}"]][2].cancelled() for v in (7, 8))
        for value in (1, 2):
            core.answer(by_id[f"req-{value}"])
        responses = await asyncio.gather(*kept)
        assert [int(r.outputs[0].data[0]) for r in responses] == [10, 20]
        for task in doomed:  # its own clients learn the owner is out of reach
            with pytest.raises(Unavailable):
                await task
        assert not first_owner.inflight

    asyncio.run(scenario())


def test_infer_nowait_from_a_frontend_process_answers_cancels_and_refuses() -> None:
    """RemoteCore.infer_nowait (the `threads` gRPC server's path in a frontend process): the
    owner's answer reaches `on_done`; a cancel of the returned future reaches the owner, which
    drops the request, and calls no `on_done`; once exiting it refuses at once."""

    async def scenario() -> None:
        core = _Core()
        remote, owner = await _frontend(core, 1)
        done: list[tuple[Any, Any]] = []

        def request(value: int) -> InferRequest:
            data = np.full(4, value, np.int32)
            return InferRequest("m", "", f"req-{value}", [Tensor("X", "INT32", (4,), data)])

        answered = remote.infer_nowait(request(1), lambda r, e: done.append((r, e)))
        dropped = remote.infer_nowait(request(2), lambda r, e: done.append((r, e)))
        assert answered is not None and dropped is not None
        await _until(lambda: len(core.waiting) == 2)
        dropped.cancel()
        await _until(lambda: core.waiting[1][2].cancelled())  # the owner dropped it
        core.answer(0)
        await _until(lambda: bool(done))
        response, error = done[0]
        assert error is None and response.id == "req-1"
        assert int(response.outputs[0].data[0]) == 10
        await _until(lambda: remote.inflight == 0)
        assert len(done) == 1 and not remote._pending and not owner.inflight

        remote.exiting = True
        assert remote.infer_nowait(request(3), lambda r, e: done.append((r, e))) is None
        assert done[1][0] is None and "exiting" in str(done[1][1]).lower()
        assert len(core.waiting) == 2  # never sent

    asyncio.run(scenario())
