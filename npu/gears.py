"""Choosing the compiled gear for a batch, and padding the batch up to it.

A gear is what the device runs: one of the dynamic batch sizes, or for `--dynamic_image_size` /
`--dynamic_dims` models one set of input shapes. The smallest gear that holds the request is
taken; inputs are zero-padded to it (the device does not check dynamic input sizes, so an
unpadded tail would be stale data). A request no gear holds is the client's error (400), and
the message lists the gears.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from npu.description import ModelDescription
from protocol.errors import InvalidArgument


def batch_gear(info: ModelDescription, rows: int) -> int:
    """The smallest compiled batch that holds `rows`."""
    sizes = info.batch_sizes
    position = bisect.bisect_left(sizes, rows)
    if rows < 1 or position == len(sizes):
        raise InvalidArgument(
            f"a batch of {rows} rows does not fit the model's compiled batch sizes {list(sizes)}"
        )
    return sizes[position]


def shape_gear(
    info: ModelDescription, shapes: Sequence[tuple[int, ...]], rows: int | None
) -> tuple[tuple[int, ...], ...]:
    """The smallest image-size / dims gear every input fits in (gears are sorted by size). With
    `rows`, axis 0 of batched inputs is the batch and is padded to the compiled batch."""
    wanted = [tuple(s) for s in shapes]
    if rows is not None:
        wanted = [
            (info.static_batch_size or rows,) + s[1:] if t.batched else s
            for t, s in zip(info.inputs, wanted, strict=False)
        ]
    for gear in info.shape_gears:
        if all(
            len(w) == len(g) and all(a <= b for a, b in zip(w, g, strict=False))
            for w, g in zip(wanted, gear, strict=False)
        ):
            return gear
    asked = ", ".join(f"'{t.name}' {list(s)}" for t, s in zip(info.inputs, shapes, strict=False))
    kind = "image sizes (HxW)" if info.shape_kind == "hw" else "dims"
    raise InvalidArgument(
        f"input shape(s) {asked} fit none of the model's compiled {kind}: {info.gear_names()}"
    )


def pad_to(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`array` zero-padded at the end of each axis to `shape` (itself when it fits exactly)."""
    if array.shape == shape:
        return array
    padded = np.zeros(shape, dtype=array.dtype)
    padded[tuple(slice(0, n) for n in array.shape)] = array
    return padded


def hw_of(info: ModelDescription, gear: tuple[tuple[int, ...], ...]) -> tuple[int, int]:
    """(h, w) of an image-size gear: the two -1 axes of the first input that has them."""
    for tensor, shape in zip(info.inputs, gear, strict=False):
        holes = [
            i for i, d in enumerate(tensor.dims) if d == -1 and not (i == 0 and tensor.batched)
        ]
        if len(holes) == 2:
            return shape[holes[0]], shape[holes[1]]
    raise InvalidArgument("the model reports image-size gears but no input with dynamic H and W")


def dims_of(info: ModelDescription, gear: tuple[tuple[int, ...], ...]) -> dict:
    """A dims gear in the form acl.mdl.set_input_dynamic_dims takes: the gear exactly as
    get_input_dynamic_dims reported it, i.e. the dims of the inputs ATC's --input_shape lists,
    in its order (name left empty, as the samples do)."""
    flat = [int(d) for d in info.dims_flat[info.shape_gears.index(gear)]]
    return {"name": "", "dimCount": len(flat), "dims": flat}
