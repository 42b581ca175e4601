"""Issue 26's deciding benchmark: a 310P-class ResNet50 served on the pyACL emulator.

    PERF_ANALYZER=/path/perf_analyzer python -m bench.studies.npu_emulated [--out DIR] [--quick]

The emulated `.om` (tests/npu/emulator, put on the server's PYTHONPATH; nothing here imports
it) takes the timing of a ResNet50 on a 310P: load 3 s, copies at 5 GB/s, device time
2.2 ms + 0.2 ms per row at gears 1/2/4/8/16/32, devices in parallel, so ~3,700 rows/s per
device at gear 32 (the device-only figure: computed from that timing, as the emulator spends
exactly it). Two inputs kinds: UINT8 [224,224,3] images through static AIPP (RGB888, 150 KB a
request) and FP32 [3,224,224] tensors (602 KB). perf_analyzer drives it at concurrency 64 over
HTTP and gRPC (binary tensors), each window bounded by a request count
(`--measurement-request-count`), since perf_analyzer keeps every request's input until its run
ends. Reported per point: served inferences/s and that over device-only, the device's busy
fraction (`ascend_npu_utilization{engine="aicore"}` read before and after the point: the
emulator reports busy time over the time since the last read), server CPU (server process and
its NPU executors) per inference and per KB of request, the average batch and gear. Then the
longest gap in /v2/health/live answers (polled every 10 ms) while a 3 s model load runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.cpu_time import process_tree
from bench.served import run_point
from harness.procutil import children_running
from harness.serverproc import running_server

ROOT = Path(__file__).resolve().parents[2]
EMULATOR = ROOT / "tests" / "npu" / "emulator"
GEARS = (1, 2, 4, 8, 16, 32)
FIXED_MS, PER_ROW_MS = 2.2, 0.2
DEVICE_ROWS_PER_S = GEARS[-1] / ((FIXED_MS + PER_ROW_MS * GEARS[-1]) / 1e3)
EMULATOR_CONFIG = {
    "device_count": 2,
    "copy_bytes_per_s": 5e9,
    "soc_name": "Ascend310P3",
    "memory_bytes": 8 << 30,
}
KINDS = {  # model name -> (request bytes, manifest input)
    "resnet50_u8": 224 * 224 * 3,
    "resnet50_fp32": 3 * 224 * 224 * 4,
}
CONCURRENCY = 64


def manifest(kind: str) -> dict[str, Any]:
    """An emulated .om: ResNet50 timing, a row sum standing in for the classifier."""
    dtype = 4 if kind == "resnet50_u8" else 0  # ACL_UINT8, ACL_FLOAT
    raw: dict[str, Any] = {
        "format": "acl-emulator-om",
        "version": 1,
        "inputs": [{"name": "image", "dtype": dtype, "format": 2, "dims": [-1, 3, 224, 224]}],
        "outputs": [{"name": "prob:0:prob", "dtype": 0, "format": 2, "dims": [-1, 1]}],
        "weight_size": 100 << 20,
        "work_size": 16 << 20,
        "compute": [{"op": "row_sum", "inputs": ["image"], "output": "prob:0:prob"}],
        "dynamic_batch": list(GEARS),
        "latency_ms": {"fixed": FIXED_MS, "per_sample": PER_ROW_MS},
        "soc": "Ascend310P3",
        "load_ms": 3000,
    }
    if kind == "resnet50_u8":
        raw["aipp"] = {"mode": "static", "input": "image", "format": 3, "src": [224, 224]}
    return raw


def write_repository(root: Path, gpus: list[int], count: int) -> Path:
    repo = root / "models"
    for kind in (*KINDS, "resnet50_load"):
        model_dir = repo / kind
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        base = "resnet50_u8" if kind == "resnet50_load" else kind
        (model_dir / "1" / "model.om").write_text(json.dumps(manifest(base)))
        (model_dir / "config.pbtxt").write_text(
            f'name: "{kind}"\nbackend: "ascend"\nmax_batch_size: 32\n'
            f"instance_group [ {{ count: {count}, gpus: [ {', '.join(map(str, gpus))} ] }} ]\n"
            "dynamic_batching { preferred_batch_size: [ 16, 32 ] "
            "max_queue_delay_microseconds: 2000 }\n"
        )
    return repo


def busy(metrics_url: str) -> dict[str, float]:
    """device -> aicore utilisation since the previous read (the emulator's window)."""
    text = httpx.get(metrics_url, timeout=10).text
    pattern = r'^ascend_npu_utilization\{device="(\d+)",engine="aicore"\} (\S+)$'
    return {m[0]: float(m[1]) for m in re.findall(pattern, text, re.MULTILINE)}


def process_cpu(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def average_gear(by_batch: dict[int, tuple[int, int]]) -> float:
    runs = sum(r for r, _ in by_batch.values())
    gears = sum(r * min(g for g in GEARS if g >= size) for size, (r, _) in by_batch.items())
    return gears / runs if runs else 0.0


def live_gap_during_load(base: str) -> dict[str, float]:
    """The longest gap between /v2/health/live answers while resnet50_load (3 s) loads."""
    stop = threading.Event()
    gaps: list[float] = []

    def poll() -> None:
        last = time.monotonic()
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                ok = client.get(f"{base}/v2/health/live").status_code == 200
                now = time.monotonic()
                if ok:
                    gaps.append(now - last)
                    last = now
                time.sleep(0.01)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    started = time.monotonic()
    response = httpx.post(f"{base}/v2/repository/models/resnet50_load/load", timeout=120)
    took = time.monotonic() - started
    stop.set()
    poller.join()
    return {"status": response.status_code, "load_s": took, "longest_gap_ms": 1e3 * max(gaps)}


def measure(
    perf: str, out: Path, gpus: list[int], count: int, runs: list[tuple[str, str]], requests: int
) -> list[dict[str, Any]]:
    root = out / f"{runs[0][0]}_dev{len(gpus)}_count{count}"
    repo = write_repository(root, gpus, count)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(EMULATOR), str(ROOT)]))
    # The server's executor processes share each emulated device (its timeline and memory).
    devices = tempfile.mkdtemp(prefix="acl-emu-devices-")
    env["ACL_EMU_CONFIG"] = json.dumps({**EMULATOR_CONFIG, "timeline_dir": devices})
    args = ["--model-control-mode", "explicit", "--exit-timeout-secs", "10"]
    for kind in sorted({kind for kind, _ in runs}):
        args += ["--load-model", kind]
    rows: list[dict[str, Any]] = []
    with running_server([repo], args, env=env, log_dir=root) as server:
        metrics = f"http://127.0.0.1:{server.metrics_port}/metrics"
        for kind, protocol in runs:
            url = server.http_url if protocol == "http" else server.grpc_url
            flags = ["--measurement-mode", "count_windows", "--measurement-request-count"]
            flags += [str(requests), "--stability-percentage", "100", "--max-trials", "3"]
            # Each executor runs as its supervisor's child: count the supervisors' trees.
            supervisors = children_running(server.pid, b"npu.executor.main")
            executors = [pid for sup in supervisors for pid in process_tree(sup)]
            cpu_before = process_cpu(executors)
            busy(metrics)  # starts the emulator's utilisation window
            point = run_point(
                perf, kind, protocol, url, server.base, server.pid, CONCURRENCY, root, flags, 300.0
            )
            fractions = busy(metrics)
            executor_cpu = process_cpu(executors) - cpu_before
            served = point.server.requests
            cpu_us = 1e6 * (point.cpu.server + executor_cpu) / served if served else 0.0
            rows.append(
                {
                    "model": kind,
                    "protocol": protocol,
                    "devices": len(gpus),
                    "instances_per_device": count,
                    "ok": point.ok,
                    "error": point.error,
                    "infer_per_s": point.infer_per_sec,
                    "device_only_rows_per_s": DEVICE_ROWS_PER_S * len(gpus),
                    "served_over_device": point.infer_per_sec / (DEVICE_ROWS_PER_S * len(gpus)),
                    "busy": fractions,
                    "server_cpu_us_per_infer": cpu_us,
                    "server_cpu_us_per_kb": cpu_us / (KINDS[kind] / 1024),
                    "loop_cpu_s": point.cpu.server,
                    "executor_cpu_s": executor_cpu,
                    "avg_batch": point.server.avg_batch,
                    "avg_gear": average_gear(point.server.infer_by_batch),
                    "p50_us": point.p50_us,
                    "p99_us": point.p99_us,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        if len(gpus) == 1 and count == 2 and runs[0][0] == "resnet50_u8":
            rows.append({"live_gap": live_gap_during_load(server.base)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("npu_emulated_report"))
    parser.add_argument("--requests", type=int, default=1500, help="requests per window")
    args = parser.parse_args(argv)
    perf = os.environ.get("PERF_ANALYZER", "perf_analyzer")
    args.out.mkdir(parents=True, exist_ok=True)
    both = [("resnet50_u8", "http"), ("resnet50_u8", "grpc")]
    fp32 = [("resnet50_fp32", "http"), ("resnet50_fp32", "grpc")]
    # One model per server: the emulator keeps device time per executor process.
    rows = measure(perf, args.out, [0], 2, both, args.requests)
    rows += measure(perf, args.out, [0], 2, fp32, args.requests)
    rows += measure(perf, args.out, [0], 1, [("resnet50_u8", "grpc")], args.requests)
    rows += measure(perf, args.out, [0, 1], 2, both, args.requests)
    (args.out / "npu_emulated.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
