"""gRPC on grpc.aio against grpcio's synchronous server (--grpc-server aio|threads), py_add.

Why a study beside bench/ab/python_model_ab.py: on a loaded machine perf_analyzer often cannot
reach a stable measurement and the A/B then loses the round. Here perf_analyzer only makes the
load (its own verdict is ignored); the figures are the server's: inferences its statistics
counted over a fixed window, the server tree's CPU and voluntary context switches from /proc
per inference, split by thread kind (the event loop, the other Python threads of the server,
grpc core's own threads, the Python model's worker). Rounds alternate the two servers (A B A B)
at each concurrency, each pinned to CPU 0, perf_analyzer on CPU 1.

    .venv/bin/python -m bench.studies.grpc_threads_floor [--rounds 3] [--concurrency 8,1]
        [--seconds 6] [--out-dir bench/out/grpc_threads]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench import served
from bench.ab.python_model_ab import start
from bench.cpu_side_by_side import CLIENT_CPU
from bench.cpu_time import process_tree
from harness.perf_analyzer import default_cache, locate

ROOT = Path(__file__).resolve().parents[2]
MODEL = "py_add"
SERVERS = {"aio": [], "threads": ["--grpc-server", "threads"]}
GRPC_CORE_THREADS = ("event_engine", "grpc_global_tim", "lifeguard")


@dataclass
class Run:
    server: str
    concurrency: int
    round: int
    infer_per_sec: float = 0.0
    cpu_us: float = 0.0
    switches: float = 0.0
    batch: float = 0.0
    split: dict[str, tuple[float, float]] = field(default_factory=dict)  # kind: (µs, switches)
    error: str = ""


def _threads(root: int) -> dict[tuple[int, str], tuple[str, float, int]]:
    """Every thread of the tree: (pid, tid) -> (kind, CPU seconds, voluntary switches)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in process_tree(root):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
                status = (task / "status").read_text()
                comm = (task / "comm").read_text().strip()
            except OSError:
                continue
            switches = next(
                int(line.split()[1])
                for line in status.splitlines()
                if line.startswith("voluntary_ctxt_switches:")
            )
            if pid != root:
                kind = "worker"
            elif task.name == str(root):
                kind = "loop"
            elif comm.startswith(GRPC_CORE_THREADS):
                kind = "grpc core"
            else:
                kind = "other Python threads"
            out[(pid, task.name)] = (kind, (int(stat[11]) + int(stat[12])) / tick, switches)
    return out


def measure(
    perf_analyzer: str, name: str, concurrency: int, round_no: int, args: argparse.Namespace
) -> Run:
    run = Run(name, concurrency, round_no)
    server = start(ROOT, name, args.out_dir / "models", args.out_dir, round_no, SERVERS[name])
    try:
        server.wait_ready()
        load = [
            "taskset",
            "-c",
            str(CLIENT_CPU),
            perf_analyzer,
            "-m",
            MODEL,
            "-i",
            "grpc",
            "-u",
            server.grpc,
            "--concurrency-range",
            str(concurrency),
            "--measurement-interval",
            str(int(args.seconds * 1000)),
            "--max-trials",
            "50",
        ]
        client = subprocess.Popen(load, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(args.warmup)
            base = f"http://{server.http}"
            stats_before, threads_before = (
                served.model_stats(base, MODEL),
                _threads(server.process.pid),
            )
            began = time.monotonic()
            time.sleep(args.seconds)
            threads_after = _threads(server.process.pid)
            elapsed = time.monotonic() - began
            split = served.server_split(stats_before, served.model_stats(base, MODEL))
        finally:
            client.kill()
            client.wait()
        if split.requests <= 0:
            run.error = "no inference counted"
            return run
        kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for key, (kind, cpu, switches) in threads_after.items():
            _, cpu0, switches0 = threads_before.get(key, (kind, 0.0, 0))
            kinds[kind][0] += cpu - cpu0
            kinds[kind][1] += switches - switches0
        n = split.requests
        run.infer_per_sec = n / elapsed
        run.cpu_us = 1e6 * sum(v[0] for v in kinds.values()) / n
        run.switches = sum(v[1] for v in kinds.values()) / n
        run.batch = split.avg_batch
        run.split = {k: (1e6 * v[0] / n, v[1] / n) for k, v in sorted(kinds.items())}
    except RuntimeError as exc:
        run.error = str(exc).splitlines()[0]
    finally:
        server.stop()
    return run


def report(runs: list[Run]) -> list[str]:
    kinds = sorted({k for r in runs for k in r.split})
    lines = [
        "| c | round | server | inf/s | CPU µs/inf | switches/inf | batch | "
        + " | ".join(f"{k} µs (switches)" for k in kinds)
        + " |",
        "|---:|---:|---|---:|---:|---:|---:|" + "---:|" * len(kinds),
    ]
    for r in runs:
        if r.error:
            lines.append(f"| {r.concurrency} | {r.round} | {r.server} | failed: {r.error} |")
            continue
        cells = " | ".join(
            f"{r.split[k][0]:,.0f} ({r.split[k][1]:.2f})" if k in r.split else "-" for k in kinds
        )
        lines.append(
            f"| {r.concurrency} | {r.round} | {r.server} | {r.infer_per_sec:,.0f} | "
            f"{r.cpu_us:,.0f} | {r.switches:.2f} | {r.batch:.2f} | {cells} |"
        )
    lines += [
        "",
        "| c | threads / aio, CPU per inference, each round | median |",
        "|---:|---|---:|",
    ]
    for c in sorted({r.concurrency for r in runs}, reverse=True):
        ratios = []
        for round_no in sorted({r.round for r in runs}):
            pair = {r.server: r for r in runs if (r.concurrency, r.round) == (c, round_no)}
            if all(s in pair and not pair[s].error for s in SERVERS):
                ratios.append(pair["threads"].cpu_us / pair["aio"].cpu_us)
        if ratios:
            lines.append(
                f"| {c} | {', '.join(f'{x:.2f}' for x in ratios)} | "
                f"{statistics.median(ratios):.2f} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="8,1")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out" / "grpc_threads")
    args = parser.parse_args(argv)
    found = locate(os.environ, default_cache(os.environ), install=True, python=sys.executable)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    repo = args.out_dir / "models"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(ROOT / "bench" / "models" / MODEL, repo / MODEL)
    runs: list[Run] = []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        for round_no in range(1, args.rounds + 1):
            for name in SERVERS:
                run = measure(str(found), name, concurrency, round_no, args)
                print(
                    f"c={concurrency} round {round_no} {name}: "
                    + (
                        run.error
                        or f"{run.infer_per_sec:,.0f} inf/s, {run.cpu_us:,.0f} µs/inf, "
                        f"{run.switches:.2f} switches/inf, batch {run.batch:.2f}"
                    ),
                    flush=True,
                )
                runs.append(run)
    lines = [f"load average at the end: {os.getloadavg()[0]:.2f}", "", *report(runs)]
    (args.out_dir / "report.md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
