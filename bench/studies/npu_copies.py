"""Server CPU per KB of tensor data on an identity-like model: NPU emulator and ONNX, HTTP binary
and gRPC, 4 KB / 150 KB / 600 KB / 4 MB per request (issue 26, item 2), as an A/B of two trees.

    .venv/bin/python -m bench.studies.npu_copies --a ../base-checkout [--b .] [--rounds 2]
        [--sizes 4096,153600,614400,4194304] [--concurrency 8] [--out DIR] [--pin]

Why: the bytes of a tensor cost the server CPU each time they are copied; the figure to judge
a change of the copy path by is CPU per KB, measured on both trees in the same minutes (rounds
alternate A B A B on this shared machine). The client is our own (tritonclient, binary
tensors, `--concurrency` threads, a fixed request count per point) rather than perf_analyzer,
which keeps every request's input until its run ends (4 MB x thousands of requests). CPU is the
server's whole process tree (the server, its NPU executors and their supervisors; the client
is in this process and not counted), over the requests the server counted, and the server
process alone (the executor's share includes the emulator's own work: its device memory is
Python's, and it copies in and out of it).

Models: `npu_id` (an emulated .om, UINT8 [-1, n] -> identity, gears 1-8, 50 µs of device time,
copies at 20 GB/s so the device is never the limit) and `onnx_id` (ONNX Identity, UINT8 [-1, n],
dynamic batching on both). The answer is as large as the request: per KB means per KB of input,
the output's bytes riding along. `--pin` runs each server and its children on CPU 0 and the
client on CPU 1, as bench/cpu_side_by_side.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from onnx import TensorProto, helper

from bench.cpu_time import process_cpu, process_tree
from examples.common import finish_model, write_model_dir
from harness.serverproc import free_port

ROOT = Path(__file__).resolve().parents[2]
SIZES = (4096, 150 * 1024, 600 * 1024, 4 << 20)
GEARS = [1, 2, 4, 8]
EMULATOR_CONFIG = {"device_count": 1, "copy_bytes_per_s": 20e9, "memory_bytes": 16 << 30}
BATCHING = "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
SERVER_CPU, CLIENT_CPU = 0, 1  # with --pin


def requests_for(size: int) -> int:
    """Enough requests for a stable CPU count, bounded in bytes (about 400 MB each way)."""
    return max(40, min(3000, (400 << 20) // size))


def write_repository(repo: Path, size: int) -> None:
    manifest = {
        "format": "acl-emulator-om",
        "version": 1,
        "inputs": [{"name": "INPUT0", "dtype": 4, "format": 2, "dims": [-1, size]}],
        "outputs": [{"name": "OUTPUT0", "dtype": 4, "format": 2, "dims": [-1, size]}],
        "compute": [{"op": "identity", "inputs": ["INPUT0"], "output": "OUTPUT0"}],
        "dynamic_batch": GEARS,
        "latency_ms": {"fixed": 0.05, "per_sample": 0},
    }
    npu = repo / "npu_id"
    (npu / "1").mkdir(parents=True, exist_ok=True)
    (npu / "1" / "model.om").write_text(json.dumps(manifest))
    (npu / "config.pbtxt").write_text(
        f'name: "npu_id"\nbackend: "ascend"\nmax_batch_size: {GEARS[-1]}\n' + BATCHING
    )
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "onnx_id",
        [helper.make_tensor_value_info("INPUT0", TensorProto.UINT8, ["b", size])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.UINT8, ["b", size])],
    )
    config = (
        f'name: "onnx_id"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {GEARS[-1]}\n'
        'input [{ name: "INPUT0" data_type: TYPE_UINT8 dims: [ ' + str(size) + " ] }]\n"
        'output [{ name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ ' + str(size) + " ] }]\n"
        "instance_group [{ count: 1 kind: KIND_CPU }]\n" + BATCHING
    )
    write_model_dir(repo, "onnx_id", finish_model(graph, "UINT8 passthrough."), config)


class Server:
    """One tree's server (run from the tree itself), stopped by pid."""

    def __init__(self, tree: Path, repo: Path, log: Path, pin: bool = False) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        command = [sys.executable, "-m", "server", "--model-repository", str(repo)]
        if pin:
            command = ["taskset", "-c", str(SERVER_CPU), *command]
        command += ["--http-address", "127.0.0.1", "--http-port", str(self.http_port)]
        command += ["--grpc-address", "127.0.0.1", "--grpc-port", str(self.grpc_port)]
        command += ["--metrics-address", "127.0.0.1", "--metrics-port", str(free_port())]
        emulator = tree / "tests" / "npu" / "emulator"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(emulator), str(tree)]))
        # The server's executor processes share each emulated device (timeline and memory).
        devices = tempfile.mkdtemp(prefix="acl-emu-devices-")
        env["ACL_EMU_CONFIG"] = json.dumps({**EMULATOR_CONFIG, "timeline_dir": devices})
        self._log = open(log, "w")
        self.process = subprocess.Popen(
            command, cwd=tree, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: see {log}")
            try:
                url = f"http://127.0.0.1:{self.http_port}/v2/health/ready"
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"server not ready: see {log}")

    def tree_cpu(self) -> float:
        return sum(process_cpu(pid) for pid in process_tree(self.process.pid))

    def served(self, model: str) -> int:
        url = f"http://127.0.0.1:{self.http_port}/v2/models/{model}/stats"
        stats = httpx.get(url, timeout=10).json()["model_stats"][0]
        return int(stats["inference_stats"]["success"]["count"])

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


def drive(server: Server, model: str, protocol: str, size: int, total: int, threads: int) -> None:
    """`total` requests from `threads` threads, each with a client of its own; checks answers."""
    data = (np.arange(size, dtype=np.int64) % 251).astype(np.uint8).reshape(1, size)
    errors: list[str] = []

    def worker(count: int) -> None:
        if protocol == "http":
            import tritonclient.http as client_module

            client: Any = client_module.InferenceServerClient(
                f"127.0.0.1:{server.http_port}", network_timeout=120.0
            )
            tensor = client_module.InferInput("INPUT0", [1, size], "UINT8")
            tensor.set_data_from_numpy(data, binary_data=True)
            wanted = [client_module.InferRequestedOutput("OUTPUT0", binary_data=True)]
        else:
            import tritonclient.grpc as client_module

            options = [("grpc.max_receive_message_length", 64 << 20)]
            options.append(("grpc.max_send_message_length", 64 << 20))
            client = client_module.InferenceServerClient(
                f"127.0.0.1:{server.grpc_port}", channel_args=options
            )
            tensor = client_module.InferInput("INPUT0", [1, size], "UINT8")
            tensor.set_data_from_numpy(data)
            wanted = [client_module.InferRequestedOutput("OUTPUT0")]
        for _ in range(count):
            result = client.infer(model, [tensor], outputs=wanted)
            out = result.as_numpy("OUTPUT0")
            if out is None or out.shape != (1, size) or out[0, size - 1] != data[0, size - 1]:
                errors.append("wrong answer")
                return
        client.close()

    share = [total // threads + (1 if i < total % threads else 0) for i in range(threads)]
    workers = [threading.Thread(target=worker, args=(n,)) for n in share]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    if errors:
        raise RuntimeError(f"{model} {protocol} {size}: {errors[0]}")


def point(server: Server, model: str, protocol: str, size: int, threads: int) -> dict[str, Any]:
    drive(server, model, protocol, size, max(threads * 2, 16), threads)  # warm
    total = requests_for(size)
    before_count, before_cpu = server.served(model), server.tree_cpu()
    before_own = process_cpu(server.process.pid)
    started = time.monotonic()
    drive(server, model, protocol, size, total, threads)
    wall = time.monotonic() - started
    cpu = server.tree_cpu() - before_cpu
    own = process_cpu(server.process.pid) - before_own
    count = server.served(model) - before_count
    us, own_us = 1e6 * cpu / count, 1e6 * own / count
    kb = size / 1024
    return {
        "model": model,
        "protocol": protocol,
        "size": size,
        "requests": count,
        "infer_per_s": count / wall,
        "cpu_us_per_infer": us,
        "cpu_us_per_kb": us / kb,
        # The server process alone: what the copy path there costs, without the executor,
        # whose CPU includes the emulator's own work (its device memory is Python's).
        "server_us_per_infer": own_us,
        "server_us_per_kb": own_us / kb,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="the base tree")
    parser.add_argument("--b", type=Path, default=ROOT, help="the changed tree")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--models", default="npu_id,onnx_id")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("npu_copies_report"))
    parser.add_argument("--pin", action="store_true", help="server on CPU 0, client on CPU 1")
    args = parser.parse_args(argv)
    if args.pin:
        os.sched_setaffinity(0, {CLIENT_CPU})
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for size in [int(s) for s in args.sizes.split(",")]:
        repo = args.out / f"models_{size}"
        write_repository(repo, size)
        for round_no in range(args.rounds):
            for label, tree in (("A", args.a), ("B", args.b)):
                log = args.out / f"{label}-{size}-{round_no}.log"
                server = Server(tree.resolve(), repo, log, args.pin)
                try:
                    for model in args.models.split(","):
                        for protocol in args.protocols.split(","):
                            row = point(server, model, protocol, size, args.concurrency)
                            row.update(tree=label, round=round_no)
                            rows.append(row)
                            print(json.dumps(row), flush=True)
                finally:
                    server.stop()
    (args.out / "npu_copies.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
