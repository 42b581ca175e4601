"""NVIDIA's perf_analyzer over gRPC (unary and streaming) against `simple`: what it calls at
startup (metadata, config, shared-memory unregister) and under load must all succeed.

The binary's path comes from $PERF_ANALYZER (`make test` sets it through
../shared/tools/install-perf-analyzer); without it these tests skip.
"""

from __future__ import annotations

import os
import subprocess

import pytest

pytestmark = pytest.mark.e2e

PERF_ANALYZER = os.environ.get("PERF_ANALYZER")


@pytest.mark.skipif(not PERF_ANALYZER, reason="PERF_ANALYZER is not set")
@pytest.mark.parametrize("extra", [[], ["--streaming"]], ids=["unary", "streaming"])
def test_perf_analyzer_grpc(example_server, extra: list[str]) -> None:
    command = [
        PERF_ANALYZER,
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
