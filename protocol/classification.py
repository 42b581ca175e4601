"""Triton's classification extension: replace an output by its top-k "value:index[:label]"."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from protocol.types import Tensor


def _format_value(value: np.generic) -> str:
    # C++ std::to_string: "%f" for floating point, plain digits for integers.
    if np.issubdtype(type(value), np.floating):
        return f"{float(value):f}"
    if np.issubdtype(type(value), np.bool_):
        return "1" if value else "0"
    return str(int(value))


def classify(tensor: Tensor, k: int, batching: bool, labels: list[str]) -> Tensor:
    """Top-k per batch item (or for the whole tensor when the model does not batch)."""
    rows = tensor.data.reshape(tensor.data.shape[0], -1) if batching else tensor.data.reshape(1, -1)
    count = min(k, rows.shape[1])
    result = np.empty((rows.shape[0], count), dtype=object)
    for r, row in enumerate(rows):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:count]
        for c, index in enumerate(order):
            text = f"{_format_value(row[index])}:{int(index)}"
            if int(index) < len(labels):
                text += f":{labels[int(index)]}"
            result[r, c] = text.encode("utf-8")
    shape = (rows.shape[0], count) if batching else (count,)
    return Tensor(tensor.name, "BYTES", shape, result.reshape(shape))


def read_labels(path: Path) -> list[str]:
    return [line.rstrip("\r\n") for line in path.read_text(encoding="utf-8").splitlines()]
