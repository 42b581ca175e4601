"""Python function calls per inference in the server's process, for one or two source trees.

Why: the loop's cost per request is flat (no function over a few per cent, bench/FINDINGS.md 35),
and a cut of a few microseconds is below what a timing on this shared 2-core machine resolves
(A/B rounds move 10 %). A call count does not move with the machine: the server runs under
cProfile (pinned to CPU 0, perf_analyzer on CPU 1, py_add), and the calls it made while loaded,
less those of an idle run of the same tree (start, five seconds, stop), over the inferences its
statistics counted, is what one request costs in Python calls. It depends on the batches the
load formed (per-batch calls are shared), which are reported beside it; cProfile roughly
halves the server's speed, so batches are those of a slower server. Only the first process
is counted (not the Python model's worker).

    .venv/bin/python -m bench.studies.calls_per_request [--protocol http] [--concurrency 8]
        [--tree base=../base --tree new=.] [--top 25]
"""

from __future__ import annotations

import argparse
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from harness.serverproc import free_port, loopback_listeners, wait_until_ready

ROOT = Path(__file__).resolve().parents[2]
MODEL = "py_add"
SERVER_CPU, CLIENT_CPU = 0, 1
OURS = ("server", "protocol", "scheduler", "backends", "repository", "npu")


def _group(filename: str) -> str:
    """Where a function lives: one of our packages, a third-party package, or C builtins."""
    if filename == "~":
        return "builtins (C)"
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0]
    for package in OURS:
        if f"/{package}/" in filename:
            return package
    if "/lib/python3" in filename:
        return "stdlib " + filename.rsplit("/lib/python3", 1)[1].split("/", 2)[1]
    return "other"


def _calls(profile: Path, tree: Path) -> tuple[int, Counter, Counter]:
    loaded: Any = pstats.Stats(str(profile))  # its `stats` table is not in typeshed
    stats = loaded.stats
    total = 0
    groups: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for (filename, line, name), (_, calls, _, _, _) in stats.items():
        total += calls
        groups[_group(filename)] += calls
        short = filename.split("site-packages/")[-1].split(str(tree) + "/")[-1]
        functions[f"{short}:{line} {name}"] += calls
    return total, groups, functions


def _profiled_run(
    tree: Path, out: Path, protocol: str, concurrency: int, seconds: float
) -> tuple[int, int]:
    """One server run under cProfile; with `seconds` > 0 perf_analyzer loads it that long.
    Returns the inferences and batches its statistics counted."""
    repo = out.parent / "models"
    if not repo.exists():
        shutil.copytree(ROOT / "bench" / "models" / MODEL, repo / MODEL)
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    command = [
        "taskset", "-c", str(SERVER_CPU), sys.executable, "-m", "cProfile", "-o", str(out),
        "-m", "server", "--model-repository", str(repo),
        *loopback_listeners(http_port, grpc_port, metrics_port),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(tree))
    with open(out.with_suffix(".log"), "wb") as log:
        process = subprocess.Popen(command, cwd=tree, env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{http_port}"
    try:
        if not wait_until_ready(base, process, 90):
            raise RuntimeError(f"server did not start: {out.with_suffix('.log')}")
        if seconds > 0:
            perf_analyzer = os.environ.get("PERF_ANALYZER") or shutil.which("perf_analyzer")
            if not perf_analyzer:
                raise SystemExit("perf_analyzer not found (set PERF_ANALYZER)")
            url = f"127.0.0.1:{http_port if protocol == 'http' else grpc_port}"
            subprocess.run(
                ["taskset", "-c", str(CLIENT_CPU), perf_analyzer, "-m", MODEL, "-i", protocol,
                 "-u", url, "--concurrency-range", str(concurrency),
                 "--measurement-interval", str(int(seconds * 1000)), "--max-trials", "1"],
                capture_output=True, timeout=seconds * 10 + 60, check=False,
            )  # fmt: skip
        else:
            time.sleep(5)
        stats = httpx.get(f"{base}/v2/models/{MODEL}/stats", timeout=10).json()["model_stats"][0]
    finally:
        process.send_signal(signal.SIGTERM)  # a clean exit writes the profile
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    inferences, runs = int(stats["inference_count"]), int(stats["execution_count"])
    print(f"    {out.stem}: {inferences:,} inferences in {runs:,} batches")
    return inferences, runs


def measure(
    tree: Path, work: Path, protocol: str, concurrency: int, seconds: float
) -> tuple[float, dict[str, float], dict[str, float], float]:
    """(calls per inference, per group, per function, mean batch) for one tree."""
    idle, loaded = work / "idle.prof", work / "loaded.prof"
    _profiled_run(tree, idle, protocol, concurrency, 0)
    inferences, runs = _profiled_run(tree, loaded, protocol, concurrency, seconds)
    total0, groups0, functions0 = _calls(idle, tree)
    total1, groups1, functions1 = _calls(loaded, tree)
    n = max(1, inferences)
    per_group = {k: (groups1[k] - groups0[k]) / n for k in groups1}
    per_function = {k: (functions1[k] - functions0[k]) / n for k in functions1}
    return (total1 - total0) / n, per_group, per_function, inferences / max(1, runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--tree", action="append", default=[], help="LABEL=PATH (A/B: twice)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    trees = [t.split("=", 1) for t in args.tree] or [["this tree", str(ROOT)]]
    results = {}
    for label, path in trees:
        work = Path(tempfile.mkdtemp(prefix="calls-"))
        print(f"  {label} ({path}):")
        results[label] = measure(
            Path(path).resolve(), work, args.protocol, args.concurrency, args.seconds
        )
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nPython calls per {MODEL} inference, {args.protocol} c={args.concurrency}:")
    labels = list(results)
    print("| group | " + " | ".join(labels) + " |")
    print("|---|" + "---:|" * len(labels))
    print("| **all** | " + " | ".join(f"**{results[k][0]:.0f}**" for k in labels) + " |")
    print("| mean batch | " + " | ".join(f"{results[k][3]:.1f}" for k in labels) + " |")
    groups = sorted(
        {g for k in labels for g in results[k][1]}, key=lambda g: -results[labels[0]][1].get(g, 0)
    )
    for group in groups:
        values = [results[k][1].get(group, 0.0) for k in labels]
        if max(values) >= 0.5:
            print(f"| {group} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
    print(f"\nThe {args.top} functions called most per inference ({labels[-1]}):")
    last = results[labels[-1]][2]
    for name, calls in sorted(last.items(), key=lambda item: -item[1])[: args.top]:
        others = "".join(f"  ({k}: {results[k][2].get(name, 0.0):.2f})" for k in labels[:-1])
        print(f"  {calls:6.2f}  {name}{others}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
