"""What gray release costs the infer path per request (issue 15): no policy, a weighted split,
a sticky key. Without a policy the path makes one dict lookup (and a version check, to count
named requests) more than before policies existed: measured against that
server/core/inference_path.py on the same registry, about 0.1 µs per request (2.45 -> 2.51 µs
in a quiet run), within noise next to the ~130 µs of server CPU an HTTP inference costs.

Runs the real InferencePath over a registry of three versions whose scheduler answers at once,
so what is timed is resolve + submit + await, not a model. Prints microseconds per request
(best of several repetitions, on this machine, now). Usage: python -m bench.studies.traffic_routing
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
from google.protobuf import text_format

from harness.fakescheduler import InstantScheduler
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.traffic import decode_traffic
from protocol.types import InferRequest, InferResponse, Tensor
from repository.registry import ModelRegistry, ModelState, VersionRecord
from scheduler.interface import VersionSpec
from scheduler.stats import VersionStatistics
from server.core.inference_path import InferencePath

CONFIG = """name: "m" max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]"""
N = 20_000
REPEATS = 5


class _Immediate(InstantScheduler):
    """Validates like every scheduler, then answers at once."""

    def _admit(self, request: InferRequest) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        future.set_result(InferResponse("m", str(self.spec.version), outputs=request.inputs))
        return future


def build_path() -> InferencePath:
    registry = ModelRegistry()
    config = text_format.Parse(CONFIG, ModelConfig())
    for version in (1, 2, 3):
        spec = VersionSpec("m", version, config, Path("."), Path("."), None)  # type: ignore[arg-type]
        registry.record("m").versions[version] = VersionRecord(
            version, ModelState.READY, "", spec, _Immediate(spec, VersionStatistics("m", "1"))
        )
    return InferencePath(registry)


async def _per_request_us(path: InferencePath, key: str | None) -> float:
    x = Tensor("X", "FP32", (1,), np.zeros(1, np.float32))
    requests = [
        InferRequest(
            "m", inputs=[x], parameters={} if key is None else {"traffic_key": f"{key}-{i % 1000}"}
        )
        for i in range(N)
    ]
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        for request in requests:
            await path.infer(request)
        best = min(best, (time.perf_counter() - started) / N * 1e6)
    return best


async def main() -> None:
    path = build_path()
    rows = [("no policy", await _per_request_us(path, None))]
    path.traffic.replace("m", decode_traffic({"weights": {"1": 90, "2": 10}}))
    rows.append(("weights 90/10, random split", await _per_request_us(path, None)))
    rows.append(("weights 90/10, traffic_key (hash)", await _per_request_us(path, "user")))
    base = rows[0][1]
    print(f"{'infer path, per request':45} {'µs':>7} {'vs none':>10}")
    for label, value in rows:
        print(f"{label:45} {value:7.2f} {value - base:+9.2f}")


if __name__ == "__main__":
    asyncio.run(main())
