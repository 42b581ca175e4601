"""Ragged batching: Triton's `allow_ragged_batch` inputs, `batch_input` and `batch_output`.

Requests whose ragged inputs have different lengths share a batch (the batcher does not group
by their shapes). A runtime that batches (ONNX Runtime) gets every ragged input as one 1-D
tensor, the requests' elements one after another, whatever their shapes, and the batch inputs
the config asks for, computed from the batch as formed, so the model can find each request's
part (Triton's docs/user_guide/ragged_batching.md):

- BATCH_ELEMENT_COUNT: [requests], each request's element count of the source input;
- BATCH_ACCUMULATED_ELEMENT_COUNT: [requests], the running total (where each request ends);
- BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO: [requests + 1], the same after a leading 0;
- BATCH_MAX_ELEMENT_COUNT_AS_SHAPE: a tensor whose shape is [the largest element count];
- BATCH_ITEM_SHAPE: [batch rows, source dims], each row the shape of its request's source input
  after the batch dimension; BATCH_ITEM_SHAPE_FLATTEN: the same as one dimension.

A `batch_output` of kind BATCH_SCATTER_WITH_INPUT_SHAPE is cut back per request by the element
counts of its source input and takes that input's shape; other outputs are split by batch rows.
Python models get each request's tensors as sent, so for them ragged batching only lets
requests of different lengths share an `execute` call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from protocol import datatypes
from protocol.proto.model_config_pb2 import BatchInput, DataType, ModelConfig


class RaggedBatching:
    """What one model version's config asks of ragged batching, read once at load."""

    def __init__(self, config: ModelConfig) -> None:
        self.ragged = frozenset(spec.name for spec in config.input if spec.allow_ragged_batch)
        self.batch_inputs = [
            (
                BatchInput.Kind.Name(spec.kind),
                list(spec.target_name),
                datatypes.BY_CONFIG_NAME[DataType.Name(spec.data_type)].numpy,
                spec.source_input[0] if spec.source_input else "",
            )
            for spec in config.batch_input
        ]
        self.scatter = {
            target: spec.source_input[0]
            for spec in config.batch_output
            for target in spec.target_name
            if spec.source_input
        }

    @classmethod
    def of(cls, config: ModelConfig) -> RaggedBatching | None:
        """None for the usual model (no ragged input, batch input or batch output)."""
        if not (
            any(spec.allow_ragged_batch for spec in config.input)
            or len(config.batch_input)
            or len(config.batch_output)
        ):
            return None
        return cls(config)

    # ----- into the runtime --------------------------------------------------------------
    def gather(self, requests: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The batch's inputs: ragged ones joined flat, the rest along the batch dimension,
        then the batch inputs."""
        inputs: dict[str, np.ndarray] = {}
        for name in requests[0]:
            parts = [request[name] for request in requests]
            if name in self.ragged:
                inputs[name] = np.concatenate([part.reshape(-1) for part in parts])
            else:
                inputs[name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        for kind, targets, dtype, source in self.batch_inputs:
            tensor = batch_input(kind, [request[source] for request in requests], dtype)
            for target in targets:
                inputs[target] = tensor
        return inputs

    # ----- back to the requests ----------------------------------------------------------
    def split(
        self,
        outputs: Mapping[str, np.ndarray],
        rows: Sequence[int],
        requests: Sequence[Mapping[str, np.ndarray]],
    ) -> list[dict[str, np.ndarray]]:
        pieces: list[dict[str, np.ndarray]] = [{} for _ in rows]
        for name, array in outputs.items():
            source = self.scatter.get(name)
            if source is not None:
                shapes = [request[source].shape for request in requests]
                counts = [int(np.prod(shape)) for shape in shapes]
                flat = np.asarray(array).reshape(-1)
                if flat.size != sum(counts):
                    raise ValueError(
                        f"batch output '{name}' has {flat.size} elements, its "
                        f"source input '{source}' {sum(counts)}"
                    )
                start = 0
                for index, (shape, count) in enumerate(zip(shapes, counts, strict=False)):
                    pieces[index][name] = flat[start : start + count].reshape(shape)
                    start += count
                continue
            if array.ndim == 0 or array.shape[0] < sum(rows):
                raise ValueError(
                    f"output '{name}' has {array.shape[:1] or 'no'} rows, "
                    f"expected {sum(rows)} (one per batch row)"
                )
            start = 0
            for index, count in enumerate(rows):
                pieces[index][name] = array[start : start + count]
                start += count
        return pieces


def batch_input(kind: str, sources: list[np.ndarray], dtype: np.dtype | None) -> np.ndarray:
    """One BATCH_* input of `kind` computed from the requests' `sources` tensors."""
    counts = np.array([source.size for source in sources], dtype=np.int64)
    if kind == "BATCH_ELEMENT_COUNT":
        return counts.astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.cumsum(counts).astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.concatenate([[0], np.cumsum(counts)]).astype(dtype)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(int(counts.max(initial=0)), dtype=dtype)
    rows = [list(source.shape[1:]) for source in sources for _ in range(source.shape[0])]
    shapes = np.array(rows, dtype=dtype).reshape(len(rows), -1)
    if kind == "BATCH_ITEM_SHAPE":
        return shapes
    if kind == "BATCH_ITEM_SHAPE_FLATTEN":
        return shapes.reshape(-1)
    raise ValueError(f"unknown batch input kind {kind}")
