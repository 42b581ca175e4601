"""A/B of two source trees on the Python model path: server CPU per inference, pinned.

Why: the Python model path's cost per request is small and the machine is shared, so a change
is judged only against another tree measured in the same minutes. Each round starts tree A's
server, then tree B's (rounds alternate, A B A B, so drift and neighbours hit both), each
pinned to CPU 0 with its worker processes, perf_analyzer pinned to CPU 1 at concurrency 8, over
HTTP then gRPC. Reported per run: inferences/s (perf_analyzer), µs of server process-tree CPU
per inference the server counted (and its split: the server process, its Python workers), and
the average batch size. Every round is printed (and the table kept in `<out-dir>/ab.md`); no
single run is to be trusted. With `--together` both servers run at the same time, sharing
CPU 0 (their clients share CPU 1), so a neighbour's burst hits both alike; each then gets about
half the core, which is a different operating point from the interleaved runs (compare A with
B, not across modes).

    .venv/bin/python -m bench.ab.python_model_ab --a ../base-checkout --b . [--rounds 4]
        [--model py_add] [--protocols http,grpc] [--out-dir bench/out/ab] [--together]
        [--concurrency 8] [--args-a "..."] [--args-b "--grpc-server threads"]

`--args-a` / `--args-b` add server flags to one tree's servers: with the same tree twice they
A/B two settings (e.g. the two gRPC servers, FINDINGS "gRPC on grpcio's synchronous server").

The model comes from this tree's bench/models (the same model.py for both servers); `--model
simple` builds the ONNX `simple` model instead, as a reference that has no Python worker
(its config names no instance count: 2 CPU instances, ONNX Runtime's default, in every tree;
a5095ba changed the default of the other backends only), and `--model mlp_compute` the fast MLP
of `make bench`'s batching section (with `--concurrency 32`, its batching point: the batch size
and inf/s then say whether the batcher forms the same batches in both trees). "instance busy"
is the share of the wall time the model's (one) instance spent on batches, from the server's
statistics. `--unpinned` leaves servers and clients where the kernel puts them, as `make bench`
runs mlp_compute: pinned, the instance thread shares CPU 0 with the loop, so time it spends
waiting for the loop is used by the loop and does not show in inf/s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench import served
from bench.cpu_side_by_side import CLIENT_CPU, CONCURRENCY, PinnedServer
from bench.cpu_time import process_cpu
from examples.build_repository import build_simple
from examples.mlp_compute import BENCH_BUILDERS
from harness.perf_analyzer import default_cache, locate
from harness.serverproc import free_port, loopback_listeners

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    label: str
    protocol: str
    round: int
    infer_per_sec: float = 0.0
    cpu_us: float = 0.0  # the whole process tree, per inference
    server_us: float = 0.0  # the server process alone
    batch: float = 0.0
    switches: float = 0.0  # voluntary context switches of the process tree, per inference
    busy: float = 0.0  # the instance's share of the wall time spent on batches (one instance)
    error: str = ""


def start(
    tree: Path,
    label: str,
    repo: Path,
    out_dir: Path,
    round_no: int,
    extra: Sequence[str] = (),
    pinned: bool = True,
) -> PinnedServer:
    """The tree's server, run from the tree itself with this Python, pinned to CPU 0 unless
    `pinned` is False."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    command = [
        sys.executable,
        "-m",
        "server",
        "--model-repository",
        str(repo),
        *loopback_listeners(http_port, grpc_port, metrics_port),
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH=str(tree))
    return PinnedServer(
        label,
        command,
        env,
        out_dir / f"{label}-r{round_no}.log",
        http_port,
        grpc_port,
        cwd=tree,
        pinned=pinned,
    )


def measure(
    perf_analyzer: str,
    server: PinnedServer,
    model: str,
    protocol: str,
    round_no: int,
    out_dir: Path,
    concurrency: int = CONCURRENCY,
    pinned: bool = True,
) -> Run:
    run = Run(server.name, protocol, round_no)
    url = server.http if protocol == "http" else server.grpc
    csv_path = out_dir / f"{server.name}-{protocol}-r{round_no}.csv"
    csv_path.unlink(missing_ok=True)
    command = [
        *(["taskset", "-c", str(CLIENT_CPU)] if pinned else []),
        perf_analyzer,
        "-m",
        model,
        "-i",
        protocol,
        "-u",
        url,
        "--concurrency-range",
        str(concurrency),
        *served.CONVERGE_FLAGS,
        "-f",
        str(csv_path),
    ]
    before = served.model_stats(f"http://{server.http}", model)
    tree_before, own_before = server.tree_cpu(), process_cpu(server.process.pid)
    switches_before = server.tree_switches()
    began = time.monotonic()
    code, output = served.run_command(command, 180)
    wall = time.monotonic() - began
    tree, own = server.tree_cpu() - tree_before, process_cpu(server.process.pid) - own_before
    switches = server.tree_switches() - switches_before
    split = served.server_split(before, served.model_stats(f"http://{server.http}", model))
    (out_dir / f"{csv_path.stem}.log").write_text(output)
    if code != 0 or not csv_path.exists() or split.requests <= 0:
        run.error = f"exit {code}: " + " / ".join(output.strip().splitlines()[-2:])
        return run
    run.infer_per_sec = float(served.read_csv(csv_path)["Inferences/Second"])
    run.cpu_us = 1e6 * tree / split.requests
    run.server_us = 1e6 * own / split.requests
    run.batch = split.avg_batch
    run.switches = switches / split.requests
    if split.executions > 0:  # each request records its batch's time: per batch, over the wall
        run.busy = split.compute_us * split.executions / 1e6 / wall
    return run


def run_round(
    perf_analyzer: str,
    trees: list[tuple[str, Path]],
    repo: Path,
    args: argparse.Namespace,
    round_no: int,
) -> list[Run]:
    """Start the trees' servers, measure each protocol on all of them at once (one tree: the
    interleaved A/B; two: `--together`), stop them."""
    extra = {args.label_a: args.args_a.split(), args.label_b: args.args_b.split()}
    servers = [
        start(tree, label, repo, args.out_dir, round_no, extra.get(label, []), not args.unpinned)
        for label, tree in trees
    ]
    runs: list[Run] = []
    try:
        for server in servers:
            server.wait_ready()
        for protocol in args.protocols.split(","):
            with ThreadPoolExecutor(len(servers)) as pool:
                done = list(
                    pool.map(
                        lambda server, protocol=protocol: measure(
                            perf_analyzer,
                            server,
                            args.model,
                            protocol,
                            round_no,
                            args.out_dir,
                            args.concurrency,
                            not args.unpinned,
                        ),
                        servers,
                    )
                )
            for run in done:
                print(
                    f"round {round_no} {run.label} {protocol}: "
                    + (
                        run.error
                        or (
                            f"{run.infer_per_sec:,.0f} inf/s, {run.cpu_us:,.0f} µs CPU/inf "
                            f"(server {run.server_us:,.0f}), batch {run.batch:.2f}, "
                            f"{run.switches:.1f} context switches/inf, instance busy "
                            f"{run.busy:.2f}"
                        )
                    ),
                    flush=True,
                )
            runs += done
    except RuntimeError as exc:
        runs += [Run(label, "-", round_no, error=str(exc)) for label, _ in trees]
    finally:
        for server in servers:
            server.stop()
    return runs


def table(runs: list[Run]) -> list[str]:
    lines = [
        "| round | tree | protocol | inf/s | CPU µs/inf (tree) | server | workers | batch "
        "| switches/inf | instance busy |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        if r.error:
            lines.append(f"| {r.round} | {r.label} | {r.protocol} | failed: {r.error} |||||||")
        else:
            lines.append(
                f"| {r.round} | {r.label} | {r.protocol} | {r.infer_per_sec:,.0f} | "
                f"{r.cpu_us:,.0f} | {r.server_us:,.0f} | {r.cpu_us - r.server_us:,.0f} "
                f"| {r.batch:.2f} | {r.switches:.1f} | {r.busy:.2f} |"
            )
    lines += [
        "",
        "| tree | protocol | median inf/s | median CPU µs/inf | median switches/inf "
        "| median instance busy | rounds (inf/s) | rounds (µs) |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for label in dict.fromkeys(r.label for r in runs):
        for protocol in dict.fromkeys(r.protocol for r in runs):
            ok = [r for r in runs if (r.label, r.protocol) == (label, protocol) and not r.error]
            if ok:
                lines.append(
                    f"| {label} | {protocol} | "
                    f"{statistics.median(r.infer_per_sec for r in ok):,.0f} | "
                    f"{statistics.median(r.cpu_us for r in ok):,.0f} | "
                    f"{statistics.median(r.switches for r in ok):.1f} | "
                    f"{statistics.median(r.busy for r in ok):.2f} | "
                    f"{', '.join(f'{r.infer_per_sec:,.0f}' for r in ok)} | "
                    f"{', '.join(f'{r.cpu_us:,.0f}' for r in ok)} |"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="baseline source tree")
    parser.add_argument("--b", type=Path, default=ROOT, help="candidate source tree")
    parser.add_argument("--label-a", default="A")
    parser.add_argument("--label-b", default="B")
    parser.add_argument("--args-a", default="", help="server flags for tree A's servers")
    parser.add_argument("--args-b", default="", help="server flags for tree B's servers")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--model", default="py_add")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help="perf_analyzer's concurrency (32 for mlp_compute: the batching point of make bench)",
    )
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out" / "ab")
    parser.add_argument(
        "--together",
        action="store_true",
        help="run A and B at the same time (both on CPU 0, both clients on "
        "CPU 1): a busy neighbour then hits both alike",
    )
    parser.add_argument(
        "--unpinned",
        action="store_true",
        help="pin neither servers nor clients, as make bench's batching section runs: "
        "whether an instance thread idles shows only when it can have a core of its own",
    )
    args = parser.parse_args(argv)
    # $PERF_ANALYZER, PATH, the cache, else installed as `make bench` does it
    found = locate(os.environ, default_cache(os.environ), install=True, python=sys.executable)
    perf_analyzer = str(found)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    repo = args.out_dir / "models"
    shutil.rmtree(repo, ignore_errors=True)
    if args.model == "simple":  # the ONNX reference, built as `make run` builds it
        build_simple(repo)
    elif args.model in BENCH_BUILDERS:  # mlp_compute: batching when the model is fast
        BENCH_BUILDERS[args.model](repo)
    else:
        shutil.copytree(ROOT / "bench" / "models" / args.model, repo / args.model)
    trees = [(args.label_a, args.a.resolve()), (args.label_b, args.b.resolve())]
    runs: list[Run] = []
    for round_no in range(1, args.rounds + 1):
        groups = [trees] if args.together else [[tree] for tree in trees]
        for group in groups:
            runs += run_round(perf_analyzer, group, repo, args, round_no)
            time.sleep(1.0)
    report = [f"load average at the end: {os.getloadavg()[0]:.2f}", "", *table(runs)]
    (args.out_dir / "ab.md").write_text("\n".join(report) + "\n")
    print("\n" + "\n".join(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
