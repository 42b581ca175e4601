"""Issue 27's peer: KServe 0.21's Python server beside ascend-serve, both driven by the same
closed-loop Python client (bench/closed_loop.py), each server pinned to CPU 0 and the client to
CPU 1, at concurrency 8 and 1, v2 JSON over HTTP and raw `ModelInfer` over gRPC.

KServe serves bench/peers/kserve_add_sub.py (the py_add numpy work) from `.venv-kserve`
(`make bench` installs `kserve==0.21.0` there); ascend-serve serves bench/models/py_add. Server
CPU per inference = the server's process-tree CPU time over the requests the client got answered
in the measured window. Rounds interleave the servers. Without .venv-kserve the report says
KServe was not measured.

    .venv/bin/python -m bench.kserve_peer [--rounds 2] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import closed_loop
from bench.cpu_side_by_side import (
    AIO,
    CLIENT_CPU,
    PY_MODEL,
    ROOT,
    SERVER_CPU,
    PinnedServer,
    start_ours,
)
from harness.serverproc import free_port

KSERVE_PACKAGE = "kserve==0.21.0"
KSERVE_LABEL = "KServe 0.21 (Python)"
OURS = "ascend-serve"
GRPC_RATIO_TARGET = 1.5  # issue 27 target 1: ascend-serve gRPC c=8 >= 1.5x KServe's
POINTS = (("grpc", 8), ("http", 8), ("grpc", 1), ("http", 1))


@dataclass
class PeerSample:
    server: str  # OURS or KSERVE_LABEL
    protocol: str
    concurrency: int
    round: int
    infer_per_sec: float = 0.0
    cpu_us: float = 0.0
    error: str = ""


@dataclass
class PeerRun:
    samples: list[PeerSample] = field(default_factory=list)
    kserve: str = ""  # where KServe came from, or why it was not measured

    def median(self, server: str, protocol: str, concurrency: int) -> PeerSample | None:
        rows = [
            s
            for s in self.samples
            if (s.server, s.protocol, s.concurrency) == (server, protocol, concurrency)
            and not s.error
        ]
        if not rows:
            return None
        return PeerSample(
            server,
            protocol,
            concurrency,
            0,
            statistics.median(s.infer_per_sec for s in rows),
            statistics.median(s.cpu_us for s in rows),
        )


def find_kserve() -> Path | None:
    """.venv-kserve's python when kserve is installed there."""
    python = ROOT / ".venv-kserve" / "bin" / "python"
    found = list((ROOT / ".venv-kserve").glob("lib/python3*/site-packages/kserve/__init__.py"))
    return python if python.exists() and found else None


def start_kserve(python: Path, out_dir: Path, round_no: int) -> PinnedServer:
    """KServe's ModelServer on ports of ours (its REST side binds 0.0.0.0; KServe has no
    address setting)."""
    http_port, grpc_port = free_port(), free_port()
    command = [
        str(python),
        str(ROOT / "bench" / "peers" / "kserve_add_sub.py"),
        "--http_port",
        str(http_port),
        "--grpc_port",
        str(grpc_port),
    ]
    return PinnedServer(
        KSERVE_LABEL,
        command,
        dict(os.environ),
        out_dir / f"kserve-round{round_no}.log",
        http_port,
        grpc_port,
        cwd=out_dir,
    )


def measure(
    server: PinnedServer, protocol: str, concurrency: int, round_no: int, seconds: float
) -> PeerSample:
    """One closed-loop window from CPU 1; the server tree's CPU is read at its two ends."""
    sample = PeerSample(server.name, protocol, concurrency, round_no)
    cpu: list[float] = []
    address = server.http if protocol == "http" else server.grpc
    os.sched_setaffinity(0, {CLIENT_CPU})
    try:
        window = asyncio.run(
            closed_loop.drive(
                protocol,
                address,
                PY_MODEL,
                concurrency,
                seconds,
                lambda: cpu.append(server.tree_cpu()),
            )
        )
    except (OSError, RuntimeError) as exc:
        sample.error = str(exc) or type(exc).__name__
        return sample
    finally:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    if window.requests <= 0:
        sample.error = "no request was answered"
        return sample
    sample.infer_per_sec = window.per_second
    sample.cpu_us = 1e6 * (cpu[1] - cpu[0]) / window.requests
    return sample


def run(
    out_dir: Path, rounds: int = 2, seconds: float = 5.0, progress: Callable[[str], None] = print
) -> PeerRun:
    """Every round: ascend-serve, then KServe, each at every point of POINTS."""
    result = PeerRun()
    if (os.cpu_count() or 1) < 2 or len(os.sched_getaffinity(0)) < 2:
        result.kserve = "not measured: needs 2 CPUs (server on one, the client on the other)"
        return result
    python = find_kserve()
    if python is None:
        result.kserve = f"not measured: no kserve (install `{KSERVE_PACKAGE}` into .venv-kserve)"
        return result
    result.kserve = f"`{KSERVE_PACKAGE}` (.venv-kserve)"
    out_dir.mkdir(parents=True, exist_ok=True)
    repo = out_dir / "models-ours"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(ROOT / "bench" / "models" / PY_MODEL, repo / PY_MODEL)
    for round_no in range(1, rounds + 1):
        for name in (OURS, AIO, KSERVE_LABEL):
            if name == OURS:
                server = start_ours(repo, out_dir, round_no)
            elif name == AIO:  # its gRPC points only: HTTP is the same server
                server = start_ours(repo, out_dir, round_no, AIO, ["--grpc-server", "aio"])
            else:
                server = start_kserve(python, out_dir, round_no)
            points = [p for p in POINTS if name != AIO or p[0] == "grpc"]
            try:
                server.wait_ready()
                for protocol, concurrency in points:
                    sample = measure(server, protocol, concurrency, round_no, seconds)
                    result.samples.append(sample)
                    progress(
                        f"  round {round_no} {name} {protocol} c{concurrency}: "
                        + (
                            sample.error
                            or f"{sample.infer_per_sec:,.0f} inf/s, {sample.cpu_us:,.0f} µs CPU"
                        )
                    )
            except RuntimeError as exc:
                result.samples.append(PeerSample(name, "-", 0, round_no, error=str(exc)))
                progress(f"  round {round_no} {name}: {exc}")
            finally:
                server.stop()
    return result


def verdicts(result: PeerRun) -> list[str]:
    """Issue 27 target 1's KServe half: ascend-serve gRPC c=8 >= 1.5x KServe's throughput
    (and the same for `--grpc-server aio` when it was measured)."""
    peer = result.median(KSERVE_LABEL, "grpc", 8)
    lines = []
    for name, label in ((OURS, "ascend-serve"), (AIO, "ascend-serve --grpc-server aio")):
        ours = result.median(name, "grpc", 8)
        if ours and peer and peer.infer_per_sec > 0:
            ratio = ours.infer_per_sec / peer.infer_per_sec
            met = "met" if ratio >= GRPC_RATIO_TARGET else "not met"
            lines.append(
                f"- gRPC c=8, Python client, `{PY_MODEL}`: {label} >= {GRPC_RATIO_TARGET}x "
                f"{KSERVE_LABEL}: **{met}** — {ours.infer_per_sec:,.0f} vs "
                f"{peer.infer_per_sec:,.0f} inferences/s ({ratio:.2f}x)"
            )
    return lines or [f"- gRPC c=8 against {KSERVE_LABEL}: {result.kserve or 'not measured'}"]


def report(result: PeerRun) -> list[str]:
    lines = [
        f"## Beside {KSERVE_LABEL}, one closed-loop Python client (issue 27)",
        "",
        f"Each server and its children pinned to CPU {SERVER_CPU}, the client "
        f"(bench/closed_loop.py: v2 JSON over HTTP, raw `ModelInfer` over gRPC) to CPU "
        f"{CLIENT_CPU}; ascend-serve serves `{PY_MODEL}`, KServe the same numpy add/sub "
        f"(bench/peers/kserve_add_sub.py); median of the rounds. KServe: {result.kserve}.",
        "",
    ]
    if not any(not s.error for s in result.samples):
        return [*lines, *verdicts(result), ""]
    lines += [
        f"| protocol | concurrency | ascend-serve inferences/s (server CPU µs) "
        f"| {KSERVE_LABEL} inferences/s (server CPU µs) | ratio (inferences/s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for protocol, concurrency in POINTS:
        ours = result.median(OURS, protocol, concurrency)
        peer = result.median(KSERVE_LABEL, protocol, concurrency)
        if ours is None and peer is None:
            continue

        def cell(s: PeerSample | None) -> str:
            return f"{s.infer_per_sec:,.0f} ({s.cpu_us:,.0f})" if s else "-"

        ratio = (
            f"{ours.infer_per_sec / peer.infer_per_sec:.2f}x"
            if ours and peer and peer.infer_per_sec > 0
            else "-"
        )
        lines.append(f"| {protocol} | {concurrency} | {cell(ours)} | {cell(peer)} | {ratio} |")
        aio = result.median(AIO, protocol, concurrency)
        if aio is not None:
            ratio = (
                f"{aio.infer_per_sec / peer.infer_per_sec:.2f}x"
                if peer and peer.infer_per_sec > 0
                else "-"
            )
            lines.append(
                f"| {protocol}, `--grpc-server aio` | {concurrency} | {cell(aio)} "
                f"| {cell(peer)} | {ratio} |"
            )
    errors = [s for s in result.samples if s.error]
    lines += [
        "",
        *[
            f"- failed: round {s.round} {s.server} {s.protocol} c{s.concurrency}: {s.error}"
            for s in errors
        ],
    ]
    return [*lines, *verdicts(result), ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out" / "kserve")
    args = parser.parse_args(argv)
    print("\n".join(report(run(args.out_dir, args.rounds, args.seconds))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
