"""Pure numpy batch plumbing: gather requests into one batch, scatter outputs back, pad to gears.

Kept free of asyncio and of the config so it can run on an instance thread and be tested alone.
The rules that keep the hot path cheap: a one-request batch is passed through untouched (no copy),
a real batch is built with exactly one copy per input (padding included), and outputs are handed
back as views (slices), never copies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def concat_inputs(
    requests: Sequence[Mapping[str, np.ndarray]], pad_to: int | None = None
) -> dict[str, np.ndarray]:
    """Join each input of several requests along dim 0.

    All requests carry the same input names (the batcher only groups such requests). An input
    whose non-batch dims differ between requests (a ragged input) is joined flat, as 1-D.
    `pad_to` adds zero rows up to that many rows, within the same single copy.
    """
    if not requests:
        raise ValueError("cannot batch zero requests")
    first = requests[0]
    if len(requests) == 1 and pad_to is None:
        return dict(first)
    batched: dict[str, np.ndarray] = {}
    for name in first:
        parts = [request[name] for request in requests]
        batched[name] = _join(parts, pad_to)
    return batched


def _join(parts: list[np.ndarray], pad_to: int | None) -> np.ndarray:
    head = parts[0]
    inner = head.shape[1:]
    ragged = any(part.shape[1:] != inner for part in parts)
    if ragged:
        if pad_to is not None:
            raise ValueError("ragged inputs cannot be padded to a batch gear")
        return np.concatenate([part.reshape(-1) for part in parts])
    rows = sum(part.shape[0] for part in parts)
    if pad_to is None or pad_to == rows:
        return np.concatenate(parts, axis=0) if len(parts) > 1 else head
    if pad_to < rows:
        raise ValueError(f"cannot pad {rows} rows down to {pad_to}")
    out = _zeros((pad_to, *inner), head.dtype)
    np.concatenate(parts, axis=0, out=out[:rows])
    return out


def _zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if np.dtype(dtype).kind == "O":
        out = np.empty(shape, dtype=object)
        out.fill(b"")
        return out
    return np.zeros(shape, dtype=dtype)


def split_outputs(
    outputs: Mapping[str, np.ndarray], rows: Sequence[int]
) -> list[dict[str, np.ndarray]]:
    """Slice each batch output back into per-request views, `rows[i]` rows for request i.

    Extra rows beyond sum(rows) are padding and are dropped. Fewer rows is the model's error.
    """
    total = sum(rows)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] < total:
            got = "a scalar" if array.ndim == 0 else f"{array.shape[0]} rows"
            raise ValueError(f"output '{name}' has {got}, expected {total} (one per batch row)")
    if len(rows) == 1:
        return [drop_padding(outputs, total)]
    pieces: list[dict[str, np.ndarray]] = [{} for _ in rows]
    for name, array in outputs.items():
        start = 0
        for index, count in enumerate(rows):
            pieces[index][name] = array[start : start + count]
            start += count
    return pieces


def drop_padding(outputs: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """The first `rows` rows of every output (a view; the arrays themselves when none padded)."""
    return {
        name: (array if array.shape[0] == rows else array[:rows]) for name, array in outputs.items()
    }
