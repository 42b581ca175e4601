"""The frontend link (server/multiprocess/link.py, server/multiprocess/arena.py): messages with
numpy tensors between two ends in one process, through shared memory or inline, and the ring's
bookkeeping."""

from __future__ import annotations

import asyncio
import gc
import os
import socket

import numpy as np
import pytest

from protocol.errors import Overloaded
from protocol.types import InferRequest, Tensor
from server.multiprocess.arena import ALIGN, Arena, RingAllocator
from server.multiprocess.link import SHM_MIN_BYTES, FrontendLink


def test_ring_hands_out_aligned_regions_in_order_and_wraps() -> None:
    ring = RingAllocator(1024)
    first, second = ring.allocate(100), ring.allocate(300)
    assert (first, second) == (0, 128)
    assert ring.allocate(700) is None  # 448 + 704 > 1024, and nothing before the oldest
    ring.release(first)
    fourth = ring.allocate(64)
    assert fourth == 448  # after the head, not in the space the oldest freed
    third = ring.allocate(100)
    assert third == 512
    ring.release(second)
    ring.release(third)  # the oldest live region is now `fourth`, at 448
    assert ring.allocate(400) == 0  # 640 + 448 > 1024: wraps in front of 448
    assert ring.allocate(1) is None  # head (448) met the oldest: full


def test_ring_reclaims_from_the_oldest_region_whatever_order_they_come_back() -> None:
    ring = RingAllocator(4 * ALIGN)
    regions = [ring.allocate(ALIGN) for _ in range(4)]
    assert regions == [0, ALIGN, 2 * ALIGN, 3 * ALIGN]
    assert ring.allocate(1) is None  # full
    ring.release(regions[2])
    ring.release(regions[1])
    assert ring.allocate(1) is None  # the oldest (0) still holds everything after it
    ring.release(regions[0])  # now 0, 1 and 2 all come back at once
    assert ring.used == ALIGN
    assert ring.allocate(2 * ALIGN) == 0  # wrapped in front of region 3
    assert ring.allocate(ALIGN) == 2 * ALIGN
    assert ring.allocate(1) is None
    ring.release(999)  # unknown: ignored


def test_ring_refuses_what_can_never_fit() -> None:
    assert RingAllocator(256).allocate(257) is None


class _Pair:
    """Two ends of one link, as the owner and a frontend process hold them."""

    def __init__(self, arena_bytes: int) -> None:
        self.received: dict[str, list] = {"a": [], "b": []}
        a_out, b_out = Arena(arena_bytes), Arena(arena_bytes)
        # Each end maps the other's outgoing arena through its own descriptor, as a child does.
        a_in = Arena(arena_bytes, os.dup(b_out.fd))
        b_in = Arena(arena_bytes, os.dup(a_out.fd))
        self.a = FrontendLink(a_out, a_in, self.received["a"].append, lambda exc: None)
        self.b = FrontendLink(b_out, b_in, self.received["b"].append, lambda exc: None)

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        await loop.connect_accepted_socket(lambda: self.a, left)
        await loop.connect_accepted_socket(lambda: self.b, right)

    async def until(self, side: str, count: int) -> list:
        for _ in range(500):
            if len(self.received[side]) >= count:
                return self.received[side]
            await asyncio.sleep(0.005)
        raise AssertionError(f"{side} got {len(self.received[side])} messages, not {count}")


def _request(data: np.ndarray) -> InferRequest:
    return InferRequest(
        "m", "", "r1", [Tensor("INPUT", "FP32", data.shape, data)], parameters={"k": 1}
    )


def test_large_tensors_cross_through_shared_memory_and_their_space_comes_back() -> None:
    async def scenario() -> None:
        pair = _Pair(1 << 20)
        await pair.connect()
        data = np.arange(64 * 1024, dtype=np.float32).reshape(256, 256)  # 256 KiB
        pair.a.send((1, 7, _request(data)))
        assert pair.a.allocator.used == 0  # queued: the frame is made at the end of the turn
        await asyncio.sleep(0)
        assert pair.a.allocator.used >= data.nbytes  # it went into a's arena
        (message,) = await pair.until("b", 1)
        tensor = message[2].inputs[0].data
        np.testing.assert_array_equal(tensor, data)
        assert not tensor.flags.owndata  # a view over the shared pages, not a copy
        assert message[2].parameters == {"k": 1} and message[1] == 7
        del message, tensor
        pair.received["b"].clear()
        gc.collect()
        for _ in range(200):  # b tells a once the last view is gone
            await asyncio.sleep(0.005)
            if pair.a.allocator.used == 0:
                break
        assert pair.a.allocator.used == 0

    asyncio.run(scenario())


def test_small_messages_and_tensors_too_big_for_the_arena_travel_inline() -> None:
    async def scenario() -> None:
        pair = _Pair(64 * 1024)
        await pair.connect()
        small = np.arange(16, dtype=np.int32)
        big = np.random.default_rng(0).random((300, 300)).astype(np.float32)  # 351 KiB
        assert small.nbytes < SHM_MIN_BYTES
        pair.b.send((3, 1, _request(small)))
        pair.b.send((3, 2, _request(big)))
        pair.b.send((4, 3, Overloaded("queue full", retry_after=7)))
        messages = await pair.until("a", 3)
        assert pair.b.allocator.used == 0  # nothing went through shared memory
        np.testing.assert_array_equal(messages[0][2].inputs[0].data, small)
        np.testing.assert_array_equal(messages[1][2].inputs[0].data, big)
        error = messages[2][2]
        assert isinstance(error, Overloaded) and error.retry_after == 7
        assert error.message == "queue full"

    asyncio.run(scenario())


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_frames_split_anywhere_by_the_socket_are_put_back_together(chunk: int) -> None:
    got: list = []
    sender = FrontendLink(Arena(1 << 16), Arena(1 << 16), lambda m: None, lambda e: None)
    receiver = FrontendLink(Arena(1 << 16), Arena(1 << 16), got.append, lambda e: None)

    class _Capture:
        def __init__(self) -> None:
            self.data = bytearray()

        def write(self, data: bytes) -> None:
            self.data += data

        def writelines(self, parts: list) -> None:
            for part in parts:
                self.data += part

    capture = _Capture()
    sender.transport = capture  # type: ignore[assignment]
    loop = asyncio.new_event_loop()
    sender.loop = loop
    for index in range(3):
        sender.send((9, index, np.full(100 + index, index, dtype=np.int64)))
    assert not capture.data  # written once, at the end of the loop turn
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    wire = bytes(capture.data)
    for start in range(0, len(wire), chunk):
        receiver.data_received(wire[start : start + chunk])
    assert [m[1] for m in got] == [0, 1, 2]
    for index, message in enumerate(got):
        np.testing.assert_array_equal(message[2], np.full(100 + index, index))


def test_requests_and_responses_survive_the_tuple_codec() -> None:
    from protocol.link_codec import pack_request, pack_response, unpack_request, unpack_response
    from protocol.types import InferResponse, RequestedOutput

    words = np.array([b"a", b"\x00bc"], dtype=object)
    request = InferRequest(
        "m",
        "2",
        "id-1",
        [
            Tensor("X", "FP32", (1, 3), np.ones((1, 3), np.float32)),
            Tensor("W", "BYTES", (2,), words, {"binary_data_size": 9}),
        ],
        [RequestedOutput("Y", True, 3, {"k": 1}), RequestedOutput("Z")],
        {"priority": 2, "custom": "x"},
    )
    back = unpack_request(pack_request(request))
    assert (back.model_name, back.model_version, back.id) == ("m", "2", "id-1")
    assert back.arrival_ns == request.arrival_ns and back.parameters == request.parameters
    assert [t.name for t in back.inputs] == ["X", "W"]
    assert back.inputs[1].parameters == {"binary_data_size": 9}
    assert back.inputs[0].parameters == {}
    assert list(back.inputs[1].data) == [b"a", b"\x00bc"]
    assert back.outputs == request.outputs
    assert unpack_request(pack_request(InferRequest("m"))).outputs is None
    response = InferResponse(
        "m", "2", "id-1", [Tensor("Y", "INT64", (2,), np.arange(2))], {"sequence_end": True}
    )
    again = unpack_response(pack_response(response))
    assert again.parameters == {"sequence_end": True} and again.outputs[0].shape == (2,)
    np.testing.assert_array_equal(again.outputs[0].data, np.arange(2))


def test_tensor_data_of_any_layout_and_size_comes_back_equal() -> None:
    from protocol.link_codec import pack_response, unpack_response
    from protocol.types import InferResponse

    arrays = [
        np.arange(12, dtype=np.float64).reshape(3, 4).T,  # not contiguous
        np.zeros((0, 5), np.int8),
        np.array([True, False]),
        np.float16([1.5]),
    ]
    response = InferResponse(
        "m", "1", "", [Tensor(f"T{i}", "X", a.shape, a) for i, a in enumerate(arrays)]
    )
    for original, tensor in zip(
        arrays, unpack_response(pack_response(response)).outputs, strict=False
    ):
        assert tensor.data.dtype == original.dtype and tensor.data.shape == original.shape
        np.testing.assert_array_equal(tensor.data, original)


def test_frontend_process_flags() -> None:
    from server.cli import settings_from_args
    from server.grpc.listener import server_options
    from server.settings import ServerSettings

    defaults = settings_from_args(["--model-repository", "/tmp"])
    assert (defaults.frontend_processes, defaults.frontend_shm_bytes) == (1, 64 * 1024 * 1024)
    auto = settings_from_args(["--model-repository", "/tmp", "--frontend-processes", "auto"])
    assert auto.frontend_processes == len(os.sched_getaffinity(0))
    three = settings_from_args(
        ["--model-repository", "/tmp", "--frontend-processes", "3", "--frontend-shm-bytes", "4096"]
    )
    assert (three.frontend_processes, three.frontend_shm_bytes) == (3, 4096)
    for bad in (
        ["--frontend-processes", "0"],
        ["--frontend-processes", "many"],
        ["--frontend-shm-bytes", "0"],
    ):
        with pytest.raises(SystemExit):
            settings_from_args(["--model-repository", "/tmp", *bad])
    # Only shared ports may be bound twice: a port in use stays an error with one process.
    assert dict(server_options(ServerSettings()))["grpc.so_reuseport"] == 0
    assert dict(server_options(ServerSettings(frontend_processes=2)))["grpc.so_reuseport"] == 1
