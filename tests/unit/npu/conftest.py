"""Fixtures for the Ascend backend tests: the pyACL emulator as `acl`, fresh for every test and
checked for leaks and misuse when the test ends."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.npu_harness import InstanceThread
from tests.support.om_fixtures import EMULATOR_PATH


def _forget_acl() -> None:
    for name in [n for n in sys.modules if n == "acl" or n.startswith("acl.")]:
        del sys.modules[name]


@pytest.fixture
def acl_emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`import acl` gives a fresh emulator; at the end nothing may be leaked or misused."""
    monkeypatch.delenv("ACL_EMU_CONFIG", raising=False)
    monkeypatch.delenv("ACL_EMU_REPORT", raising=False)
    _forget_acl()
    # The one import-path edit under tests/: the emulator must import as top-level `acl`.
    monkeypatch.syspath_prepend(str(EMULATOR_PATH))
    import acl

    try:
        yield acl
        acl._emu.assert_clean()
    finally:
        _forget_acl()
        from npu import device

        device.forget(acl)
        # A test may have run the exit teardown, or failed before unloading and left its
        # sessions listed; the next test starts clean (the emulator above reported any leak).
        device.reset()
        from npu import deadline

        deadline.forget_counts()  # a hung instance's count is this test's alone


@pytest.fixture
def instance_thread() -> Iterator[InstanceThread]:
    thread = InstanceThread()
    yield thread
    thread.close()
