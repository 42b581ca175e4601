"""Issue 26 item 1's live probe: /v2/health/live gaps while an NPU model loads, unloads, swaps.

    python -m bench.studies.npu_live_gap [--out DIR] [--rounds 5] [--spy]

One server (explicit model control, the pyACL emulator on its PYTHONPATH) with the emulated
310P ResNet50 of `npu_emulated` (load 3 s). A thread polls /v2/health/live every 5 ms and
records the time between answers while each operation runs: a load, an unload, and a hot swap
(version 2 added to the repository, then the model loaded again, so the registry swaps
versions). Reported per operation over `--rounds`: the longest gap and the p99 gap. With
`--spy`, py-spy records the server's process (`--gil`) during the rounds, to find what holds it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.studies.npu_emulated import EMULATOR, EMULATOR_CONFIG, ROOT, manifest
from harness.serverproc import running_server

MODEL = "resnet50_load"
POLL_S = 0.005


def write_repository(root: Path) -> Path:
    repo = root / "models"
    model_dir = repo / MODEL
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.om").write_text(json.dumps(manifest("resnet50_u8")))
    (model_dir / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nbackend: "ascend"\nmax_batch_size: 32\n'
        "instance_group [ { count: 2, gpus: [ 0 ] } ]\n"
        "dynamic_batching { preferred_batch_size: [ 16, 32 ] }\n"
    )
    return repo


def probed(base: str, call: Any) -> tuple[int, list[float]]:
    """Runs `call()` while a thread polls /v2/health/live; returns its status and the gaps (s)."""
    stop = threading.Event()
    gaps: list[float] = []

    def poll() -> None:
        with httpx.Client(timeout=30) as client:
            last = time.monotonic()
            while not stop.is_set():
                ok = client.get(f"{base}/v2/health/live").status_code == 200
                now = time.monotonic()
                if ok:
                    gaps.append(now - last)
                    last = now
                time.sleep(POLL_S)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    time.sleep(0.1)
    status = call()
    time.sleep(0.1)
    stop.set()
    poller.join()
    return status, gaps


def summary(gaps: list[float]) -> dict[str, float]:
    ordered = sorted(gaps)
    return {
        "longest_gap_ms": 1e3 * ordered[-1],
        "p99_gap_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "answers": len(ordered),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("npu_live_gap_report"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--spy", action="store_true", help="py-spy record the server (--gil)")
    args = parser.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    repo = write_repository(args.out)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(EMULATOR), str(ROOT)]))
    # The server's executor processes share each emulated device (its timeline and memory).
    devices = tempfile.mkdtemp(prefix="acl-emu-devices-")
    env["ACL_EMU_CONFIG"] = json.dumps({**EMULATOR_CONFIG, "timeline_dir": devices})
    flags = ["--model-control-mode", "explicit", "--exit-timeout-secs", "10"]
    url = "/v2/repository/models/" + MODEL
    found: dict[str, list[float]] = {"load": [], "unload": [], "swap": []}
    with running_server([repo], flags, env=env, wait_ready=False, log_dir=args.out) as server:
        spy = None
        if args.spy:
            spy = subprocess.Popen(
                [str(ROOT / ".venv" / "bin" / "py-spy"), "record", "--gil", "-r", "200",
                 "-f", "raw", "-o", str(args.out / "spy.txt"), "-p", str(server.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1.0)
        with httpx.Client(base_url=server.base, timeout=120) as client:
            for round_ in range(args.rounds):
                for op, path in (("load", "/load"), ("unload", "/unload")):
                    status, gaps = probed(
                        server.base, lambda p=path: client.post(url + p).status_code
                    )
                    found[op] += gaps
                    print(
                        json.dumps({"round": round_, "op": op, "status": status, **summary(gaps)})
                    )
            client.post(url + "/load")
            for round_ in range(args.rounds):
                new = repo / MODEL / str(round_ + 2)
                shutil.copytree(repo / MODEL / str(round_ + 1), new)
                status, gaps = probed(server.base, lambda: client.post(url + "/load").status_code)
                found["swap"] += gaps
                print(
                    json.dumps({"round": round_, "op": "swap", "status": status, **summary(gaps)})
                )
                shutil.rmtree(repo / MODEL / str(round_ + 1))
        if spy is not None:
            spy.send_signal(2)
            spy.wait(timeout=60)
    report = {op: summary(gaps) for op, gaps in found.items()}
    print(json.dumps(report))
    (args.out / "npu_live_gap.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
