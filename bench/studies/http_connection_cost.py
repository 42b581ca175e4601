"""CPU per small infer request in the HTTP connection itself, with no socket and no scheduler.

Why: the HTTP path's cost per request is spread over uvicorn's protocol, ours, decoding and
encoding, and a server timing on this 2-core machine moves 5-10 % a round, more than any one
of them. Here the real protocol class (server/http/fast_path.py) and the real HttpFrontend are
fed perf_analyzer's py_add request (JSON header, two binary FP32 [1, 16] inputs, binary
outputs asked) over a fake transport, on uvloop, with a core that answers at once. Two figures:

- `connection`: decoding, the core and encoding replaced by canned results, so what is left is
  parsing, the request's start, the body, the answer's head and write, keep-alive bookkeeping;
- `whole`: the frontend's real decode and encode too (the core still answers at once).

Each tree runs in its own process (PYTHONPATH set to it), rounds interleaved, best of five
batches per round, the median of the rounds reported. Pin it (`taskset -c 1`) on a quiet
machine.

    .venv/bin/python -m bench.studies.http_connection_cost [--tree base=../base --tree new=.]
        [--rounds 3] [--requests 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Run inside the tree under test: it imports that tree's server.
_PROBE = r"""
import asyncio, gc, json, sys, time
import numpy as np, orjson, uvloop
from uvicorn.config import Config
from uvicorn.server import ServerState
from protocol.types import InferResponse, Tensor
from server.http.fast_path import protocol_class
from server.http.routes import HttpFrontend
from server.settings import ServerSettings

REQUESTS = int(sys.argv[1])
VALUES = np.arange(16, dtype=np.float32).reshape(1, 16)


class Transport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.written = 0
        self.protocol = None

    def write(self, data):
        self.written += len(data)

    def writelines(self, parts):
        for part in parts:
            self.written += len(part)

    def close(self):
        raise AssertionError("the connection was closed")

    def is_closing(self):
        return False

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def get_protocol(self):
        return self.protocol

    def set_protocol(self, protocol):
        self.protocol = protocol

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


class Core:
    may_trace = False
    propagates_trace = False
    exiting = False

    def __init__(self):
        self.settings = ServerSettings()


def request_bytes():
    header = orjson.dumps({
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "FP32",
             "parameters": {"binary_data_size": 64}} for n in ("INPUT0", "INPUT1")],
        "outputs": [{"name": n, "parameters": {"binary_data": True}}
                    for n in ("OUTPUT0", "OUTPUT1")],
    })
    body = header + VALUES.tobytes() * 2
    head = ["POST /v2/models/py_add/infer HTTP/1.1", "Host: 127.0.0.1:8000",
            "User-Agent: perf_analyzer", "Accept: */*",
            f"Inference-Header-Content-Length: {len(header)}",
            "Content-Type: application/octet-stream", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body, body, len(header)


async def measure(canned):
    core = Core()
    frontend = HttpFrontend(core)
    data, body, header_length = request_bytes()
    outputs = [Tensor(n, "FP32", (1, 16), VALUES, {}) for n in ("OUTPUT0", "OUTPUT1")]
    done = asyncio.get_running_loop().create_future()
    done.set_result(None)

    def answer(request, on_done, endpoint):
        on_done(InferResponse(model_name="py_add", model_version="1", outputs=list(outputs)), None)
        return done

    core.infer_nowait = answer
    if canned:
        headers = {"content-length": str(len(body)),
                   "inference-header-content-length": str(header_length)}
        decoded = frontend.decode_small("py_add", "", headers, bytearray(body), ())
        encoded = frontend.encode_small(
            InferResponse(model_name="py_add", model_version="1", outputs=outputs), decoded)
        frontend.decode_small = lambda *args: decoded
        frontend.encode_small = lambda *args: encoded
    config = Config(app=frontend.build_app(), log_config=None)
    config.load()
    protocol = protocol_class(frontend)(config, ServerState(), {}, asyncio.get_running_loop())
    transport = Transport()
    transport.protocol = protocol
    protocol.connection_made(transport)
    protocol.data_received(data)
    assert transport.written > 200, "no answer was written"
    gc.collect(); gc.freeze(); gc.set_threshold(10_000, 10, 10)  # as the server settles
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(REQUESTS):
            protocol.data_received(data)
        best = min(best, (time.perf_counter() - start) / REQUESTS * 1e6)
    return best


print(json.dumps({"connection": uvloop.run(measure(True)), "whole": uvloop.run(measure(False))}))
"""


def _probe(tree: Path, requests: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(requests)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="label=path (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args()
    trees = [tuple(item.split("=", 1)) for item in args.tree] or [("this tree", str(ROOT))]
    figures: dict[str, dict[str, list[float]]] = {
        label: {"connection": [], "whole": []} for label, _ in trees
    }
    for _ in range(args.rounds):
        for label, path in trees:
            result = _probe(Path(path).resolve(), args.requests)
            for key, value in result.items():
                figures[label][key].append(value)
    print("µs per py_add HTTP request through the protocol (median of rounds; rounds):")
    print("| tree | connection only | whole (decode, encode) |")
    print("|---|---:|---:|")
    for label, _ in trees:
        cells = []
        for key in ("connection", "whole"):
            values = figures[label][key]
            rounds = ", ".join(f"{v:.1f}" for v in values)
            cells.append(f"{statistics.median(values):.1f} ({rounds})")
        print(f"| {label} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
