"""Linux's prctl(2) for the options the project's child processes set on themselves: the signal
the kernel sends when the parent goes, and becoming a subreaper. Standard library only, so that
a freshly started worker, supervisor or parser process imports it in microseconds."""

from __future__ import annotations

import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> bool:
    """Set one process option; False where the platform or libc cannot (the caller falls back)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        zero = ctypes.c_ulong(0)
        return bool(libc.prctl(option, ctypes.c_ulong(value), zero, zero, zero) == 0)
    except (OSError, AttributeError):
        return False
