"""The offline reference: ONNX Runtime called directly in this process.

The session is opened on the same model file with the server's own session options
(`backends.onnxruntime` reads intra/inter-op thread counts from config.pbtxt), so a served/offline
ratio compares the server against exactly what it runs, not against a faster configuration.
Measurements are repeated and the best kept: on a shared, noisy machine the best repetition is the
closest to what the hardware can do. A Python model's reference is its `TritonPythonModel.execute`
called in this process on one request built with the project's `triton_python_backend_utils`.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# The server's own options builder (private, but using it is what makes the ratio fair).
from backends.onnxruntime import session_options
from repository.config import read_config

_RANDOM = {
    "tensor(float)": lambda rng, shape: rng.standard_normal(shape, dtype=np.float32),
    "tensor(int32)": lambda rng, shape: rng.integers(-1000, 1000, shape, dtype=np.int32),
}


@dataclass
class Throughput:
    batch_size: int
    best_infer_per_sec: float
    runs: list[float]  # inferences/sec of every repetition

    @property
    def batch_us(self) -> float:
        return 1e6 * self.batch_size / self.best_infer_per_sec


@dataclass
class Latency:
    batch_size: int
    calls: int
    p50_us: float
    p99_us: float
    runs_p50_us: list[float]
    call: str = "session.run"  # what was timed: "session.run" (ONNX) or "execute" (Python model)


def open_session(model_dir: Path, version: str = "1") -> Any:
    """An InferenceSession as the server's ONNX Runtime backend opens it (CPU provider)."""
    import onnxruntime as ort

    config = read_config(model_dir)
    path = model_dir / version / "model.onnx"
    return ort.InferenceSession(
        str(path), sess_options=session_options(config), providers=["CPUExecutionProvider"]
    )


def random_feeds(session: Any, batch_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for tensor in session.get_inputs():
        shape = [batch_size, *tensor.shape[1:]]  # the example models have static inner dims
        feeds[tensor.name] = _RANDOM[tensor.type](rng, shape)
    return feeds


def _rate(session: Any, feeds: dict[str, np.ndarray], batch_size: int, seconds: float) -> float:
    calls, start = 0, time.perf_counter()
    while True:
        session.run(None, feeds)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return calls * batch_size / elapsed


def throughput(
    model_dir: Path, batch_sizes: Sequence[int], repetitions: int = 3, seconds: float = 0.5
) -> list[Throughput]:
    """Inferences/sec per batch size; repetitions are interleaved across batch sizes so that a
    noisy moment on the machine does not spoil every repetition of one size."""
    session = open_session(model_dir)
    feeds = {b: random_feeds(session, b, seed=b) for b in batch_sizes}
    # Warm-up, since first runs allocate and plan: 20 runs, cut short after 0.5 s for a heavy
    # model, never fewer than 2.
    for b in batch_sizes:
        start = time.perf_counter()
        for i in range(20):
            session.run(None, feeds[b])
            if i >= 1 and time.perf_counter() - start > 0.5:
                break
    runs: dict[int, list[float]] = {b: [] for b in batch_sizes}
    for _ in range(repetitions):
        for b in batch_sizes:
            runs[b].append(_rate(session, feeds[b], b, seconds))
    return [Throughput(b, max(runs[b]), runs[b]) for b in batch_sizes]


def merge(first: list[Throughput], second: list[Throughput]) -> list[Throughput]:
    """Two measurements of the same batch sizes (before and after the served runs) as one."""
    return [
        Throughput(a.batch_size, max(a.best_infer_per_sec, b.best_infer_per_sec), a.runs + b.runs)
        for a, b in zip(first, second, strict=False)
    ]


def latency(
    model_dir: Path, batch_size: int = 1, calls: int = 3000, repetitions: int = 3
) -> Latency:
    """p50/p99 of single `session.run` calls, timed one by one; the repetition with the best p50
    is kept (the lowest reference, so the latency the server adds is never understated)."""
    session = open_session(model_dir)
    feeds = random_feeds(session, batch_size)
    return _timed(lambda: session.run(None, feeds), batch_size, calls, repetitions)


def python_latency(
    model_dir: Path, calls: int = 3000, repetitions: int = 3, version: str = "1"
) -> Latency:
    """p50/p99 of `TritonPythonModel.execute` on one batch-1 request (random inputs shaped by
    config.pbtxt, built with the project's `triton_python_backend_utils`), called in this
    process: the Python model's own time, with no server, IPC or worker process around it."""
    from google.protobuf import json_format

    import triton_python_backend_utils as pb_utils
    from protocol.proto.model_config_pb2 import DataType

    config = read_config(model_dir)
    name = config.name or model_dir.name
    path = model_dir / version / "model.py"
    spec = importlib.util.spec_from_file_location(f"_bench_python_model_{name}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    if hasattr(model, "initialize"):
        model.initialize(
            {
                "model_config": json.dumps(
                    json_format.MessageToDict(config, preserving_proto_field_name=True)
                ),
                "model_name": name,
                "model_version": version,
                "model_repository": str(model_dir),
                "model_instance_kind": "CPU",
                "model_instance_name": f"{name}_0",
                "model_instance_device_id": "0",
            }
        )
    rng = np.random.default_rng(0)
    tensors = []
    for tensor in config.input:
        dtype = pb_utils.triton_string_to_numpy(DataType.Name(tensor.data_type))
        shape = [1, *tensor.dims] if config.max_batch_size > 0 else list(tensor.dims)
        tensors.append(
            pb_utils.Tensor(tensor.name, (rng.standard_normal(shape) * 100).astype(dtype))
        )
    request = pb_utils.InferenceRequest(name, tensors, [t.name for t in config.output])
    result = _timed(lambda: model.execute([request]), 1, calls, repetitions)
    result.call = "execute"
    return result


def _timed(call: Any, batch_size: int, calls: int, repetitions: int) -> Latency:
    for _ in range(200):
        call()
    best: tuple[float, float] | None = None
    p50s = []
    for _ in range(repetitions):
        samples = []
        for _ in range(calls):
            start = time.perf_counter_ns()
            call()
            samples.append(time.perf_counter_ns() - start)
        p50 = statistics.median(samples) / 1e3
        p99 = float(np.percentile(samples, 99)) / 1e3
        p50s.append(p50)
        if best is None or p50 < best[0]:
            best = (p50, p99)
    assert best is not None
    return Latency(batch_size, calls, best[0], best[1], p50s)
