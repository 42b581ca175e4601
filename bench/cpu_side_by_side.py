"""Server CPU per inference, ascend-serve beside NVIDIA Triton 2.51, on one pinned core.

Why this measurement: the CPU a server spends per request decides whether an accelerator is
ever saturated. Each server (with every process it starts: Python model workers, Triton's
python-backend stubs) runs pinned to CPU 0; perf_analyzer runs pinned to CPU 1 at concurrency 8.
CPU per inference = the server's process-tree CPU time (/proc, utime + stime) over the
inferences its statistics counted during the call. Rounds interleave the servers, so a noisy
neighbour hits both.

Models: `py_add` (bench/models/py_add: the same config.pbtxt and model.py for both servers) and,
for ascend-serve only, the ONNX `simple` model (the Triton wheel has no ONNX Runtime backend).
Triton is `tritonserver` from the `nvidia-pytriton==0.7.0` wheel, found in `.venv-triton`
(`make bench` installs it there) or under $TRITONSERVER_DIST; when absent the report says so.

    .venv/bin/python -m bench.cpu_side_by_side [--rounds 3] [--no-triton]
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import served
from bench.cpu_time import process_cpu, process_tree, tree_switches
from bench.machine import portable
from examples.build_repository import build_simple
from harness.serverproc import free_port, loopback_listeners

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 8
SERVER_CPU, CLIENT_CPU = 0, 1
PY_MODEL = "py_add"
TARGETS_US = {"http": 230.0, "grpc": 300.0}  # issue #12 (b): `simple`, ascend-serve alone
GRPC_SWITCHES_TARGET = 8.0  # issue 27: voluntary context switches per gRPC `py_add` inference
TRITON_WHEEL = "nvidia-pytriton==0.7.0"


@dataclass
class Sample:
    server: str  # "ascend-serve" or "triton"
    model: str
    protocol: str
    round: int
    infer_per_sec: float = 0.0
    cpu_us: float = 0.0  # server process tree CPU per inference
    error: str = ""
    switches: float = 0.0  # voluntary context switches of the server tree per inference


@dataclass
class SideBySide:
    samples: list[Sample] = field(default_factory=list)
    triton: str = ""  # where tritonserver came from, or why it did not run
    commands: list[str] = field(default_factory=list)
    concurrency: int = CONCURRENCY

    def median(self, server: str, model: str, protocol: str) -> Sample | None:
        rows = [
            s
            for s in self.samples
            if (s.server, s.model, s.protocol) == (server, model, protocol) and not s.error
        ]
        if not rows:
            return None
        return Sample(
            server,
            model,
            protocol,
            0,
            statistics.median(s.infer_per_sec for s in rows),
            statistics.median(s.cpu_us for s in rows),
            switches=statistics.median(s.switches for s in rows),
        )


# ----- the servers ---------------------------------------------------------------------------
def find_triton() -> Path | None:
    """The `pytriton/tritonserver` folder of the wheel ($TRITONSERVER_DIST wins)."""
    explicit = os.environ.get("TRITONSERVER_DIST")
    if explicit:
        return Path(explicit) if (Path(explicit) / "bin" / "tritonserver").exists() else None
    found = glob.glob(str(ROOT / ".venv-triton/lib/python3*/site-packages/pytriton/tritonserver"))
    return Path(found[0]) if found else None


def triton_backends(dist: Path, out_dir: Path) -> Path:
    """A backend folder with the python backend and the stub for this Python (as pytriton
    prepares it), so the wheel's own files stay untouched."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    target = out_dir / "triton-backends" / "python"
    shutil.rmtree(target.parent, ignore_errors=True)
    shutil.copytree(
        dist / "backends" / "python", target, ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(dist / "python_backend_stubs" / version / "triton_python_backend_stub", target)
    return target.parent


class PinnedServer:
    """A server process on CPU 0 (`pinned=False`: wherever the kernel puts it), stopped by
    pid."""

    def __init__(
        self,
        name: str,
        command: list[str],
        env: dict[str, str],
        log: Path,
        http_port: int,
        grpc_port: int,
        cwd: Path | None = None,
        pinned: bool = True,
    ) -> None:
        self.name = name
        self.command = ["taskset", "-c", str(SERVER_CPU), *command] if pinned else command
        self.http = f"127.0.0.1:{http_port}"
        self.grpc = f"127.0.0.1:{grpc_port}"
        self._log = open(log, "w")
        self.process = subprocess.Popen(
            self.command,
            env=env,
            stdout=self._log,
            cwd=cwd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}")
            try:
                if httpx.get(f"http://{self.http}/v2/health/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} was not ready within {timeout:.0f}s")

    def tree_cpu(self) -> float:
        """CPU seconds of the server and every process below it."""
        return sum(process_cpu(pid) for pid in process_tree(self.process.pid))

    def tree_switches(self) -> int:
        """Voluntary context switches of the server and every process below it."""
        return tree_switches(self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


# ascend-serve's gRPC on grpc.aio (--grpc-server aio), beside the default (grpcio's synchronous
# server)
AIO = "ascend-serve-aio"


def start_ours(
    repo: Path, out_dir: Path, round_no: int, name: str = "ascend-serve", extra: Sequence[str] = ()
) -> PinnedServer:
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
    return PinnedServer(
        name,
        command,
        dict(os.environ, PYTHONPATH=str(ROOT)),
        out_dir / f"{name}-round{round_no}.log",
        http_port,
        grpc_port,
    )


def start_triton(
    dist: Path, backends: Path, repo: Path, out_dir: Path, round_no: int
) -> PinnedServer:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    command = [
        str(dist / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={backends}",
        "--http-address=127.0.0.1",
        f"--http-port={http_port}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
    ]
    # The python-backend stub embeds libpython and takes its packages (numpy) from the Python
    # it finds first on PATH, as pytriton arranges it.
    # The stub copied out of the wheel finds the wheel's own libraries through this path.
    libs = [str(dist.parent.parent / "nvidia_pytriton.libs"), os.environ.get("LD_LIBRARY_PATH", "")]
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        LD_LIBRARY_PATH=":".join(p for p in libs if p),
    )
    # Not from the checkout: its triton_python_backend_utils.py would shadow Triton's own.
    return PinnedServer(
        "triton",
        command,
        env,
        out_dir / f"triton-round{round_no}.log",
        http_port,
        grpc_port,
        cwd=out_dir,
    )


# ----- one measurement -----------------------------------------------------------------------
def measure(
    perf_analyzer: str,
    server: PinnedServer,
    model: str,
    protocol: str,
    round_no: int,
    out_dir: Path,
    flags: Sequence[str] = served.CONVERGE_FLAGS,
    concurrency: int = CONCURRENCY,
) -> tuple[Sample, list[str]]:
    sample = Sample(server.name, model, protocol, round_no)
    url = server.http if protocol == "http" else server.grpc
    csv_path = out_dir / f"{server.name}-{model}-{protocol}-r{round_no}.csv"
    csv_path.unlink(missing_ok=True)
    command = [
        "taskset",
        "-c",
        str(CLIENT_CPU),
        perf_analyzer,
        "-m",
        model,
        "-i",
        protocol,
        "-u",
        url,
        "--concurrency-range",
        str(concurrency),
        *flags,
        "-f",
        str(csv_path),
    ]
    before_stats = served.model_stats(f"http://{server.http}", model)
    before_cpu, before_switches = server.tree_cpu(), server.tree_switches()
    returncode, output = served.run_command(command, 180)
    cpu = server.tree_cpu() - before_cpu
    switches = server.tree_switches() - before_switches
    after_stats = served.model_stats(f"http://{server.http}", model)
    (out_dir / f"{csv_path.stem}.log").write_text(output)
    requests = served.server_split(before_stats, after_stats).requests
    if returncode != 0 or not csv_path.exists() or requests <= 0:
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        sample.error = f"exit {returncode}: " + " / ".join(lines[-2:])
        return sample, command
    sample.infer_per_sec = float(served.read_csv(csv_path)["Inferences/Second"])
    sample.cpu_us = 1e6 * cpu / requests
    sample.switches = switches / requests
    return sample, command


def run(
    perf_analyzer: str,
    out_dir: Path,
    rounds: int = 3,
    with_triton: bool = True,
    progress: Callable[[str], None] = print,
    flags: Sequence[str] = served.CONVERGE_FLAGS,
    concurrency: int = CONCURRENCY,
) -> SideBySide:
    """Every round: ascend-serve (py_add and simple, HTTP and gRPC), then Triton (py_add).
    `commands` holds the first round's command lines without this machine's paths."""

    def command_line(command: list[str]) -> str:
        return portable(shlex.join(command), perf_analyzer)

    result = SideBySide(concurrency=concurrency)
    if (os.cpu_count() or 1) < 2 or len(os.sched_getaffinity(0)) < 2:
        result.triton = "not measured: needs 2 CPUs (server on one, perf_analyzer on the other)"
        return result
    out_dir.mkdir(parents=True, exist_ok=True)
    ours_repo, triton_repo = out_dir / "models-ours", out_dir / "models-triton"
    for repo in (ours_repo, triton_repo):
        shutil.rmtree(repo, ignore_errors=True)
        shutil.copytree(ROOT / "bench" / "models" / PY_MODEL, repo / PY_MODEL)
    build_simple(ours_repo)
    dist = find_triton() if with_triton else None
    backends: Path | None = None
    if dist is None:
        result.triton = (
            "not measured: --no-triton"
            if not with_triton
            else f"not measured: no tritonserver (install `{TRITON_WHEEL}` into "
            f".venv-triton, or set TRITONSERVER_DIST)"
        )
    else:
        backends = triton_backends(dist, out_dir)
        result.triton = f"{TRITON_WHEEL} ({portable(str(dist))})"
    plan: list[tuple[str, list[tuple[str, str]]]] = [
        (
            "ascend-serve",
            [(PY_MODEL, "http"), (PY_MODEL, "grpc"), ("simple", "http"), ("simple", "grpc")],
        ),
        (AIO, [(PY_MODEL, "grpc")]),
    ]
    if backends is not None:
        plan.append(("triton", [(PY_MODEL, "http"), (PY_MODEL, "grpc")]))
    for round_no in range(1, rounds + 1):
        for name, points in plan:
            if name == "ascend-serve":
                server = start_ours(ours_repo, out_dir, round_no)
            elif name == AIO:
                server = start_ours(ours_repo, out_dir, round_no, AIO, ["--grpc-server", "aio"])
            else:  # "triton" is planned only once both were found
                assert dist is not None and backends is not None
                server = start_triton(dist, backends, triton_repo, out_dir, round_no)
            try:
                server.wait_ready()
                if round_no == 1:
                    result.commands.append(command_line(server.command))
                for model, protocol in points:
                    sample, command = measure(
                        perf_analyzer,
                        server,
                        model,
                        protocol,
                        round_no,
                        out_dir,
                        flags,
                        concurrency,
                    )
                    if round_no == 1:
                        result.commands.append(command_line(command))
                    result.samples.append(sample)
                    progress(
                        f"  round {round_no} {name} {model} {protocol} c{concurrency}: "
                        + (
                            sample.error
                            or f"{sample.infer_per_sec:,.0f} inf/s, "
                            f"{sample.cpu_us:,.0f} µs CPU, "
                            f"{sample.switches:.1f} context switches per inference"
                        )
                    )
            except RuntimeError as exc:
                result.samples.append(Sample(name, "-", "-", round_no, error=str(exc)))
                progress(f"  round {round_no} {name}: {exc}")
            finally:
                server.stop()
    return result


# ----- the report ----------------------------------------------------------------------------
def report(result: SideBySide) -> list[str]:
    lines = [
        "## Server CPU per inference, side by side with Triton (issue #12)",
        "",
        f"Each server and its children pinned to CPU {SERVER_CPU}, perf_analyzer to CPU "
        f"{CLIENT_CPU}, concurrency {result.concurrency}; CPU per inference = the server's process "
        f"tree CPU time / inferences it counted; median of the rounds (each round starts "
        f"the servers afresh; rounds interleave them); context switches: the voluntary ones "
        f"of every thread of the server tree (/proc/<pid>/task/*/status) per inference "
        f"(issue 27 asks <= 8 over gRPC). Triton: {result.triton}.",
        "",
        "| server | model | protocol | inferences/s | server CPU µs per inference "
        "| context switches per inference | rounds (µs) |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    keys = sorted({(s.server, s.model, s.protocol) for s in result.samples if not s.error})
    for key in keys:
        median = result.median(*key)
        assert median is not None  # keys are the (server, model, protocol) with a sample
        rounds = ", ".join(
            f"{s.cpu_us:,.0f}"
            for s in result.samples
            if (s.server, s.model, s.protocol) == key and not s.error
        )
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {median.infer_per_sec:,.0f} | "
            f"{median.cpu_us:,.0f} | {median.switches:.1f} | {rounds} |"
        )
    errors = [s for s in result.samples if s.error]
    if errors:
        lines += [
            "",
            *[
                f"- failed: round {s.round} {s.server} {s.model} {s.protocol}: {s.error}"
                for s in errors
            ],
        ]
    lines += ["", *verdicts(result), ""]
    if result.commands:
        lines += ["```", *result.commands, "```", ""]
    return lines


def verdicts(result: SideBySide) -> list[str]:
    out = []
    for protocol in ("http", "grpc"):
        ours, triton = (result.median(s, PY_MODEL, protocol) for s in ("ascend-serve", "triton"))
        if ours and triton:
            met = "met" if ours.cpu_us <= triton.cpu_us else "not met"
            out.append(
                f"- CPU per inference, Python model `{PY_MODEL}`, {protocol}: ascend-serve "
                f"<= Triton: **{met}** — {ours.cpu_us:,.0f} vs {triton.cpu_us:,.0f} µs "
                f"({ours.cpu_us / triton.cpu_us:.2f}x)"
            )
        elif ours:
            out.append(
                f"- CPU per inference, Python model `{PY_MODEL}`, {protocol}: ascend-serve "
                f"{ours.cpu_us:,.0f} µs; Triton {result.triton}"
            )
        simple = result.median("ascend-serve", "simple", protocol)
        if simple:
            limit = TARGETS_US[protocol]
            met = "met" if simple.cpu_us <= limit else "not met"
            out.append(
                f"- CPU per inference, ONNX `simple`, {protocol}: <= {limit:.0f} µs: "
                f"**{met}** — {simple.cpu_us:,.0f} µs"
            )
    ours = result.median("ascend-serve", PY_MODEL, "grpc")
    if ours:
        met = "met" if ours.switches <= GRPC_SWITCHES_TARGET else "not met"
        out.append(
            f"- Context switches per inference, Python model `{PY_MODEL}`, grpc: <= "
            f"{GRPC_SWITCHES_TARGET:.0f}: **{met}** — {ours.switches:.1f} (every thread of the "
            f"server tree; the thread hops one request costs)"
        )
    aio = result.median(AIO, PY_MODEL, "grpc")
    if aio:
        met = "met" if aio.switches <= GRPC_SWITCHES_TARGET else "not met"
        than = f", {aio.cpu_us / ours.cpu_us:.2f}x the CPU of the default" if ours else ""
        out.append(
            f"- The same with `--grpc-server aio`: **{met}** — {aio.switches:.1f} "
            f"switches, {aio.cpu_us:,.0f} µs CPU per inference{than}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help="perf_analyzer's concurrency (1: issue 27's target 2, throughput against Triton's)",
    )
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out" / "cpu")
    args = parser.parse_args(argv)
    perf_analyzer = os.environ.get("PERF_ANALYZER") or shutil.which("perf_analyzer")
    if not perf_analyzer:
        print("set PERF_ANALYZER (see bench/README.md)", file=sys.stderr)
        return 2
    result = run(
        perf_analyzer, args.out_dir, args.rounds, not args.no_triton, concurrency=args.concurrency
    )
    print("\n".join(report(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
