"""A client that opens many gRPC calls and never sends their request messages must not stall
anyone else. On the default server (grpc.aio) each such call is a suspended task; on
`--grpc-server threads` it holds a handler thread with no bound on the wait, which is why that
server is opt-in (README, "gRPC servers"), so this test is about the default."""

from __future__ import annotations

import os
import queue
from collections.abc import Iterator

import grpc
import pytest
import tritonclient.grpc as grpcclient

from harness.serverproc import GRPC_SERVER_ENV

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get(GRPC_SERVER_ENV) == "threads",
        reason="--grpc-server threads has this limit, documented in the README",
    ),
]

STALLED = 80  # more than --grpc-threads' default (64), in case the default server changes


def _never(gate: queue.Queue) -> Iterator[bytes]:
    gate.get()  # the message is never sent while the test runs
    yield b""


def test_calls_that_never_send_their_message_do_not_stall_the_others(example_server) -> None:
    target = f"127.0.0.1:{example_server.grpc_port}"
    gates: list[queue.Queue] = []
    channels = [grpc.insecure_channel(target) for _ in range(8)]
    stalled = []
    try:
        for number in range(STALLED):
            call = channels[number % len(channels)].stream_unary(
                "/inference.GRPCInferenceService/ModelInfer"
            )
            gate: queue.Queue = queue.Queue()
            gates.append(gate)
            stalled.append(call.future(_never(gate)))
        client = grpcclient.InferenceServerClient(target)
        for _ in range(3):  # some of the stalled calls are open by now, all by the last one
            assert client.get_server_metadata(client_timeout=5).name == "ascend-serve"
            assert client.is_model_ready("simple", client_timeout=5)
        assert not any(call.done() for call in stalled)  # still waiting, not refused
    finally:
        for call in stalled:
            call.cancel()
        for gate in gates:
            gate.put(None)
        for channel in channels:
            channel.close()
