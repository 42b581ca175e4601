"""The gRPC frontend alone, as an A/B of two trees, on both gRPC servers, beside a bare grpcio
floor: server CPU per request and per KB of ModelInfer with one UINT8 tensor, the answer as
large.

    .venv/bin/python -m bench.ab.grpc_body_ab --a ../base-checkout [--b .] [--slices 6]
        [--sizes 4096,153600,614400,4194304] [--concurrency 4] [--servers aio,threads]

Why: bench/ab/http_body_ab.py's sibling for issue 26 item 2's gRPC side. Each tree's real gRPC
frontend (server/grpc/frontend.py's `start_grpc_server`: services, codec, both servers) runs
over a core that echoes INPUT0 back as OUTPUT0, so no scheduler, batcher or model is counted.
The floor ("floor-aio", "floor-threads") is grpcio itself with nothing of ours: a generic
handler that takes the request's bytes and answers a ModelInferResponse of one output whose
bytes are the request's tensor (the last `size` bytes of what tritonclient sends), joined once
after a fixed head, on grpc.aio or on grpcio's synchronous server. Every server is up at once,
pinned to CPU 0; the client (bench/studies/npu_copies.py's: tritonclient, the same request
counts) on CPU 1 sends slices of requests to each in turn, the order reversed every other
slice, so the neighbours' drifting load falls on all of them alike; CPU per server from
/proc/<pid>/task/*/schedstat (bench.cpu_time.task_ns).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SIZES = (4096, 150 * 1024, 600 * 1024, 4 << 20)
SERVER_CPU, CLIENT_CPU = 0, 1
MESSAGE_LIMIT = 64 << 20


def serve_echo(port: int, server: str) -> None:
    """One tree's gRPC frontend over an echoing core (run with that tree on PYTHONPATH)."""
    import asyncio

    from protocol.types import InferResponse, Tensor
    from server.grpc.frontend import start_grpc_server
    from server.malloc import steady_malloc
    from server.net.loop import new_event_loop
    from server.settings import ServerSettings

    steady_malloc()
    settings = ServerSettings(grpc_address="127.0.0.1", grpc_port=port, grpc_server=server)

    class EchoCore:
        """The part of CoreAPI ModelInfer calls: every input comes back as OUTPUT0."""

        may_trace = False
        propagates_trace = False
        exiting = False

        def __init__(self) -> None:
            self.settings = settings

        def live(self) -> bool:
            return True

        def ready(self) -> bool:
            return True

        async def infer(self, request: Any, endpoint: Any = None) -> Any:
            outputs = [
                Tensor("OUTPUT0", tensor.datatype, tensor.shape, tensor.data)
                for tensor in request.inputs
            ]
            return InferResponse(request.model_name, "1", outputs=outputs)

    async def main() -> None:
        frontend = await start_grpc_server(EchoCore(), settings)  # type: ignore[arg-type]
        print("ready", flush=True)
        await asyncio.Event().wait()
        await frontend.stop(0)  # never reached: kept alive (a dropped grpc server stops)

    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(main())


def serve_floor(port: int, server: str) -> None:
    """grpcio alone: ModelInfer's bytes in, a minimal answer of the same tensor out."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from protocol.proto import grpc_service_pb2 as pb
    from server.malloc import steady_malloc

    steady_malloc()
    heads: dict[int, bytes] = {}

    def answer(data: bytes, size: int) -> bytes:
        """The head (one UINT8 output of `size`), field 6's tag and length, the tensor."""
        head = heads.get(size)
        if head is None:
            message = pb.ModelInferResponse(model_name="onnx_id", model_version="1")
            message.outputs.add(name="OUTPUT0", datatype="UINT8", shape=[1, size])
            entry = pb.ModelInferResponse(raw_output_contents=[b""]).SerializeToString()[:1]
            length = bytearray()
            rest = size
            while rest >= 0x80:
                length.append(rest & 0x7F | 0x80)
                rest >>= 7
            length.append(rest)
            head = heads[size] = message.SerializeToString() + entry + bytes(length)
        return b"".join([head, memoryview(data)[len(data) - size :]])

    sizes: dict[int, int] = {}

    def size_of(data: bytes) -> int:
        """The tensor's size: the client's requests of one size all have one length, so
        protobuf parses the first of each length only."""
        size = sizes.get(len(data))
        if size is None:
            size = sizes[len(data)] = len(
                pb.ModelInferRequest.FromString(data).raw_input_contents[0]
            )
        return size

    options = [
        ("grpc.max_receive_message_length", MESSAGE_LIMIT),
        ("grpc.max_send_message_length", MESSAGE_LIMIT),
    ]
    method = "/inference.GRPCInferenceService/ModelInfer"
    service, name = method[1:].split("/")

    if server == "threads":

        def infer(data: bytes, context: Any) -> bytes:
            return answer(data, size_of(data))

        handler: Any = grpc.unary_unary_rpc_method_handler(infer)
        sync = grpc.server(ThreadPoolExecutor(16), options=options)
        sync.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {name: handler}),)
        )
        sync.add_insecure_port(f"127.0.0.1:{port}")
        sync.start()
        print("ready", flush=True)
        sync.wait_for_termination()
        return

    async def infer_aio(data: bytes, context: Any) -> bytes:
        return answer(data, size_of(data))

    async def main() -> None:
        aio = grpc.aio.server(options=options)
        handler: Any = grpc.unary_unary_rpc_method_handler(infer_aio)
        aio.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {name: handler}),)
        )
        aio.add_insecure_port(f"127.0.0.1:{port}")
        await aio.start()
        print("ready", flush=True)
        await aio.wait_for_termination()

    asyncio.run(main())


def start(tree: Path, role: str, server: str) -> tuple[subprocess.Popen[str], SimpleNamespace]:
    """One server (`role` echo or floor) from `tree`, listening."""
    from harness.serverproc import free_port

    port = free_port()
    command = ["taskset", "-c", str(SERVER_CPU), sys.executable, __file__]
    command += ["--serve", role, "--server", server, "--port", str(port)]
    env = dict(os.environ, PYTHONPATH=str(tree))
    process = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    return process, SimpleNamespace(grpc_port=port)


def rotation(
    servers: dict[str, tuple[subprocess.Popen[str], SimpleNamespace]],
    size: int,
    slices: int,
    per: int,
    connections: int,
) -> dict[str, Any]:
    """Slices of `per` requests to each server in turn (reversed every other slice); µs per
    request of each over all its slices, and each slice's."""
    from bench.cpu_time import task_ns
    from bench.studies.npu_copies import drive

    labels = list(servers)
    for _, target in servers.values():  # warm: channels, pages, grpc's buffers
        drive(target, "onnx_id", "grpc", size, max(connections * 2, 16), connections)  # type: ignore[arg-type]
    spent = dict.fromkeys(labels, 0)
    rounds: dict[str, list[float]] = {label: [] for label in labels}
    for index in range(slices):
        for label in labels if index % 2 == 0 else labels[::-1]:
            process, target = servers[label]
            before = task_ns(process.pid)
            drive(target, "onnx_id", "grpc", size, per, connections)  # type: ignore[arg-type]
            used = task_ns(process.pid) - before
            spent[label] += used
            rounds[label].append(round(used / per / 1000, 1))
    kb = size / 1024
    row: dict[str, Any] = {"size": size, "per_slice": per}
    for label in labels:
        us = spent[label] / slices / per / 1000
        row[label] = {"us": round(us, 1), "us_per_kb": round(us / kb, 3), "slices": rounds[label]}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", choices=("echo", "floor"), help=argparse.SUPPRESS)
    parser.add_argument("--server", default="aio", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--a", type=Path, help="the base tree")
    parser.add_argument("--b", type=Path, default=ROOT, help="the changed tree")
    parser.add_argument("--slices", type=int, default=6)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--servers", default="aio,threads")
    parser.add_argument("--no-floor", dest="floor", action="store_false")
    args = parser.parse_args(argv)
    if args.serve:
        (serve_echo if args.serve == "echo" else serve_floor)(args.port, args.server)
        return 0
    if args.a is None:
        parser.error("--a is required")
    os.sched_setaffinity(0, {CLIENT_CPU})
    kinds = args.servers.split(",")
    servers: dict[str, tuple[subprocess.Popen[str], SimpleNamespace]] = {}
    try:
        for kind in kinds:
            servers[f"A-{kind}"] = start(args.a.resolve(), "echo", kind)
            servers[f"B-{kind}"] = start(args.b.resolve(), "echo", kind)
            if args.floor:
                servers[f"floor-{kind}"] = start(ROOT, "floor", kind)
        for size in [int(s) for s in args.sizes.split(",")]:
            per = max(16, min(300, (64 << 20) // size))
            row = rotation(servers, size, args.slices, per, args.concurrency)
            for kind in kinds:
                a, b = row[f"A-{kind}"]["us"], row[f"B-{kind}"]["us"]
                row[f"B/A-{kind}"] = round(b / a, 3)
            print(json.dumps(row), flush=True)
    finally:
        for process, _ in servers.values():
            process.kill()
            process.wait()
    return 0


if __name__ == "__main__":
    if "--serve" in sys.argv:  # the server's own tree first, not this script's folder
        sys.path[0] = os.environ.get("PYTHONPATH", sys.path[0])
    raise SystemExit(main())
