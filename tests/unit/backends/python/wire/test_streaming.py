"""The wire decoupled answers and BLS use: the shared-memory ring (wrap-around, growth, waiting
for the reader), the shared channel (routing by key, several waiting threads, inline notices,
descriptors of messages in flight together), and the worker's sender rules."""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np
import pytest

from backends.python.wire.channel import Channel
from backends.python.wire.framing import ChannelClosed, Receiver, send_message
from backends.python.wire.ring import RingFull, RingReader, RingWriter
from backends.python.worker.bridge import SendError, WorkerBridge


def test_ring_wraps_around_and_reuses_what_was_read() -> None:
    writer, reader = RingWriter(capacity=4096, wait_s=0.2), RingReader()
    for round_ in range(20):  # 20 x 1.5 KiB through a 4 KiB ring
        array = np.full(384, round_, dtype=np.int32)
        refs, end, fd = writer.pack({"A": array, "S": np.array([b"x" * round_], dtype=object)})
        if fd is not None:
            reader.adopt(os.dup(fd))
        got = reader.take(refs, end)
        assert got["A"].tolist() == array.tolist()
        assert got["S"].tolist() == [b"x" * round_]
    writer.close()


def test_ring_waits_for_the_reader_then_gives_up() -> None:
    writer, reader = RingWriter(capacity=4096, wait_s=0.5), RingReader()
    refs, first_end, fd = writer.pack({"A": np.zeros(400, np.int32)})  # 1600 of 4096 bytes
    reader.adopt(os.dup(fd))
    writer.pack({"B": np.zeros(400, np.int32)})
    released = threading.Event()

    def read_first() -> None:
        released.set()
        reader.release(first_end)

    threading.Timer(0.1, read_first).start()
    writer.pack({"C": np.zeros(400, np.int32)})  # no room until the first is read
    assert released.is_set()
    with pytest.raises(RingFull, match="stayed full"):
        writer.pack({"D": np.zeros(400, np.int32)})  # nobody reads the second
    writer.close()


def test_ring_grows_for_a_big_message_and_when_it_must_not_wait() -> None:
    writer, reader = RingWriter(capacity=8192, grow_when_full=True), RingReader()
    refs, end, fd = writer.pack({"A": np.arange(500, dtype=np.int64)})
    assert fd is not None
    reader.adopt(os.dup(fd))
    assert reader.take(refs, end)["A"][-1] == 499
    fds = [writer.pack({name: np.zeros(500, np.int64)})[2] for name in "BCD"]
    assert fds[0] is None and fds[1] is None  # B after A, C wrapped around into A's space
    assert fds[2] is not None  # B and C unread: a new ring instead of waiting
    _, _, big = writer.pack({"E": np.zeros(100_000, np.int64)})  # bigger than the ring
    assert big is not None
    writer.close()


def test_descriptors_follow_their_own_message(pair: tuple[socket.socket, socket.socket]) -> None:
    left, right = pair
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        send_message(left, {"op": "plain"})
        send_message(left, {"op": "one"}, [w1])
        send_message(left, {"op": "two"}, [w2])
        receiver = Receiver(right)
        got = [receiver.recv() for _ in range(3)]
        assert [message["op"] for message, _ in got] == ["plain", "one", "two"]
        assert [len(fds) for _, fds in got] == [0, 1, 1]
        os.write(got[1][1][0], b"1")
        os.write(got[2][1][0], b"2")
        assert os.read(r1, 1) == b"1" and os.read(r2, 1) == b"2"
        for _, fds in got:
            for fd in fds:
                os.close(fd)
    finally:
        for fd in (r1, w1, r2, w2):
            os.close(fd)


def test_channel_routes_to_waiters_and_handles_notices(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    left, right = pair
    notices: list[dict] = []

    def route(message: dict, fds: list[int]):
        if message["op"] == "notice":
            notices.append(message)
            return None
        return message["op"]

    channel = Channel(right, route)
    results: dict[str, dict] = {}

    def wait(key: str) -> None:
        results[key] = channel.wait(key, timeout=5)[0]

    threads = [threading.Thread(target=wait, args=(key,)) for key in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for op in ("notice", "c", "notice", "a", "b"):
        send_message(left, {"op": op})
    for thread in threads:
        thread.join(5)
    assert sorted(results) == ["a", "b", "c"] and len(notices) == 2
    with pytest.raises(TimeoutError):
        channel.wait("never", timeout=0.1)


def test_channel_wakes_every_waiter_when_the_other_side_goes(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    left, right = pair
    channel = Channel(right, lambda message, fds: message["op"])
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            channel.wait("x")
        except ChannelClosed as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    left.close()
    for thread in threads:
        thread.join(5)
    assert len(errors) == 3


class _Response:
    def __init__(self) -> None:
        self.sent = True

    def has_error(self) -> bool:
        return False

    def output_tensors(self) -> list:
        return []

    def _parameter_dict(self) -> dict:
        return {}


def _bridge(
    pair: tuple[socket.socket, socket.socket], window: int = 2, timeout: float = 0.3
) -> WorkerBridge:
    channel = Channel(pair[0], lambda message, fds: None)
    return WorkerBridge(channel, RingWriter(capacity=4096), RingReader(), window, timeout)


def test_sender_rules_match_triton(pair: tuple[socket.socket, socket.socket]) -> None:
    bridge = _bridge(pair)
    single = bridge.register(-1, False, None)
    with pytest.raises(SendError, match="cannot send complete final before sending a response"):
        bridge.send(single, None, 1)
    bridge.send(single, _Response(), 0)
    with pytest.raises(SendError, match="cannot send more than one response"):
        bridge.send(single, _Response(), 0)
    stream = bridge.register(7, True, None)
    with pytest.raises(SendError, match="Unsupported flag provided"):
        bridge.send(stream, _Response(), 4)
    with pytest.raises(SendError, match="must be provided when the response flags is set to zero"):
        bridge.send(stream, None, 0)
    bridge.send(stream, None, 1)
    with pytest.raises(SendError, match="Response sender has been closed"):
        bridge.send(stream, _Response(), 0)


def test_sender_blocks_at_its_window_until_acked(pair: tuple[socket.socket, socket.socket]) -> None:
    bridge = _bridge(pair, window=2, timeout=0.3)
    state = bridge.register(9, True, None)
    bridge.send(state, _Response(), 0)
    bridge.send(state, _Response(), 0)
    with pytest.raises(SendError, match="has not read the last 2 responses within 0.3 s"):
        bridge.send(state, _Response(), 0)
    threading.Timer(0.1, bridge.on_notice, args=({"op": "ack", "rid": 9},)).start()
    bridge.send(state, _Response(), 0)  # the ack made room
    bridge.on_notice({"op": "cancel", "rid": 9})
    assert bridge.is_cancelled(9)
    for _ in range(5):  # a cancelled request never blocks; what it sends is dropped
        bridge.send(state, _Response(), 0)


def test_a_cancel_that_overtakes_its_request_still_reaches_it(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    bridge = _bridge(pair)
    bridge.register(3, True, None)
    bridge.on_notice({"op": "cancel", "rid": 5})  # request 5's execute has not arrived yet
    bridge.on_notice({"op": "cancel", "rid": 2})  # an old one, long finished: forgotten
    assert bridge.register(5, True, None).cancelled
    assert not bridge.register(6, True, None).cancelled
    assert not bridge.register(2, True, None).cancelled
