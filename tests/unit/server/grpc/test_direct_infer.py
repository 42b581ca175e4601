"""ModelInfer off grpc core's completion queue (server/grpc/direct_infer.py): this grpcio has the
internals it needs; a completion that fails cancels its call instead of ending grpcio's polling
thread; every call it counts in is counted out, refused ones never counted."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import grpc

from server.grpc import direct_infer
from server.grpc.direct_infer import DirectCall, DirectInfer
from server.grpc.loop_bridge import LoopBridge
from server.grpc.message_wait import MessageWatch


class _Call:
    """grpc core's call as the module uses it: batches started, and cancels."""

    def __init__(self) -> None:
        self.batches: list[tuple[tuple[Any, ...], Any]] = []
        self.cancelled = 0

    def start_server_batch(self, ops: Any, tag: Any) -> None:
        self.batches.append((tuple(type(op).__name__ for op in ops), tag))

    def cancel(self) -> None:
        self.cancelled += 1


class _ClosedLoop:
    def call_soon_threadsafe(self, *args: Any) -> None:
        raise RuntimeError("Event loop is closed")


def _calls(limit: int | None = None, loop: Any = None) -> DirectInfer:
    server = grpc.server(ThreadPoolExecutor(1), maximum_concurrent_rpcs=limit)
    frontend = SimpleNamespace(core=SimpleNamespace(propagates_trace=False), offload_threshold=64)
    calls = DirectInfer(
        frontend,
        server,
        LoopBridge(loop or asyncio.new_event_loop()),
        MessageWatch(0),
        ThreadPoolExecutor(1),
        {},
    )
    calls.state.stage = SimpleNamespace(value="stopped")  # ask grpc core for no next call
    return calls


def _arrival(call: _Call) -> Any:
    return SimpleNamespace(success=True, call=call, invocation_metadata=())


def test_this_grpcio_has_what_the_direct_path_needs() -> None:
    assert direct_infer.available(grpc.server(ThreadPoolExecutor(1)))


def test_a_call_is_counted_in_at_its_headers_and_out_at_its_close() -> None:
    calls = _calls()
    call = _Call()
    assert calls._arrived(_arrival(call)) == (None, ())
    assert calls.state.active_rpc_count == 1
    (close_ops, close_tag), (message_ops, _) = call.batches
    assert close_ops == ("ReceiveCloseOnServerOperation",)
    assert message_ops == ("ReceiveMessageOperation",)
    closed = SimpleNamespace(
        success=True, batch_operations=[SimpleNamespace(cancelled=lambda: False)]
    )
    assert close_tag(closed) == (None, ())
    assert calls.state.active_rpc_count == 0


def test_a_call_past_the_limit_is_refused_and_never_counted() -> None:
    calls = _calls(limit=1)
    calls.state.active_rpc_count = 1
    call = _Call()
    calls._arrived(_arrival(call))
    assert calls.state.active_rpc_count == 1
    ((ops, _),) = call.batches
    assert ops[-1] == "SendStatusFromServerOperation"


def test_a_failing_completion_cancels_its_call_and_spares_the_polling_thread() -> None:
    calls = _calls(loop=_ClosedLoop())  # the hand-over to the loop raises
    call = _Call()
    direct = DirectCall(calls, call, ())
    message = SimpleNamespace(
        success=True, batch_operations=[SimpleNamespace(message=lambda: b"x")]
    )
    assert direct.message_in(message) == (None, ())
    assert call.cancelled == 1
