"""Python bytecodes per `execute` of a Python model, server side and worker side: a count that
machine noise cannot move.

Why: on a shared 2-core machine a few µs per request hide in the noise of any timing, while
the Python model path's cost is mostly interpreted bytecode. This runs `bench/models/py_add`
from any source tree (`--tree`, so two commits compare directly) and counts the opcodes the
interpreter executes (sys.settrace opcode events) for one `execute` of one request:

- server: `PythonBackend.execute_requests` against a real worker process (packing the inputs,
  the request details, the socket round trip's Python side, reading the results);
- worker: `python_worker.WorkerLoop` in this process on a socket pair: reading the message,
  building the pb_utils requests, the model, packing the outputs, the reply.

The request is a gRPC client's as perf_analyzer sends it (both outputs named, the
`triton_enable_empty_final_response` parameter); `--plain` sends one with neither.

    .venv/bin/python -m bench.ab.python_path_opcodes [--tree ../base-checkout] [--plain]
        [--by-function]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "bench" / "models" / "py_add"


class OpcodeCounter:
    """Counts opcode events, in total and by function, while `trace` runs a callable."""

    def __init__(self) -> None:
        self.total = 0
        self.by_function: collections.Counter[str] = collections.Counter()

    def _tracer(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            self.total += 1
            code = frame.f_code
            self.by_function[f"{Path(code.co_filename).name}:{code.co_name}"] += 1
        return self._tracer

    def trace(self, run: Callable[[], Any]) -> None:
        sys.settrace(self._tracer)
        try:
            run()
        finally:
            sys.settrace(None)


def server_side(plain: bool, count: int) -> OpcodeCounter:
    import numpy as np

    from backends.base import InstanceSpec
    from backends.python.backend import PythonBackend
    from protocol.types import InferRequest, RequestedOutput, Tensor
    from repository.config import normalize, parse_config_text

    folder = Path(tempfile.mkdtemp())
    model_dir = folder / "py_add"
    shutil.copytree(MODEL, model_dir)
    config = parse_config_text((model_dir / "config.pbtxt").read_text(), model_dir / "config.pbtxt")
    normalize(config, "py_add", model_dir, [model_dir / "1"])
    backend = PythonBackend(
        config, model_dir, model_dir / "1", InstanceSpec("py_add_0", "KIND_CPU", 0, 0)
    )
    backend.load()
    try:
        tensors = [
            Tensor(name, "FP32", (1, 16), np.ones((1, 16), np.float32))
            for name in ("INPUT0", "INPUT1")
        ]
        request = InferRequest(
            "py_add",
            "",
            "",
            tensors,
            None if plain else [RequestedOutput("OUTPUT0"), RequestedOutput("OUTPUT1")],
            {} if plain else {"triton_enable_empty_final_response": True},
        )
        inputs = [{t.name: t.data for t in tensors}]
        details = getattr(PythonBackend, "wants_request_details", False)  # older trees: none

        def run() -> None:
            for _ in range(count):
                if details:
                    backend.execute_requests(inputs, [request])
                else:
                    backend.execute_requests(inputs)

        run()  # warm: arenas mapped, caches filled
        counter = OpcodeCounter()
        counter.trace(run)
        return counter
    finally:
        backend.unload()
        shutil.rmtree(folder, ignore_errors=True)


def worker_side(plain: bool, count: int) -> OpcodeCounter:
    import numpy as np

    from backends.python.wire import framing
    from backends.python.worker.main import WorkerLoop

    server, worker = socket.socketpair()
    loop = WorkerLoop(worker)
    args = {
        "model_config": json.dumps({"name": "py_add"}),
        "model_name": "py_add",
        "model_instance_name": "py_add_0",
    }
    loop.on_init(
        {
            "model_file": str(MODEL / "1" / "model.py"),
            "version_dir": str(MODEL / "1"),
            "args": args,
        },
        [],
    )
    arena = framing.ArenaWriter()
    refs, fd = arena.pack(
        [{"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)}]
    )
    message: dict[str, Any] = {"op": "execute", "requests": refs, "outputs": ["OUTPUT0", "OUTPUT1"]}
    if not plain:  # what the server sends for it (older trees send no details at all)
        message["meta"] = [("", {"triton_enable_empty_final_response": True})]
    replies = framing.Receiver(server)
    channel = getattr(loop, "channel", None)

    def serve_one() -> None:
        if channel is not None:
            received, fds = channel.wait("op")
        else:  # trees before the Channel: the loop read its socket with a framing.Receiver
            received, fds = getattr(loop, "receiver").recv()  # noqa: B009
        reply, reply_fds = loop.on_execute(received, fds)
        loop.reply(reply, reply_fds)

    # the first pack maps a fresh arena, whose descriptor the worker must receive
    assert fd is not None
    framing.send_message(server, message, [fd])
    serve_one()
    replies.recv()
    counter = OpcodeCounter()
    for _ in range(count):
        framing.send_message(server, message)
        counter.trace(serve_one)
        replies.recv()
    server.close()
    worker.close()
    return counter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="source tree to count")
    parser.add_argument("--plain", action="store_true", help="no outputs named, no parameters")
    parser.add_argument("--by-function", action="store_true")
    parser.add_argument("--count", type=int, default=200)
    args = parser.parse_args(argv)
    tree = args.tree.resolve()
    sys.path.insert(0, str(tree))
    os.chdir(tree)  # the worker process (`python -m`) imports from its working directory
    for side, counter in (
        ("server", server_side(args.plain, args.count)),
        ("worker", worker_side(args.plain, args.count)),
    ):
        print(f"{side}: {counter.total / args.count:.0f} opcodes per execute")
        if args.by_function:
            for name, ops in sorted(counter.by_function.items()):
                print(f"    {ops / args.count:8.1f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
