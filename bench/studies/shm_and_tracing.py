"""System shared memory against the socket for a large tensor, and what tracing costs a request
that is not traced, both measured with perf_analyzer; writes the `shm-tracing` section of
bench/RESULTS.md (bench/sections.py keeps it when bench/run.py rewrites the rest).

Why: shared memory exists to skip copying large tensors through a socket, so its gain is
measured on a 4 MiB FP32 identity model (the tensor goes in and comes back); tracing promises
that an untraced request pays one sampling decision, so `simple` is measured with no trace
configuration, with tracing configured but OFF, and with TIMESTAMPS on at a rate that samples
(almost) nothing.

    PERF_ANALYZER=... .venv/bin/python -m bench.studies.shm_and_tracing [--seconds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from bench.sections import replace_section
from examples.build_repository import build_simple
from harness.serverproc import running_server

ROOT = Path(__file__).resolve().parents[2]
ELEMENTS = 1 << 20  # FP32: 4 MiB each way
_SUMMARY = re.compile(r"Concurrency: (\d+), throughput: ([\d.]+) infer/sec, latency (\d+) usec")
_P50 = re.compile(r"p50 latency: (\d+) usec")


def build_identity_fp32(repo: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])],
        "identity_fp32",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    folder = repo / "identity_fp32"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(
        'name: "identity_fp32"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [{ name: "INPUT" data_type: TYPE_FP32 dims: [-1] }]\n'
        'output [{ name: "OUTPUT" data_type: TYPE_FP32 dims: [-1] }]\n'
    )


def perf(
    binary: str, url: str, protocol: str, model: str, seconds: float, extra: list[str]
) -> tuple[float, int]:
    """(throughput, p50 latency in µs) at concurrency 1."""
    command = [
        binary,
        "-m",
        model,
        "-i",
        protocol,
        "-u",
        url,
        "--concurrency-range",
        "1",
        "--measurement-interval",
        str(int(seconds * 1000)),
        "--stability-percentage",
        "100",
        "--max-trials",
        "8",
        *extra,
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    output = run.stdout + run.stderr
    summary, p50 = _SUMMARY.search(output), _P50.search(output)
    if run.returncode != 0 or summary is None or p50 is None:
        raise RuntimeError(f"perf_analyzer failed:\n{' '.join(command)}\n{output[-2000:]}")
    return float(summary.group(2)), int(p50.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement interval")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    args = parser.parse_args()
    binary = os.environ.get("PERF_ANALYZER")
    if not binary:
        print("set PERF_ANALYZER (`.venv/bin/python -m harness.perf_analyzer` prints its path)")
        return 2
    lines = [
        "## Shared memory and tracing (`bench/studies/shm_and_tracing.py`)",
        "",
        f"perf_analyzer at concurrency 1, {args.seconds:g} s windows, on this shared "
        "machine (compare within a table, not across runs).",
        "",
        f"### System shared memory: `identity_fp32`, FP32 [{ELEMENTS}] (4 MiB) in and out",
        "",
        "| protocol | tensors through | infer/s | p50 µs |",
        "|---|---|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as folder:
        repo = Path(folder) / "models"
        build_identity_fp32(repo)
        build_simple(repo)
        with running_server([repo], log_dir=Path(folder)) as server:
            for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
                gains = []
                for label, extra in (
                    ("socket", []),
                    (
                        "system shared memory",
                        [
                            "--shared-memory=system",
                            "--output-shared-memory-size",
                            str(ELEMENTS * 4),
                        ],
                    ),
                ):
                    rate, p50 = perf(
                        binary,
                        url,
                        protocol,
                        "identity_fp32",
                        args.seconds,
                        ["--shape", f"INPUT:{ELEMENTS}", *extra],
                    )
                    gains.append(rate)
                    lines.append(f"| {protocol} | {label} | {rate:,.1f} | {p50:,} |")
                lines.append(f"| {protocol} | **gain** | **{gains[1] / gains[0]:.2f}x** | |")
        lines += [
            "",
            "### Tracing: `simple` over HTTP, requests not traced",
            "",
            "| trace configuration | infer/s | p50 µs |",
            "|---|---:|---:|",
        ]
        trace_file = Path(folder) / "trace.json"
        for label, config in (
            ("none", []),
            ("configured, level OFF", ["--trace-config", f"triton,file={trace_file}"]),
            (
                "TIMESTAMPS, rate 1000000 (one sampling decision per request)",
                [
                    "--trace-config",
                    f"triton,file={trace_file}",
                    "--trace-config",
                    "level=TIMESTAMPS",
                    "--trace-config",
                    "rate=1000000",
                ],
            ),
        ):
            with running_server([repo], config, log_dir=Path(folder)) as server:
                rate, p50 = perf(binary, server.http_url, "http", "simple", args.seconds, [])
            lines.append(f"| {label} | {rate:,.1f} | {p50:,} |")
    replace_section(args.results, "shm-tracing", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
