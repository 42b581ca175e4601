"""glibc's allocator, told to keep freed tensor-sized blocks instead of handing them back.

Why: by default glibc serves a block over its mmap threshold (128 KiB, raised dynamically to
the largest block freed, up to 32 MiB) with a fresh mmap, and gives the top of the heap back
once more than twice that is free. A server that frees each request's tensors as soon as the
answer is sent (150 KB - 4 MB here) then maps, faults in and unmaps pages on every request:
measured on ONNX Identity over gRPC at 150 KB, 40 % more server CPU per inference than when the
same blocks lingered until a garbage collection (bench/FINDINGS.md, "The NPU executor's copy
path"). Fixed thresholds keep the pages: blocks under MMAP_THRESHOLD come from the heap, and up
to TRIM_THRESHOLD of free heap stays mapped. glibc's own environment variables
(MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) still win: set either and nothing here runs.
Elsewhere than glibc (musl has no mallopt) nothing happens.
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD = 64 << 20  # bytes: smaller blocks come from the heap
TRIM_THRESHOLD = 256 << 20  # bytes of free heap kept mapped before any is returned
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers
ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def steady_malloc(environ: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    """Set the fixed thresholds; False when the environment sets them or there is no mallopt."""
    if any(name in environ for name in ENVIRONMENT):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
