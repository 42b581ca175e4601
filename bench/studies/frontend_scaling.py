"""Frontend processes: what a hand-over costs, and throughput with 1 and 2 accepting processes.

Why: one event loop is one core, so the CPU a request costs the model owner decides the
ceiling once frontends run in their own processes (--frontend-processes). This runs the same
server with N = 1 and N = 2 (perf_analyzer as a third process, unpinned: the machine has two
cores) and reads, per process, CPU seconds over requests served. With N = 2 the owner both
serves its own connections (cost f each, known from N = 1) and takes over the frontend
process's requests (cost h each); the kernel spreads connections evenly enough that their split,
read from /proc during the run, gives h = (owner CPU - own requests * f) / handed-over requests.
The frontend process's own cost per request is g. bench/FINDINGS.md 9.9 turns f, g and h into
throughput against cores.

    .venv/bin/python -m bench.studies.frontend_scaling [--rounds 2] [--protocol http|grpc]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import served
from bench.cpu_time import process_cpu
from examples.build_repository import build_simple, build_simple_batching
from harness.procutil import connection_owners, frontend_children
from harness.serverproc import start_server

CONCURRENCY = 16
MODEL = "simple_batching"  # add/sub of [16] INT32 with dynamic batching (500 µs)


@dataclass
class Run:
    processes: int
    protocol: str
    infer_per_sec: float = 0.0
    owner_cpu_us: float = 0.0  # owner CPU per request served in all
    frontend_cpu_us: float = 0.0  # the child's CPU per request it took (N = 2)
    owner_share: float = 1.0  # of the connections, the owner's
    error: str = ""


def _connection_split(port: int, owner: int, stop: threading.Event, shares: list[float]) -> None:
    while not stop.wait(0.5):
        owners = connection_owners(port)
        total = sum(
            count
            for pid, count in owners.items()
            if pid == owner or pid in frontend_children(owner)
        )
        if total:
            shares.append(owners.get(owner, 0) / total)


def measure(perf_analyzer: str, repo: Path, processes: int, protocol: str, log_dir: Path) -> Run:
    run = Run(processes, protocol)
    server = start_server([repo], ["--frontend-processes", str(processes)], log_dir=log_dir)
    try:
        deadline = time.monotonic() + 30
        while len(frontend_children(server.pid)) < processes - 1:
            if time.monotonic() > deadline:
                raise RuntimeError("frontend processes did not start")
            time.sleep(0.1)
        children = frontend_children(server.pid)
        url = server.http_url if protocol == "http" else server.grpc_url
        port = server.http_port if protocol == "http" else server.grpc_port
        csv_path = log_dir / f"scaling-{processes}-{protocol}.csv"
        command = [
            perf_analyzer,
            "-m",
            MODEL,
            "-i",
            protocol,
            "-u",
            url,
            "--concurrency-range",
            str(CONCURRENCY),
            *served.CONVERGE_FLAGS,
            "-f",
            str(csv_path),
        ]
        before = served.model_stats(server.base, MODEL)
        cpu_before = {pid: process_cpu(pid) for pid in [server.pid, *children]}
        shares: list[float] = []
        stop = threading.Event()
        watcher = threading.Thread(
            target=_connection_split, args=(port, server.pid, stop, shares), daemon=True
        )
        watcher.start()
        code, output = served.run_command(command, 180)
        stop.set()
        watcher.join()
        cpu = {pid: process_cpu(pid) - cpu_before[pid] for pid in cpu_before}
        requests = served.server_split(before, served.model_stats(server.base, MODEL)).requests
        if code != 0 or requests <= 0:
            run.error = f"exit {code}: {output.strip().splitlines()[-1:]}"
            return run
        run.infer_per_sec = float(served.read_csv(csv_path)["Inferences/Second"])
        run.owner_share = statistics.median(shares) if shares else 1.0
        run.owner_cpu_us = 1e6 * cpu[server.pid] / requests
        if children:
            taken = requests * (1.0 - run.owner_share)
            run.frontend_cpu_us = 1e6 * sum(cpu[pid] for pid in children) / max(taken, 1.0)
        return run
    finally:
        server.stop()


def handover_us(single: Run, double: Run) -> float | None:
    """h: the owner's CPU per request a frontend process handed over."""
    handed = 1.0 - double.owner_share
    if handed <= 0.05:
        return None
    return (double.owner_cpu_us - double.owner_share * single.owner_cpu_us) / handed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--protocol", choices=["http", "grpc"], action="append")
    parser.add_argument("--perf-analyzer", default=os.environ.get("PERF_ANALYZER", "perf_analyzer"))
    parser.add_argument("--json", type=Path, help="also write the runs here")
    args = parser.parse_args(argv)
    protocols = args.protocol or ["http", "grpc"]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        build_simple(repo)
        build_simple_batching(repo)
        for round_no in range(args.rounds):
            for protocol in protocols:
                for processes in (1, 2):
                    run = measure(args.perf_analyzer, repo, processes, protocol, Path(tmp))
                    runs.append(run)
                    print(
                        f"round {round_no + 1} {protocol} N={processes}: "
                        f"{run.infer_per_sec:,.0f} infer/s, owner {run.owner_cpu_us:.0f} µs/req"
                        f" (share {run.owner_share:.2f}), frontend "
                        f"{run.frontend_cpu_us:.0f} µs/req {run.error}",
                        flush=True,
                    )
    for protocol in protocols:
        pairs = [
            (a, b) for a, b in zip(runs[0::2], runs[1::2], strict=False) if a.protocol == protocol
        ]
        costs = [h for a, b in pairs if (h := handover_us(a, b)) is not None]
        gains = [b.infer_per_sec / a.infer_per_sec for a, b in pairs if a.infer_per_sec]
        print(
            f"{protocol}: f = {statistics.median(a.owner_cpu_us for a, _ in pairs):.0f} µs, "
            f"g = {statistics.median(b.frontend_cpu_us for _, b in pairs):.0f} µs, "
            f"h = {statistics.median(costs) if costs else float('nan'):.0f} µs, "
            f"N=2/N=1 throughput {statistics.median(gains) if gains else float('nan'):.2f}x"
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(run) for run in runs], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
