"""A client that opens many gRPC calls and never sends their request messages must not stall
anyone else, on either gRPC server. On grpc.aio each such call is a suspended task. On
`--grpc-server threads` it holds a handler thread (grpcio's synchronous server gives it one when
its headers arrive): there is a thread for every call `--grpc-max-concurrent-rpcs` admits, and
`--grpc-message-timeout` cancels a call whose message has not come (server/grpc/message_wait.py).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import tritonclient.grpc as grpcclient

from harness.serverproc import running_server

pytestmark = pytest.mark.e2e

STALLED = 80  # more than the 64 handler threads the threads server used to have


def _never(gate: queue.Queue) -> Iterator[bytes]:
    gate.get()  # the message is never sent while the test runs
    yield b""


class Stalled:
    """`count` ModelInfer calls over a few channels whose request messages never come."""

    def __init__(self, target: str, count: int, method: str = "ModelInfer") -> None:
        self.gates: list[queue.Queue] = []
        self.channels = [grpc.insecure_channel(target) for _ in range(8)]
        self.method = f"/inference.GRPCInferenceService/{method}"
        self.calls: list = []
        for number in range(count):
            self.calls.append(self._open(number))

    def _open(self, number: int) -> Any:
        call = self.channels[number % len(self.channels)].stream_unary(self.method)
        gate: queue.Queue = queue.Queue()
        self.gates.append(gate)
        return call.future(_never(gate))

    def reopen_refused(self) -> None:
        """Open again the calls the server refused RESOURCE_EXHAUSTED: a slot of a call that
        ended just before (the harness's own readiness calls) can still count for a moment
        under load."""
        for number, call in enumerate(self.calls):
            error = call.exception() if call.done() else None
            if error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self.calls[number] = self._open(number)

    def close(self) -> None:
        for call in self.calls:
            call.cancel()
        for gate in self.gates:
            gate.put(None)
        for channel in self.channels:
            channel.close()


def _others_are_answered(target: str) -> None:
    client = grpcclient.InferenceServerClient(target)
    for _ in range(3):  # some of the stalled calls are open by now, all by the last one
        assert client.get_server_metadata(client_timeout=5).name == "ascend-serve"
        assert client.is_model_ready("simple", client_timeout=5)
    result = client.infer(
        "simple",
        _simple_inputs(),
        client_timeout=5,
    )
    assert result.as_numpy("OUTPUT0").tolist() == [[2] * 16]


def _simple_inputs() -> list[grpcclient.InferInput]:
    import numpy as np

    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        inputs.append(tensor)
    return inputs


@pytest.mark.parametrize("grpc_server", ["aio", "threads"])
def test_calls_that_never_send_their_message_do_not_stall_the_others(
    example_repository: Path, grpc_server: str
) -> None:
    with running_server([example_repository], ["--grpc-server", grpc_server]) as server:
        target = f"127.0.0.1:{server.grpc_port}"
        stalled = Stalled(target, STALLED)
        try:
            _others_are_answered(target)
            assert not any(call.done() for call in stalled.calls)  # still waiting, not refused
        finally:
            stalled.close()


def _wait_all_done(calls: list, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(call.done() for call in calls):
        time.sleep(0.1)


def test_the_threads_server_cancels_a_call_whose_message_never_comes(
    example_repository: Path,
) -> None:
    """The bound on the wait: the stalled calls end CANCELLED, their threads serve again, and a
    later stalled wave is cancelled the same way."""
    args = ["--grpc-server", "threads", "--grpc-max-concurrent-rpcs", "40"]
    with running_server([example_repository], [*args, "--grpc-message-timeout", "1000"]) as server:
        target = f"127.0.0.1:{server.grpc_port}"
        for _wave in range(2):
            stalled = Stalled(target, 30)
            try:
                _wait_all_done(stalled.calls, 30)
                codes = {call.exception().code() for call in stalled.calls if call.done()}
                assert codes == {grpc.StatusCode.CANCELLED}
                assert all(call.done() for call in stalled.calls)
                _others_are_answered(target)
            finally:
                stalled.close()


def test_past_the_call_limit_the_threads_server_refuses_instead_of_stalling(
    example_repository: Path,
) -> None:
    """Every admitted call has a thread; one past --grpc-max-concurrent-rpcs is refused at once
    with grpcio's RESOURCE_EXHAUSTED, not queued behind the stalled ones."""
    args = ["--grpc-server", "threads", "--grpc-max-concurrent-rpcs", "20"]
    with running_server([example_repository], args) as server:
        target = f"127.0.0.1:{server.grpc_port}"
        stalled = Stalled(target, 20)
        try:
            client = grpcclient.InferenceServerClient(target)
            deadline = time.monotonic() + 30
            while True:  # until all twenty are open in the server
                stalled.reopen_refused()
                try:
                    client.get_server_metadata(client_timeout=5)
                except Exception as error:
                    assert "Concurrent RPC limit exceeded" in str(error)
                    break
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            stalled.close()
        _wait_all_done(stalled.calls, 10)
        assert client.get_server_metadata(client_timeout=5).name == "ascend-serve"


def test_a_unary_call_half_closed_without_its_message_is_unimplemented(
    example_repository: Path,
) -> None:
    """On the threads server, as grpcio's own unary handling answers it (grpc.aio leaves such a
    call open until the client's deadline)."""
    with running_server([example_repository], ["--grpc-server", "threads"]) as server:
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            call = channel.stream_unary("/inference.GRPCInferenceService/ServerLive")
            with pytest.raises(grpc.RpcError) as raised:
                call(iter(()), timeout=10)
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert (raised.value.details() or "") == (
        '"/inference.GRPCInferenceService/ServerLive" requires exactly one request message.'
    )
