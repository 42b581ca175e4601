"""Choosing the compiled gear for a batch, and padding the batch up to it.

A gear is what the device runs: one of the dynamic batch sizes, or for `--dynamic_image_size` /
`--dynamic_dims` models one set of input shapes. The smallest gear that holds the request is
taken; inputs are zero-padded to it (the device does not check dynamic input sizes, so an
unpadded tail would be stale data). A request no gear holds is the client's error (400), and
the message lists the gears.

A YUV420SP source under static AIPP (`source_rows` 1.5) holds H rows of Y, then H/2 rows of
interleaved UV: its gears are in that layout, a request's rows must be a multiple of 3 (H even)
and its width even, and padding keeps the two planes apart (the Y plane padded to the gear's
H, the UV plane after it).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from npu.description import ModelDescription, TensorInfo, image_rows
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
    for tensor, shape in zip(info.inputs, wanted, strict=False):
        if tensor.source_rows != 1.0:  # a YUV420SP source (static AIPP)
            _check_yuv(tensor, shape)
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


def _holes(tensor: TensorInfo) -> list[int]:
    return [i for i, d in enumerate(tensor.dims) if d == -1 and not (i == 0 and tensor.batched)]


def _check_yuv(tensor: TensorInfo, shape: tuple[int, ...]) -> None:
    holes = _holes(tensor)
    if len(holes) != 2 or len(shape) != len(tensor.dims):
        return  # shape_gear reports a shape that fits no gear
    rows, width = shape[holes[0]], shape[holes[1]]
    if rows % 3 or width % 2:
        raise InvalidArgument(
            f"input '{tensor.name}' is a YUV420SP image: {rows} rows of {width} bytes, but "
            "it holds H rows of Y and H/2 of UV with H and W even, so its rows are a "
            "multiple of 3 (1.5 x H) and its width even"
        )


def pad_input(tensor: TensorInfo, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`array` padded to the gear's `shape`; a YUV420SP source plane by plane."""
    if tensor.source_rows == 1.0 or array.shape == shape:
        return pad_to(array, shape)
    holes = _holes(tensor)
    if len(holes) != 2:
        return pad_to(array, shape)
    axis = holes[0]
    y_in, y_out = array.shape[axis] * 2 // 3, shape[axis] * 2 // 3
    padded = np.zeros(shape, dtype=array.dtype)

    def rows(start: int, stop: int) -> tuple[slice, ...]:
        return tuple(
            slice(start, stop) if i == axis else slice(0, n) for i, n in enumerate(array.shape)
        )

    y_plane, uv_plane = array[rows(0, y_in)], array[rows(y_in, array.shape[axis])]
    padded[rows(0, y_in)] = y_plane
    padded[rows(y_out, y_out + uv_plane.shape[axis])] = uv_plane
    return padded


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
        holes = _holes(tensor)
        if len(holes) == 2:
            return image_rows(shape[holes[0]], tensor.source_rows), shape[holes[1]]
    raise InvalidArgument("the model reports image-size gears but no input with dynamic H and W")


def dims_of(info: ModelDescription, gear: tuple[tuple[int, ...], ...]) -> dict:
    """A dims gear in the form acl.mdl.set_input_dynamic_dims takes: the gear exactly as
    get_input_dynamic_dims reported it, i.e. the dims of the inputs ATC's --input_shape lists,
    in its order (name left empty, as the samples do)."""
    flat = [int(d) for d in info.dims_flat[info.shape_gears.index(gear)]]
    return {"name": "", "dimCount": len(flat), "dims": flat}
