"""Run the benchmark end to end and write bench/RESULTS.md.

    make bench                                   # or, with a perf_analyzer binary at hand:
    PERF_ANALYZER=/path/to/perf_analyzer python -m bench.run [--quick] [--results FILE]

Steps: build `conv_compute`, `conv_compute_nobatch`, `dense_compute`, `dense_compute_nobatch`,
`mlp_compute` and `simple` into bench/out/models (the example builders, so the files are
byte-identical to examples/models; `mlp_compute` is a bench-only model) and copy the Python model
`py_add` (bench/models) beside them; measure `conv_compute` (the throughput target's model),
`mlp_compute` (batching when the model is fast) and `dense_compute` (the per-request overhead
reference) offline at batch 1..64, and the direct batch-1 latency of `simple` (`session.run`) and
`py_add` (`execute` in-process); serve them and drive them with perf_analyzer over HTTP and gRPC;
measure offline once more; then the server CPU per inference beside Triton
(bench/cpu_side_by_side.py, 3 rounds) and what a request costs each process with
--frontend-processes (bench/handover_cost.py); write the report. About 16 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench import (
    cpu_side_by_side,
    floor,
    handover_cost,
    kserve_peer,
    offline,
    report,
    served,
)
from bench.machine import load_average, machine_info, portable
from bench.sections import carry_sections
from examples.build_repository import (
    build_conv_compute,
    build_conv_compute_nobatch,
    build_dense_compute,
    build_dense_compute_nobatch,
    build_simple,
)
from examples.mlp_compute import build_mlp_compute
from harness.serverproc import free_port, running_server

ROOT = Path(__file__).resolve().parents[1]
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
CONCURRENCIES = (1, 8, 32, 64)
PROTOCOLS = ("http", "grpc")
# The throughput target's model: compute (ms per inference) dominates per-request overhead.
TARGET_MODELS = {"on": "conv_compute", "off": "conv_compute_nobatch"}
# The per-request overhead reference: a few µs of compute, so it measures the server's cost.
REFERENCE_MODELS = {"on": "dense_compute", "off": "dense_compute_nobatch"}
# Batching when the model is fast: ~0.1 ms per inference at batch 64, ~0.7 ms at batch 1 (2 cores).
FAST_MODELS = {"on": "mlp_compute"}
MLP_CONCURRENCIES = (8, 32, 64)
LATENCY_MODEL = "simple"
PYTHON_MODEL = cpu_side_by_side.PY_MODEL  # bench/models/py_add, served beside the ONNX models
BUILDERS = (
    build_conv_compute,
    build_conv_compute_nobatch,
    build_dense_compute,
    build_dense_compute_nobatch,
    build_mlp_compute,
    build_simple,
)
# Offline window per repetition and batch size: `conv_compute` at batch 64 is ~0.2 s a call.
OFFLINE_SECONDS = {TARGET_MODELS["on"]: 1.0, REFERENCE_MODELS["on"]: 0.5, FAST_MODELS["on"]: 0.3}
QUICK_FLAGS = (
    "--measurement-interval",
    "1000",
    "--stability-percentage",
    "100",
    "--max-trials",
    "3",
)

_START = time.monotonic()


def progress(message: str) -> None:
    print(f"[{time.monotonic() - _START:6.1f}s] {message}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ascend-serve served/offline benchmark")
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="report file (default bench/RESULTS.md; OUT_DIR/RESULTS.md with --quick)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="models, perf_analyzer CSVs and logs, server log, results.json "
        "(default bench/out; bench/out/quick with --quick)",
    )
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCIES)))
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help=f"skip the per-request overhead reference ({REFERENCE_MODELS['on']})",
    )
    parser.add_argument(
        "--mlp-concurrency",
        default=",".join(map(str, MLP_CONCURRENCIES)),
        help=f"concurrencies for {FAST_MODELS['on']} (empty: skip it)",
    )
    parser.add_argument(
        "--cpu-rounds",
        type=int,
        default=None,
        help="rounds of bench/cpu_side_by_side.py (default 3, 1 with --quick; 0 skips it)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="short windows and one offline repetition: a smoke run, not numbers "
        "(the report says so in its header)",
    )
    return parser.parse_args(argv)


def find_perf_analyzer() -> str:
    path = os.environ.get("PERF_ANALYZER") or shutil.which("perf_analyzer")
    if not path:
        sys.exit(
            "perf_analyzer not found: set PERF_ANALYZER (make bench does: "
            "`.venv/bin/python -m harness.perf_analyzer` finds or installs one and prints its "
            "path) or put it on PATH"
        )
    return path


def measure_offline(
    model_dirs: list[Path],
    into: dict[str, list[offline.Throughput]],
    repetitions: int,
    quick: bool,
    when: str,
) -> None:
    """Offline runs before and after the served ones; the best of both is the reference."""
    for model_dir in model_dirs:
        seconds = 0.2 if quick else OFFLINE_SECONDS[model_dir.name]
        progress(
            f"offline {model_dir.name} ({when}): batch {list(BATCH_SIZES)}, "
            f"best of {repetitions} x {seconds}s"
        )
        runs = offline.throughput(model_dir, BATCH_SIZES, repetitions, seconds)
        for t in runs:
            progress(
                f"  batch {t.batch_size:3d}: {t.best_infer_per_sec:10,.0f} inf/s "
                f"({t.batch_us / t.batch_size:,.1f} µs per inference)"
            )
        earlier = into.get(model_dir.name)
        into[model_dir.name] = offline.merge(earlier, runs) if earlier else runs


def measure_served(
    perf_analyzer: str, repo: Path, args: argparse.Namespace, flags: tuple[str, ...]
) -> tuple[list[str], dict[str, list[served.Point]]]:
    """Serve `repo`, drive each point with perf_analyzer; returns the commands and the points."""
    protocols = [p for p in args.protocols.split(",") if p]
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    mlp_concurrencies = [int(c) for c in args.mlp_concurrency.split(",") if c]
    points: dict[str, list[served.Point]] = {"latency": [], "served": [], "floor": []}
    pa_dir = args.out_dir / "perf_analyzer"
    pa_dir.mkdir(parents=True, exist_ok=True)
    groups = [(TARGET_MODELS, concurrencies)]
    if mlp_concurrencies:
        groups.append((FAST_MODELS, mlp_concurrencies))
    if not args.no_reference:
        groups.append((REFERENCE_MODELS, concurrencies))
    with running_server([repo], log_dir=args.out_dir) as server:
        server_argv = server.process.args
        assert isinstance(server_argv, list), server_argv  # the harness starts it from a list
        commands = [
            f"# server (log: {server.log_path}):",
            shlex.join(os.fsdecode(a) for a in server_argv),
        ]
        progress(f"server pid {server.pid} on http {server.http_url}, grpc {server.grpc_url}")
        urls = {"http": server.http_url, "grpc": server.grpc_url}

        def measure(kind: str, model: str, protocol: str, concurrency: int) -> None:
            point = served.run_point(
                perf_analyzer,
                model,
                protocol,
                urls[protocol],
                server.base,
                server.pid,
                concurrency,
                pa_dir,
                flags,
            )
            points[kind].append(point)
            if point.ok:
                progress(
                    f"  {model} {protocol} c{concurrency}: {point.infer_per_sec:,.0f} inf/s, "
                    f"p50 {point.p50_us / 1e3:.2f} ms, p99 {point.p99_us / 1e3:.2f} ms, "
                    f"batch {point.server.avg_batch:.1f} ({point.seconds:.0f}s"
                    f"{', retried' if point.retried else ''})"
                )
            else:
                progress(f"  {model} {protocol} c{concurrency}: FAILED {point.error}")

        for model in (LATENCY_MODEL, PYTHON_MODEL):
            for protocol in protocols:
                measure("latency", model, protocol, 1)
        # Right after the served latency, so both see the machine in the same state; the real
        # server sits idle meanwhile.
        canned = [
            floor.capture(server.base, server.grpc_url, model)
            for model in (LATENCY_MODEL, PYTHON_MODEL)
        ]
        points["floor"] = measure_floor(perf_analyzer, canned, protocols, args.out_dir, flags)
        for group, group_concurrencies in groups:
            for model in group.values():
                for protocol in protocols:
                    for concurrency in group_concurrencies:
                        measure("served", model, protocol, concurrency)
        if not server.alive():
            progress("the server died during the run; see its log")
    return commands, points


def measure_floor(
    perf_analyzer: str,
    canned: list[dict],
    protocols: list[str],
    out_dir: Path,
    flags: tuple[str, ...],
) -> list[served.Point]:
    """The latency models (`simple`, `py_add`) at concurrency 1 against bench/floor.py: the same
    stacks answering from memory."""
    canned_path = out_dir / "floor-canned.pickle"
    canned_path.write_bytes(pickle.dumps(canned))
    http_port, grpc_port = free_port(), free_port()
    command = [
        sys.executable,
        "-m",
        "bench.floor",
        "--canned",
        str(canned_path),
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
    ]
    log = open(out_dir / "floor.log", "w")
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    urls = {"http": f"127.0.0.1:{http_port}", "grpc": f"127.0.0.1:{grpc_port}"}
    base = f"http://127.0.0.1:{http_port}"
    points = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(base + "/v2", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        floor_dir = out_dir / "perf_analyzer" / "floor"
        floor_dir.mkdir(parents=True, exist_ok=True)
        for model in (c["model"] for c in canned):
            for protocol in protocols:
                point = served.run_point(
                    perf_analyzer,
                    model,
                    protocol,
                    urls[protocol],
                    base,
                    process.pid,
                    1,
                    floor_dir,
                    flags,
                )
                points.append(point)
                progress(
                    f"  floor (answers from memory) {model} {protocol} c1: p50 "
                    f"{point.p50_us / 1e3:.2f} ms"
                    if point.ok
                    else f"  floor {model} {protocol}: FAILED {point.error}"
                )
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
    return points


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    perf_analyzer = find_perf_analyzer()
    args.out_dir = args.out_dir or ROOT / "bench" / "out" / ("quick" if args.quick else "")
    results_path = args.results or (
        args.out_dir / "RESULTS.md" if args.quick else ROOT / "bench" / "RESULTS.md"
    )
    flags = QUICK_FLAGS if args.quick else served.CONVERGE_FLAGS
    repetitions = 1 if args.quick else 3
    load_before = load_average()
    machine = machine_info(perf_analyzer)
    progress(f"machine: {machine['nproc']} CPUs, {machine['CPU']}, load {load_before}")

    repo = args.out_dir / "models"
    shutil.rmtree(repo, ignore_errors=True)  # the server loads every model folder it finds
    skipped = ((build_dense_compute, build_dense_compute_nobatch) if args.no_reference else ()) + (
        () if args.mlp_concurrency.strip(",") else (build_mlp_compute,)
    )
    for build in BUILDERS:
        if build not in skipped:
            build(repo)
    shutil.copytree(
        ROOT / "bench" / "models" / PYTHON_MODEL,
        repo / PYTHON_MODEL,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    offline_dirs = [repo / TARGET_MODELS["on"]]
    if build_mlp_compute not in skipped:
        offline_dirs.append(repo / FAST_MODELS["on"])
    if not args.no_reference:
        offline_dirs.append(repo / REFERENCE_MODELS["on"])
    progress(f"models built in {repo}")

    offline_runs: dict[str, list[offline.Throughput]] = {}
    measure_offline(offline_dirs, offline_runs, repetitions, args.quick, "before serving")
    direct = offline.latency(
        repo / LATENCY_MODEL, calls=500 if args.quick else 3000, repetitions=repetitions
    )
    progress(
        f"offline {LATENCY_MODEL} batch 1: p50 {direct.p50_us:.1f} µs, p99 {direct.p99_us:.1f} µs"
    )
    direct_python = offline.python_latency(
        repo / PYTHON_MODEL, calls=500 if args.quick else 3000, repetitions=repetitions
    )
    progress(
        f"direct {PYTHON_MODEL} execute, one request: p50 {direct_python.p50_us:.1f} µs, "
        f"p99 {direct_python.p99_us:.1f} µs"
    )
    server_commands, points = measure_served(perf_analyzer, repo, args, flags)
    measure_offline(offline_dirs, offline_runs, repetitions, args.quick, "after serving")
    # Last, with the bench's own server gone: each server pinned to CPU 0, perf_analyzer to 1.
    cpu_rounds = args.cpu_rounds if args.cpu_rounds is not None else repetitions
    side_by_side = None
    if cpu_rounds > 0:
        progress(
            f"server CPU per inference beside Triton (bench/cpu_side_by_side.py), "
            f"{cpu_rounds} round(s)"
        )
        side_by_side = cpu_side_by_side.run(
            perf_analyzer, args.out_dir / "cpu", cpu_rounds, progress=progress, flags=flags
        )
        progress(f"  Triton: {side_by_side.triton}")
    kserve = None
    if cpu_rounds > 0:
        progress(
            f"beside {kserve_peer.KSERVE_LABEL}, the closed-loop Python client "
            f"(bench/kserve_peer.py), {cpu_rounds} round(s)"
        )
        kserve = kserve_peer.run(
            args.out_dir / "kserve", cpu_rounds, 2.0 if args.quick else 5.0, progress=progress
        )
        progress(f"  KServe: {kserve.kserve}")
    handover = None
    if not args.quick or args.cpu_rounds:
        progress("frontend processes: CPU per request handed over (bench/handover_cost.py)")
        handover = handover_cost.run(rounds=repetitions, seconds=8.0, progress=progress)

    results = report.Results(
        machine=machine,
        commands=[
            f"# started as: {shlex.join([sys.executable, *sys.argv])}",
            *server_commands,
            "# perf_analyzer, one call per point:",
        ],
        offline=offline_runs,
        offline_of={
            TARGET_MODELS["off"]: TARGET_MODELS["on"],
            REFERENCE_MODELS["off"]: REFERENCE_MODELS["on"],
        },
        direct=direct,
        served=points["served"],
        latency=points["latency"],
        floor=points["floor"],
        target_models=TARGET_MODELS,
        reference_models=REFERENCE_MODELS,
        quick=args.quick,
        perf_analyzer=perf_analyzer,
        fast_models=FAST_MODELS if repo / FAST_MODELS["on"] in offline_dirs else {},
        directs={PYTHON_MODEL: direct_python},
        side_by_side=side_by_side,
        kserve=kserve,
        handover=handover,
        notes=[
            f"load average (1/5/15 min) before: {load_before}, after: {load_average()}",
            f"run took {time.monotonic() - _START:.0f}s; perf_analyzer flags: {' '.join(flags)}"
            + (" (--quick: smoke run, not numbers)" if args.quick else ""),
        ],
    )
    results_path.parent.mkdir(parents=True, exist_ok=True)
    # sections the standalone benchmarks wrote (bench/sections.py) are kept
    results_path.write_text(carry_sections(report.render(results), results_path))
    raw_path = args.out_dir / "results.json"
    raw_path.write_text(portable(json.dumps(dataclasses.asdict(results), indent=1), perf_analyzer))
    progress(f"wrote {results_path} and {raw_path}")
    for line in report.verdicts(results):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
