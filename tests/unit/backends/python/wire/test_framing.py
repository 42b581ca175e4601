"""The worker wire: framed messages with file descriptors, and the shared-memory arenas."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from backends.python.wire.framing import (
    ArenaReader,
    ArenaWriter,
    ChannelClosed,
    Receiver,
    recv_message,
    send_message,
)


def test_messages_keep_their_boundaries(pair: tuple[socket.socket, socket.socket]) -> None:
    left, right = pair
    send_message(left, {"op": "a", "n": 1})
    send_message(left, {"op": "b", "blob": b"x" * 100_000})
    send_message(left, {"op": "c"})
    receiver = Receiver(right)  # one read may bring the start of the next message along
    first, fds = receiver.recv()
    assert first == {"op": "a", "n": 1} and fds == []
    second, _ = receiver.recv()
    assert second["op"] == "b" and len(second["blob"]) == 100_000
    assert receiver.recv() == ({"op": "c"}, [])


def test_file_descriptors_travel_with_their_message(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    left, right = pair
    read_end, write_end = os.pipe()
    try:
        send_message(left, {"op": "fd"}, [write_end])
        send_message(left, {"op": "plain"})
        receiver = Receiver(right)
        message, fds = receiver.recv()
        assert message == {"op": "fd"} and len(fds) == 1
        os.write(fds[0], b"hi")
        os.close(fds[0])
        assert os.read(read_end, 2) == b"hi"
        assert receiver.recv() == ({"op": "plain"}, [])
    finally:
        os.close(read_end)
        os.close(write_end)


def test_closed_peer_raises_channel_closed(pair: tuple[socket.socket, socket.socket]) -> None:
    left, right = pair
    left.close()
    with pytest.raises(ChannelClosed):
        recv_message(right)


def test_a_reader_that_must_not_wait_gets_whole_messages_only(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """What an event loop reads when the socket is readable: a message once whole, None
    before that (its bytes kept), never a wait, and the socket left blocking for threads."""
    left, right = pair
    receiver = Receiver(right)
    assert receiver.recv_nowait() is None  # nothing there: no wait
    frame = b"".join(_frames({"op": "big", "blob": b"y" * 50_000}, {"op": "next"}))
    left.sendall(frame[:10])
    assert receiver.recv_nowait() is None
    left.sendall(frame[10:30_000])
    assert receiver.recv_nowait() is None  # 30,000 of 50,000-odd bytes: still not whole
    left.sendall(frame[30_000:])
    message, fds = receiver.recv_nowait()  # type: ignore[misc]
    assert message["op"] == "big" and len(message["blob"]) == 50_000 and fds == []
    assert receiver.recv_nowait() == ({"op": "next"}, [])
    assert right.getblocking() and right.gettimeout() is None
    read_end, write_end = os.pipe()
    try:
        send_message(left, {"op": "fd"}, [write_end])
        message, fds = receiver.recv_nowait()  # type: ignore[misc]
        assert message == {"op": "fd"} and len(fds) == 1
        os.close(fds[0])
    finally:
        os.close(read_end)
        os.close(write_end)
    left.close()
    with pytest.raises(ChannelClosed):
        receiver.recv_nowait()


def _frames(*messages: dict) -> list[bytes]:
    """The bytes send_message writes for each message."""
    a, b = socket.socketpair()
    try:
        out = []
        for message in messages:
            send_message(a, message)
            out.append(recv_raw(b))
        return out
    finally:
        a.close()
        b.close()


def recv_raw(sock: socket.socket) -> bytes:
    head = sock.recv(4, socket.MSG_WAITALL)
    size = int.from_bytes(head, "little")
    return head + sock.recv(size, socket.MSG_WAITALL)


def _transfer(writer: ArenaWriter, reader: ArenaReader, groups):  # type: ignore[no-untyped-def]
    refs, fd = writer.pack(groups)
    if fd is not None:
        reader.adopt(os.dup(fd))  # the receiving process gets its own descriptor
    return refs


def test_arena_round_trips_every_kind_of_tensor() -> None:
    writer, reader = ArenaWriter(), ArenaReader()
    strided = np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2]  # not contiguous
    groups = [
        {"F": np.linspace(0, 1, 10, dtype=np.float32).reshape(2, 5), "S": strided},
        {
            "B": np.array([b"abc", b"", "d\u00e9"], dtype=object),
            "E": np.zeros((0, 3), np.float64),
            "BOOL": np.array([True, False]),
        },
    ]
    refs = _transfer(writer, reader, groups)
    for group, group_refs in zip(groups, refs, strict=False):
        assert [ref[0] for ref in group_refs] == list(group)
        for ref in group_refs:
            out = reader.copy(ref)
            expected = group[ref[0]]
            assert out.shape == expected.shape and out.dtype == expected.dtype
            assert (out == expected).all()
    offsets = [ref[3] for group_refs in refs for ref in group_refs]
    assert all(offset % 64 == 0 for offset in offsets)
    writer.close()


def test_fixed_size_tensors_are_read_in_place() -> None:
    writer, reader = ArenaWriter(), ArenaReader()
    refs = _transfer(writer, reader, [{"X": np.arange(4, dtype=np.int64)}])
    view = reader.view(refs[0][0])
    assert not view.flags.owndata  # a view over the shared memory, not a copy
    refs2, fd = writer.pack([{"X": np.full(4, 7, dtype=np.int64)}])
    assert fd is None  # same arena reused
    assert (view == 7).all()  # the reader sees the writer's new data in place
    writer.close()


def test_a_packs_copies_outlive_the_next_pack_and_every_kind_round_trips() -> None:
    """The reply's tensors come out of one copy of the pack (`copier`): each keeps its values
    after the writer packs again, strided and BYTES tensors included, and stays writable."""
    writer, reader = ArenaWriter(), ArenaReader()
    strided = np.arange(12, dtype=np.float32).reshape(3, 4).T  # not C-contiguous
    groups = [
        {"A": np.arange(5, dtype=np.int32), "S": strided},
        {},  # a request that failed: no tensors
        {"B": np.array([b"x", b"yz"], dtype=object), "E": np.zeros((0, 3), np.float64)},
        {"C": np.full((2, 2), 9, np.uint8)},
    ]
    refs = _transfer(writer, reader, groups)
    last = refs[-1][-1]
    copy = reader.copier(last[3] + last[4])
    out = [{ref[0]: copy(ref) for ref in group} for group in refs]
    writer.pack([{"A": np.full(64, -1, dtype=np.int64)}])  # the arena is rewritten
    assert np.array_equal(out[0]["A"], np.arange(5, dtype=np.int32))
    assert np.array_equal(out[0]["S"], strided) and out[0]["S"].shape == (4, 3)
    assert out[1] == {}
    assert list(out[2]["B"]) == [b"x", b"yz"] and out[2]["E"].shape == (0, 3)
    assert np.array_equal(out[3]["C"], np.full((2, 2), 9, np.uint8))
    out[3]["C"][0, 0] = 1  # an answer's array may be changed in place by whoever holds it
    assert out[3]["C"][0, 0] == 1
    writer.close()


def test_arena_grows_by_replacement_and_reader_follows() -> None:
    writer, reader = ArenaWriter(min_size=4096), ArenaReader()
    _transfer(writer, reader, [{"X": np.zeros(10, np.uint8)}])
    small = writer.size
    big = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
    refs, fd = writer.pack([{"X": big}])
    assert fd is not None and writer.size > small
    reader.adopt(os.dup(fd))
    assert np.array_equal(reader.copy(refs[0][0]), big)
    writer.close()
