"""NVIDIA's perf_analyzer over gRPC (unary and streaming) against `simple`: what it calls at
startup (metadata, config, shared-memory unregister) and under load must all succeed.

The binary's path comes from $PERF_ANALYZER (`make test` finds or installs it with
harness/perf_analyzer.py); without it these tests skip and the end of the run says so.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.support import tools

pytestmark = pytest.mark.e2e


@tools.needs_perf_analyzer
@pytest.mark.parametrize("extra", [[], ["--streaming"]], ids=["unary", "streaming"])
def test_perf_analyzer_grpc(example_server, extra: list[str]) -> None:
    command = [
        tools.perf_analyzer(),
        "-m",
        "simple",
        "-i",
        "grpc",
        "-u",
        example_server.grpc_url,
        "--concurrency-range",
        "1:2",
        "--measurement-interval",
        "500",
        "--max-trials",
        "4",
        "--stability-percentage",
        "1000",
        *extra,
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "Throughput:" in output and "infer/sec" in output, output
    assert "error" not in output.lower(), output
