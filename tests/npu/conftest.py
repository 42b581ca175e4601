"""Fixtures for the Ascend backend tests: the pyACL emulator as `acl`, fresh for every test and
checked for leaks and misuse when the test ends."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from npu_harness import InstanceThread

EMULATOR_PATH = Path(__file__).resolve().parent / "emulator"


def _forget_acl() -> None:
    for name in [n for n in sys.modules if n == "acl" or n.startswith("acl.")]:
        del sys.modules[name]


@pytest.fixture
def acl_emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`import acl` gives a fresh emulator; at the end nothing may be leaked or misused."""
    monkeypatch.delenv("ACL_EMU_CONFIG", raising=False)
    monkeypatch.delenv("ACL_EMU_REPORT", raising=False)
    _forget_acl()
    monkeypatch.syspath_prepend(str(EMULATOR_PATH))
    import acl

    try:
        yield acl
        acl._emu.assert_clean()
    finally:
        _forget_acl()
        from npu import device

        device.forget(acl)
        device._closing = False  # a test may have run the exit teardown
        # A test that failed before unloading leaves its sessions listed for telemetry; drop
        # them so the next test starts clean (the emulator above already reported the leak).
        from npu import device

        with device._registry_lock:
            device._sessions.clear()
            device._open.clear()


@pytest.fixture
def instance_thread() -> Iterator[InstanceThread]:
    thread = InstanceThread()
    yield thread
    thread.close()
