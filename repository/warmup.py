"""`model_warmup`: run the config's warm-up samples through a new version before it serves.

The first requests on a fresh model copy are slow (lazy allocations, kernel selection, NPU
graph preparation), so each sample runs `count` times through the version's own scheduler while
the previous copy still serves. The samples enter where client requests do, `Scheduler.submit`
(validation, queue, batcher), not through the infer path (server/core/inference_path.py says
why). As in Triton, a sample of batch size N is N single-row requests
sent together, so the batcher can group them. A failing sample fails the load. Afterwards the
counters start again from zero: statistics and metrics describe client traffic only.
"""

from __future__ import annotations

import asyncio
from pathlib import Path, PurePosixPath

import numpy as np

from protocol import datatypes
from protocol.errors import ServerError
from protocol.proto.model_config_pb2 import DataType, ModelConfig, ModelWarmup
from protocol.types import InferRequest, Tensor
from scheduler.interface import Scheduler, VersionSpec

WARMUP_DIR = "warmup"


class WarmupError(Exception):
    """A warm-up sample could not be built or did not run; the version does not load."""


def _sample_error(sample: ModelWarmup, message: str) -> WarmupError:
    return WarmupError(f"failed to run warmup sample '{sample.name}': {message}")


def _read_data_file(model_dir: Path, sample: ModelWarmup, file_name: str) -> bytes:
    relative = PurePosixPath(file_name)
    if relative.is_absolute() or any(part in ("", ".", "..") for part in file_name.split("/")):
        raise _sample_error(
            sample,
            f"input_data_file '{file_name}' must be a plain path inside "
            f"the model's '{WARMUP_DIR}' directory",
        )
    try:
        return (model_dir / WARMUP_DIR).joinpath(*relative.parts).read_bytes()
    except OSError as exc:
        raise _sample_error(
            sample, f"cannot read input_data_file '{file_name}': {exc.strerror or exc}"
        ) from None


def _input_array(
    model_dir: Path,
    sample: ModelWarmup,
    name: str,
    spec: ModelWarmup.Input,
    rng: np.random.Generator,
) -> tuple[str, np.ndarray]:
    """The wire datatype and the array (without the batch dimension) for one sample input."""
    try:
        dtype = datatypes.BY_CONFIG_NAME[DataType.Name(spec.data_type)]
    except (KeyError, ValueError):
        raise _sample_error(sample, f"input '{name}' has an unsupported data_type") from None
    dims = [int(d) for d in spec.dims]
    if any(d < 0 for d in dims):
        raise _sample_error(sample, f"input '{name}' must give fixed dims, got {dims}")
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    choice = spec.WhichOneof("input_data_type")
    if dtype.name == "BYTES":
        if choice == "input_data_file":
            raw = _read_data_file(model_dir, sample, spec.input_data_file)
            try:
                array = datatypes.deserialize_bytes(raw, count, name)
            except ServerError as exc:
                raise _sample_error(sample, exc.message) from None
        else:  # zero_data and random_data both give empty strings, as Triton does
            array = np.array([b""] * count, dtype=object)
        return dtype.name, array.reshape(dims)
    assert dtype.numpy is not None
    if choice == "input_data_file":
        raw = _read_data_file(model_dir, sample, spec.input_data_file)
        needed = count * dtype.itemsize
        if len(raw) < needed:
            raise _sample_error(
                sample,
                f"input '{name}' needs {needed} bytes, but "
                f"'{spec.input_data_file}' holds {len(raw)}",
            )
        array = np.frombuffer(raw[:needed], dtype=dtype.numpy).copy()
    elif choice == "random_data":
        if dtype.numpy.kind == "f":
            array = rng.random(count).astype(dtype.numpy)
        elif dtype.numpy.kind == "b":
            array = rng.integers(0, 2, count).astype(dtype.numpy)
        else:
            array = rng.integers(0, 8, count).astype(dtype.numpy)
    else:
        array = np.zeros(count, dtype=dtype.numpy)
    return dtype.name, array.reshape(dims)


def build_requests(spec: VersionSpec, sample: ModelWarmup) -> list[InferRequest]:
    """The requests of one sample (blocking: may read data files)."""
    config: ModelConfig = spec.config
    batching = config.max_batch_size > 0
    rows = int(sample.batch_size)
    if not batching and rows > 1:
        raise _sample_error(sample, f"batch_size {rows} needs a model that batches")
    rng = np.random.default_rng()
    inputs = {
        name: _input_array(spec.model_dir, sample, name, item, rng)
        for name, item in sorted(sample.inputs.items())
    }
    requests = []
    for index in range(rows):
        tensors = []
        for name, (wire, array) in inputs.items():
            data = array[np.newaxis, ...] if batching else array
            tensors.append(Tensor(name, wire, tuple(data.shape), data))
        requests.append(
            InferRequest(
                config.name, str(spec.version), id=f"warmup:{sample.name}:{index}", inputs=tensors
            )
        )
    return requests


async def run_warmup(spec: VersionSpec, scheduler: Scheduler) -> None:
    """Run every sample of the config; raise WarmupError on the first failure."""
    samples = list(spec.config.model_warmup)
    if not samples:
        return
    for sample in samples:
        if sample.batch_size == 0:
            continue  # Triton skips batch-0 samples
        requests = await asyncio.to_thread(build_requests, spec, sample)
        for _ in range(max(int(sample.count), 1)):
            try:
                futures = []
                for request in requests:
                    clone = InferRequest(
                        request.model_name,
                        request.model_version,
                        id=request.id,
                        inputs=list(request.inputs),
                    )
                    futures.append(scheduler.submit(clone))  # validates, as for clients
                await asyncio.gather(*futures)
            except ServerError as exc:
                raise _sample_error(sample, exc.message) from None
            except Exception as exc:
                raise _sample_error(sample, str(exc)) from None
    scheduler.statistics.reset()
