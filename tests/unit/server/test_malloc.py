"""server/malloc.py: glibc keeps freed tensor-sized blocks, unless its own variables say."""

from __future__ import annotations

from server.malloc import steady_malloc


def test_the_thresholds_are_set_on_glibc() -> None:
    assert steady_malloc({}) is True


def test_glibcs_own_environment_variables_win() -> None:
    assert steady_malloc({"MALLOC_TRIM_THRESHOLD_": "0"}) is False
    assert steady_malloc({"MALLOC_MMAP_THRESHOLD_": "131072"}) is False
