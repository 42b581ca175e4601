"""server/http/receive.py: large bodies received into their own array, and the budget they hold."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from server.http.body import BodyBudget, BodyBudgetExhausted, BodyBuffer, BodyLimit
from server.http.receive import DIRECT_MIN, BodySink, DirectReceiver, open_sink


class _Wrapped:
    """The protocol a DirectReceiver passes reads on to."""

    def __init__(self) -> None:
        self.direct_sink: BodySink | None = None
        self.data: list[bytes] = []
        self.received: list[int] = []

    def data_received(self, data: Any) -> None:
        self.data.append(bytes(data))  # a view of the scratch buffer: copied to keep it

    def body_received(self, nbytes: int) -> None:
        self.received.append(nbytes)


def _read(receiver: DirectReceiver, data: bytes) -> None:
    """What the transport does for one read of `data`."""
    buffer = receiver.get_buffer(-1)
    assert len(buffer) >= len(data)
    buffer[: len(data)] = data
    receiver.buffer_updated(len(data))


def test_reads_go_to_the_parser_until_a_sink_is_open_then_into_the_array() -> None:
    wrapped = _Wrapped()
    receiver = DirectReceiver(wrapped)  # type: ignore[arg-type]
    _read(receiver, b"POST / HTTP/1.1\r\n")
    assert wrapped.data == [b"POST / HTTP/1.1\r\n"]

    budget = BodyBudget(1 << 30)
    sink = wrapped.direct_sink = BodySink(DIRECT_MIN + 10, budget)
    sink.add(b"head")  # what the parser gave
    assert len(receiver.get_buffer(-1)) == DIRECT_MIN + 6  # the rest of the body, no more
    _read(receiver, b"abc")
    assert wrapped.received == [3] and wrapped.data == [b"POST / HTTP/1.1\r\n"]
    sink.filled += 3  # the protocol's body_received counts it
    assert bytes(sink.view[:7]) == b"headabc"


def test_a_sink_reserves_its_size_and_gives_back_what_it_holds_once() -> None:
    budget = BodyBudget(4 * DIRECT_MIN)
    sink = open_sink(2 * DIRECT_MIN, budget)
    assert sink is not None and budget.reserved == 2 * DIRECT_MIN
    assert open_sink(3 * DIRECT_MIN, budget) is None  # past the budget: read chunk by chunk
    assert open_sink(DIRECT_MIN, budget) is None  # small: arrives with its headers
    sink.filled = 1000
    sink.charge()
    assert budget.held == 1000
    sink.release()
    sink.release()
    assert budget.held == 0 and budget.reserved == 0


def test_a_sink_s_unreceived_part_counts_against_every_other_body() -> None:
    """The array is allocated at once, so its whole size is committed: another body cannot
    take that memory while the sink waits for its bytes, and the sink's own bytes move from
    the reservation to `held` without changing what is committed."""
    budget = BodyBudget(2 * DIRECT_MIN)
    budget.held = DIRECT_MIN  # another body's bytes
    assert open_sink(DIRECT_MIN + 1000, budget) is None  # does not fit beside it: chunk by chunk
    budget.held = 0
    sink = open_sink(DIRECT_MIN + 1000, budget)
    assert sink is not None and budget.committed() == DIRECT_MIN + 1000
    other = BodyBuffer(BodyLimit(4 * DIRECT_MIN, budget))
    with pytest.raises(BodyBudgetExhausted, match="--http-max-inflight-body-size"):
        other.add(b"x" * (DIRECT_MIN - 500))
    other.release()
    sink.filled = DIRECT_MIN + 1000
    sink.charge()  # its own bytes: never refused for them
    assert budget.held == DIRECT_MIN + 1000 and budget.reserved == 0
    sink.release()
    assert budget.held == 0 and budget.reserved == 0


def test_the_body_is_a_view_of_the_array() -> None:
    sink = BodySink(DIRECT_MIN + 4, BodyBudget(1 << 30))
    sink.add(b"\x01" * (DIRECT_MIN + 4))
    assert sink.complete and len(sink.window()) == 0
    decoded = np.frombuffer(sink.body(), dtype=np.uint8)
    assert np.shares_memory(decoded, sink.array) and int(decoded.sum()) == DIRECT_MIN + 4
