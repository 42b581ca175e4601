"""The NPU's busy fraction under a saturating load, by how its instances share executor processes.

    python -m bench.studies.npu_busy [--rounds 2] [--window 4] [--variants 0x2,1x2]

The load of tests/e2e/npu/test_devices.py: an emulated `.om` of 20 ms device time per batch of
8 rows x 1024 FP32, copies at 8 MB/s each way (4 ms, holding the executor's GIL as pyACL's
memcpy does), 6 client threads sending 8-row requests back to back over HTTP. Each variant is
`<executor_instances_per_process>x<count>` (0: all instances of the NPU in one process). The
emulator's devices are shared by every process of the server (its timeline directory), so the
busy fraction (`ascend_npu_utilization{engine="aicore"}`, read after a 1 s warm-up and again
after the window) is the one device's, whichever process fed it. Variants alternate round by
round (A B A B ...); the server and its executors run on CPU 0, the clients on CPU 1.
NPU_BUSY_SPY=<file> records the first executor with py-spy (`--gil --idle`, raw) per window.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from harness.serverproc import running_server

ROOT = Path(__file__).resolve().parents[2]
EMULATOR = ROOT / "tests" / "npu" / "emulator"  # put on the server's PYTHONPATH, not imported
FEATURES, ROWS, DEVICE_MS, COPY_BYTES_PER_S, CLIENTS = 1024, 8, 20, 8e6, 6
SERVER_CPU, CLIENT_CPU = 0, 1


def manifest() -> dict:
    """The emulated `.om` (tests/npu/emulator's format, as npu_emulated.py writes it):
    INPUT0 [-1, 1024] FP32 -> OUTPUT0 = INPUT0 * 2 + 1 and OUTPUT1 = row sums, gears 4 and 8,
    DEVICE_MS per execution."""
    fp32, nd = 0, 2  # ACL_FLOAT, ACL_FORMAT_ND
    return {
        "format": "acl-emulator-om",
        "version": 1,
        "inputs": [{"name": "INPUT0", "dtype": fp32, "format": nd, "dims": [-1, FEATURES]}],
        "outputs": [
            {"name": "OUTPUT0", "dtype": fp32, "format": nd, "dims": [-1, FEATURES]},
            {"name": "OUTPUT1", "dtype": fp32, "format": nd, "dims": [-1, 1]},
        ],
        "weight_size": 4096,
        "work_size": 4096,
        "compute": [
            {
                "op": "scale_add",
                "inputs": ["INPUT0"],
                "output": "OUTPUT0",
                "scale": 2.0,
                "bias": 1.0,
            },
            {"op": "row_sum", "inputs": ["INPUT0"], "output": "OUTPUT1"},
        ],
        "dynamic_batch": [4, ROWS],
        "latency_ms": {"fixed": DEVICE_MS},
    }


def repository(root: Path, per_process: int, count: int) -> Path:
    repo = root / "models"
    (repo / "busy" / "1").mkdir(parents=True)
    (repo / "busy" / "1" / "model.om").write_text(json.dumps(manifest()))
    (repo / "busy" / "config.pbtxt").write_text(
        'name: "busy"\nbackend: "ascend"\n'
        f"instance_group [ {{ kind: KIND_GPU, count: {count}, gpus: [ 0 ] }} ]\n"
        'parameters { key: "executor_instances_per_process" '
        f'value {{ string_value: "{per_process}" }} }}\n'
    )
    return repo


def aicore(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=10).text
    match = re.search(
        r'^ascend_npu_utilization\{device="0",engine="aicore"\} (\S+)$', text, re.MULTILINE
    )
    assert match, text
    return float(match.group(1))


def measure(per_process: int, count: int, window: float, copy: float) -> tuple[float, int]:
    """(busy fraction over the window, inferences answered in it)."""
    import tritonclient.http as httpclient

    with tempfile.TemporaryDirectory(prefix="npu-busy-") as tmp:
        root = Path(tmp)
        repo = repository(root, per_process, count)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(EMULATOR), str(ROOT)]))
        config = {"device_count": 1, "copy_bytes_per_s": copy, "timeline_dir": str(root / "dev")}
        env["ACL_EMU_CONFIG"] = json.dumps(config)  # the executors share the one device
        everywhere = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {SERVER_CPU})  # the server and the executors it spawns
        try:
            server_cm = running_server([repo], ["--exit-timeout-secs", "10"], env=env, log_dir=root)
            server = server_cm.__enter__()
        finally:
            os.sched_setaffinity(0, {CLIENT_CPU} if len(everywhere) > 1 else everywhere)
        try:
            x = np.ones((ROWS, FEATURES), dtype=np.float32)
            stop, done = threading.Event(), [0]
            counting = threading.Event()

            def client() -> None:
                with httpclient.InferenceServerClient(server.http_url) as triton:
                    tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
                    tensor.set_data_from_numpy(x)
                    while not stop.is_set():
                        triton.infer("busy", [tensor])
                        if counting.is_set():
                            done[0] += 1

            threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
            for thread in threads:
                thread.start()
            time.sleep(1.0)
            aicore(server.metrics_url)
            counting.set()
            spy = _spy(server.pid, window) if os.environ.get("NPU_BUSY_SPY") else None
            time.sleep(window)
            if spy is not None:
                spy.wait(30)
            busy = aicore(server.metrics_url)
            counting.clear()
            stop.set()
            for thread in threads:
                thread.join(30)
            if os.environ.get("NPU_BUSY_LOG"):
                print(server.log()[-3000:])
            return busy, done[0]
        finally:
            server_cm.__exit__(None, None, None)
            os.sched_setaffinity(0, everywhere)


def _spy(server_pid: int, window: float) -> subprocess.Popen:
    """py-spy over the first executor for the window (NPU_BUSY_SPY=<output file>): where its
    threads spend their time, GIL holder included."""
    from harness.procutil import children_running

    supervisor = children_running(server_pid, b"npu.executor.main")[0]
    executor = children_running(supervisor, b"npu.executor.main")[0]  # its child
    command = ["py-spy", "record", "--gil", "--idle", "-r", "200", "-f", "raw"]
    command += ["-d", str(int(window)), "-o", os.environ["NPU_BUSY_SPY"], "-p", str(executor)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--variants", default="0x2,1x2")
    parser.add_argument(
        "--copy-bytes-per-s", type=float, default=COPY_BYTES_PER_S, help="each way, GIL held"
    )
    args = parser.parse_args()
    variants = [tuple(int(v) for v in item.split("x")) for item in args.variants.split(",")]
    results: dict[tuple[int, ...], list[tuple[float, int]]] = {v: [] for v in variants}
    for round_ in range(args.rounds):
        for variant in variants:
            busy, answered = measure(variant[0], variant[1], args.window, args.copy_bytes_per_s)
            results[variant].append((busy, answered))
            print(
                f"round {round_ + 1}: instances/process {variant[0]} count {variant[1]}: "
                f"busy {busy:.2f}, {answered / args.window:.0f} inf/s",
                flush=True,
            )
    print("\n| instances per process | instances | busy (each round) | inf/s (each round) |")
    print("|---|---|---|---|")
    for variant, rows in results.items():
        busy_each = " / ".join(f"{b:.2f}" for b, _ in rows)
        rate_each = " / ".join(f"{n / args.window:.0f}" for _, n in rows)
        print(f"| {variant[0] or 'all'} | {variant[1]} | {busy_each} | {rate_each} |")


if __name__ == "__main__":
    main()
