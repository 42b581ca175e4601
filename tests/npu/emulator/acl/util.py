"""acl.util: host pointer helpers, including their traps (dangling bytes, non-contiguous arrays)."""

from __future__ import annotations

import ctypes
import warnings

import numpy as np

from ._runtime import RT, AclFail, entry

# NumPy C type numbers, as ptr_to_numpy takes them.
_NPY_TYPES = {
    0: np.bool_,
    1: np.int8,
    2: np.uint8,
    3: np.int16,
    4: np.uint16,
    5: np.int32,
    6: np.uint32,
    7: np.int64,
    8: np.uint64,
    9: np.int64,
    10: np.uint64,
    11: np.float32,
    12: np.float64,
    23: np.float16,
}


@entry("util.bytes_to_ptr", "O")
def bytes_to_ptr(data: bytes) -> int:
    """The address inside the bytes object itself (no copy); valid while the object lives."""
    if not isinstance(data, bytes):
        raise TypeError("acl.util.bytes_to_ptr args parse failed")
    with RT.lock:
        return RT.memory.pin(data)


@entry("util.ptr_to_bytes", "kk")
def ptr_to_bytes(ptr: int, size: int) -> bytes:
    with RT.lock:
        try:
            return RT.memory.host_read(ptr, size)
        except AclFail as failure:
            RT.violate(f"ptr_to_bytes({ptr:#x}, {size}): {failure.message}")
            raise ValueError(failure.message) from None


@entry("util.numpy_to_ptr", "O")
def numpy_to_ptr(array: np.ndarray) -> int:
    warnings.warn("acl.util.numpy_to_ptr is deprecated", DeprecationWarning, stacklevel=3)
    if not array.flags.c_contiguous:
        warnings.warn(
            "numpy_to_ptr: array is not C-contiguous; the raw buffer is returned",
            RuntimeWarning,
            stacklevel=3,
        )
    return int(array.__array_interface__["data"][0])


@entry("util.ptr_to_numpy", "kOk")
def ptr_to_numpy(ptr: int, shape: tuple, npy_type: int) -> np.ndarray:
    """A zero-copy view that does not own the memory (deprecated in the real binding too)."""
    warnings.warn("acl.util.ptr_to_numpy is deprecated", DeprecationWarning, stacklevel=3)
    dtype = np.dtype(_NPY_TYPES[npy_type])
    count = int(np.prod(shape)) * dtype.itemsize
    with RT.lock:
        RT.memory._check_host(ptr, count, write=False)
    raw = (ctypes.c_char * count).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)
