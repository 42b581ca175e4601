"""A closed-loop Python client that drives every server the same way (issue 27's peer rows):
`concurrency` loops, each sending the next request when the last answer is in; v2 JSON over
HTTP/1.1 keep-alive (one connection per loop) or raw-tensor `ModelInfer` over one grpc.aio
channel. The py_add request: INPUT0, INPUT1 FP32 [1, 16].

Why its own client: KServe's Python server is not driven by perf_analyzer here, so ascend-serve
is driven by this client as well and only ratios from the same client are compared.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

VALUES = np.arange(16, dtype=np.float32)


def http_request(host: str, port: int, model: str) -> bytes:
    """One keep-alive v2 JSON infer request, ready to write."""
    body = json.dumps(
        {
            "inputs": [
                {"name": name, "shape": [1, 16], "datatype": "FP32", "data": VALUES.tolist()}
                for name in ("INPUT0", "INPUT1")
            ]
        }
    ).encode()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Window:
    """Requests answered between the two probes and how long that took."""

    requests: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


async def _http_loop(host: str, port: int, model: str, count: Callable[[], None]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    request = http_request(host, port, model)
    try:
        while True:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace").splitlines()[0])
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            count()
    finally:
        writer.close()


async def drive(
    protocol: str,
    address: str,
    model: str,
    concurrency: int,
    seconds: float,
    probe: Callable[[], None],
    warmup: float = 1.0,
) -> Window:
    """Load `address` for warmup + seconds; `probe()` is called at the start and at the end
    of the measured window (the caller reads the server's CPU there)."""
    host, port = address.rsplit(":", 1)
    done = 0

    def count() -> None:
        nonlocal done
        done += 1

    channel = None
    if protocol == "http":
        loops = [_http_loop(host, int(port), model, count) for _ in range(concurrency)]
    else:
        import grpc

        from protocol.proto import grpc_service_pb2 as pb
        from protocol.proto import grpc_service_pb2_grpc as pb_grpc

        message = pb.ModelInferRequest(model_name=model)
        for name in ("INPUT0", "INPUT1"):
            message.inputs.add(name=name, datatype="FP32", shape=[1, 16])
            message.raw_input_contents.append(VALUES.tobytes())
        channel = grpc.aio.insecure_channel(address)
        stub = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer

        async def one() -> None:
            while True:
                await stub(message)
                count()

        loops = [one() for _ in range(concurrency)]
    tasks = [asyncio.ensure_future(loop) for loop in loops]
    try:
        await asyncio.sleep(warmup)
        _raise_failed(tasks)
        probe()
        start_done, start = done, time.monotonic()
        await asyncio.sleep(seconds)
        window = Window(done - start_done, time.monotonic() - start)
        probe()
        _raise_failed(tasks)
        return window
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if channel is not None:
            await channel.close()


def _raise_failed(tasks: Sequence[asyncio.Future[Any]]) -> None:
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError(f"client loop failed: {task.exception()!r}")
