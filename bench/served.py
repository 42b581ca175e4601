"""The served measurement: perf_analyzer against a running server, one concurrency per call.

Throughput and client p50/p99 come from perf_analyzer's CSV (`-f`). Around each call the bench
also reads the server's statistics endpoint (the difference gives the average batch size, how a
request's server time splits into queue, compute and the rest, and `session.run` time per batch
size) and the CPU time of the server's threads and of perf_analyzer (/proc and getrusage): on a
2-core machine the CPU microseconds each request costs decide the ceiling.
"""

from __future__ import annotations

import csv
import os
import resource
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

# Flags that converge on a shared 2-core machine (see bench/README.md); when the noise still
# defeats them, the point is measured once more with a looser stability band and more trials.
CONVERGE_FLAGS = (
    "--measurement-interval",
    "3000",
    "--stability-percentage",
    "50",
    "--max-trials",
    "5",
)
RETRY_FLAGS = (
    "--measurement-interval",
    "3000",
    "--stability-percentage",
    "100",
    "--max-trials",
    "8",
)


@dataclass
class ServerSplit:
    """Per-request averages from the server's statistics, in µs, over one perf_analyzer call."""

    requests: int = 0
    executions: int = 0
    total_us: float = 0.0
    queue_us: float = 0.0
    compute_us: float = 0.0  # compute input + infer + output
    infer_us: float = 0.0
    infer_by_batch: dict[int, tuple[int, int]] = field(default_factory=dict)  # size: (runs, ns)

    @property
    def avg_batch(self) -> float:
        return self.requests / self.executions if self.executions else 0.0

    @property
    def other_us(self) -> float:
        """Core time that is neither queue nor compute: the hop to the instance thread and the
        hop back to the event loop, then delivery."""
        return self.total_us - self.queue_us - self.compute_us


@dataclass
class Cpu:
    """CPU seconds spent during one perf_analyzer call."""

    loop: float = 0.0  # the server's main thread: event loop, HTTP and gRPC frontends, scheduler
    threads: float = 0.0  # the server's other threads: instances (gather, run, split), gRPC poller
    client: float = 0.0  # perf_analyzer

    @property
    def server(self) -> float:
        return self.loop + self.threads


@dataclass
class Point:
    model: str
    protocol: str
    concurrency: int
    command: list[str]
    ok: bool = False
    error: str = ""
    infer_per_sec: float = 0.0
    p50_us: float = 0.0
    p99_us: float = 0.0
    seconds: float = 0.0
    retried: bool = False  # the first call did not stabilise; these numbers are RETRY_FLAGS'
    server: ServerSplit = field(default_factory=ServerSplit)
    cpu: Cpu = field(default_factory=Cpu)

    def cpu_us_per_request(self, seconds: float) -> float:
        """CPU µs per request, over the whole call (the server counted every request in it)."""
        requests = self.server.requests
        return 1e6 * seconds / requests if requests else 0.0

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)


def model_stats(base_url: str, model: str) -> dict | None:
    try:
        response = httpx.get(f"{base_url}/v2/models/{model}/stats", timeout=10.0)
        response.raise_for_status()
        return response.json()["model_stats"][0]
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        return None


def server_split(before: dict | None, after: dict | None) -> ServerSplit:
    if not before or not after:
        return ServerSplit()

    def delta(*keys: str) -> int:
        a: Any = after
        b: Any = before
        for key in keys:  # nested dicts down to a number
            a, b = a[key], b[key]
        return int(a) - int(b)

    requests = delta("inference_stats", "success", "count")
    if requests <= 0:
        return ServerSplit()

    def per_request_us(stat: str) -> float:
        return delta("inference_stats", stat, "ns") / requests / 1e3

    by_batch = {}
    old = {b["batch_size"]: b["compute_infer"] for b in before.get("batch_stats", [])}
    for b in after.get("batch_stats", []):
        was = old.get(b["batch_size"], {"count": 0, "ns": 0})
        runs = int(b["compute_infer"]["count"]) - int(was["count"])
        if runs > 0:
            by_batch[b["batch_size"]] = (runs, int(b["compute_infer"]["ns"]) - int(was["ns"]))
    compute = sum(per_request_us(s) for s in ("compute_input", "compute_infer", "compute_output"))
    return ServerSplit(
        requests=requests,
        executions=delta("execution_count"),
        total_us=per_request_us("success"),
        queue_us=per_request_us("queue"),
        compute_us=compute,
        infer_us=per_request_us("compute_infer"),
        infer_by_batch=by_batch,
    )


def _thread_cpu(pid: int) -> dict[int, float]:
    """tid -> CPU seconds for every thread of a process (Python does not name OS threads, so
    only the main thread, tid == pid, can be told apart)."""
    tick = os.sysconf("SC_CLK_TCK")
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        threads[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return threads


def _cpu(pid: int, before: dict[int, float], client_seconds: float) -> Cpu:
    cpu = Cpu(client=client_seconds)
    for tid, seconds in _thread_cpu(pid).items():
        spent = seconds - before.get(tid, 0.0)
        if tid == pid:
            cpu.loop += spent
        else:
            cpu.threads += spent
    return cpu


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def read_csv(path: Path) -> dict[str, str]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path} has no rows")
    return rows[0]


def run_command(command: list[str], timeout: float) -> tuple[int, str]:
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        return run.returncode, run.stdout + run.stderr
    except subprocess.TimeoutExpired as exc:
        output = b"".join(
            x if isinstance(x, bytes) else (x or "").encode() for x in (exc.stdout, exc.stderr)
        )
        return -1, output.decode(errors="replace") + f"\ntimed out after {timeout}s"


def run_point(
    perf_analyzer: str,
    model: str,
    protocol: str,
    url: str,
    http_base: str,
    server_pid: int,
    concurrency: int,
    out_dir: Path,
    flags: Sequence[str] = CONVERGE_FLAGS,
    timeout: float = 120.0,
) -> Point:
    """One perf_analyzer call at one concurrency (a second, more tolerant one if the first
    does not stabilise); never raises for a failed measurement."""
    stem = f"{model}-{protocol}-c{concurrency}"
    csv_path = out_dir / f"{stem}.csv"
    before = model_stats(http_base, model)
    threads_before, client_before = _thread_cpu(server_pid), _children_cpu()
    start = time.monotonic()
    for attempt in (flags, RETRY_FLAGS):
        csv_path.unlink(missing_ok=True)
        command = [
            perf_analyzer,
            "-m",
            model,
            "-i",
            protocol,
            "-u",
            url,
            "--concurrency-range",
            str(concurrency),
            *attempt,
            "-f",
            str(csv_path),
        ]
        returncode, output = run_command(command, timeout)
        if returncode == 0 or "stable measurement" not in output:
            break
    point = Point(model, protocol, concurrency, command, retried=attempt is RETRY_FLAGS)
    point.seconds = time.monotonic() - start
    point.cpu = _cpu(server_pid, threads_before, _children_cpu() - client_before)
    point.server = server_split(before, model_stats(http_base, model))
    (out_dir / f"{stem}.log").write_text(output)
    if returncode != 0 or not csv_path.exists():
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        point.error = f"exit {returncode}: " + (" / ".join(lines[-3:]) or "no output")
        return point
    row = read_csv(csv_path)
    point.infer_per_sec = float(row["Inferences/Second"])
    point.p50_us = float(row["p50 latency"])
    point.p99_us = float(row["p99 latency"])
    point.ok = True
    return point
