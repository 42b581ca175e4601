"""Test control of the emulator (the real `acl` has no such module): reset, configure, inject
faults, inspect the ledger, and assert that nothing leaked."""

from __future__ import annotations

import atexit
import json
import os
import threading
from dataclasses import replace
from typing import Any

from ._runtime import RT, Config, EmulatorViolation, Fault

__all__ = [
    "reset",
    "configure",
    "inject",
    "lose_device",
    "release_hangs",
    "hung",
    "stats",
    "live_summary",
    "violations",
    "assert_clean",
    "last_execution",
    "EmulatorViolation",
    "Config",
]


def reset(**overrides: Any) -> None:
    """Forget everything (a fresh process), with optional Config overrides."""
    config = replace(Config(), **overrides) if overrides else None
    RT.reset(config)


def configure(**overrides: Any) -> None:
    """Change settings (device_count, memory_bytes, run_mode, latency_scale, ...) in place."""
    with RT.lock:
        for key, value in overrides.items():
            if not hasattr(RT.config, key):
                raise AttributeError(f"no emulator setting {key!r}")
            setattr(RT.config, key, value)
        if "device_count" in overrides:
            from ._runtime import new_device

            for d in range(RT.config.device_count):
                if d not in RT.devices:
                    RT.devices[d] = new_device(d, RT.config)


def inject(
    fn: str, ret: int, count: int | None = 1, after: int = 0, device: int | None = None
) -> None:
    """Make `acl.<fn>` (e.g. "mdl.execute_async", "rt.malloc") return `ret` `count` times
    (None: forever) after `after` successful calls, optionally only on one device.
    Injecting 507010 also marks that device lost."""
    with RT.lock:
        RT.faults.append(Fault(fn, ret, count, after, device))


def lose_device(device: int) -> None:
    """The device stops answering: work on it returns 507010, set_device 507033; releasing
    resources still succeeds (the driver reclaims them)."""
    with RT.lock:
        RT.devices[device].lost = True


def release_hangs() -> None:
    """Let every hung execution finish (the real device never does): so a test's process
    keeps no thread that waits forever. Later hang poisons hang again."""
    with RT.lock:
        RT.unhang.set()
        RT.unhang = threading.Event()
        for device in RT.devices.values():
            device.timeline.unblock()  # this process's hangs free their devices


def hung() -> int:
    """How many executions hung (a hang poison) in this process."""
    with RT.lock:
        return RT.hung


def stats() -> dict[str, int]:
    with RT.lock:
        return {
            "allocations": sum(1 for a in RT.memory.live.values() if a.owner == "user"),
            "allocated_bytes": sum(a.size for a in RT.memory.live.values() if a.owner == "user"),
            "model_memory": sum(1 for a in RT.memory.live.values() if a.owner != "user"),
            "host_allocations": len(RT.memory.host),
            "data_buffers": len(RT.buffers),
            "datasets": len(RT.datasets),
            "descs": len(RT.descs),
            "aipp_sets": len(RT.aipps),
            "models": len(RT.models),
            "streams": len(RT.streams),
            "contexts": sum(1 for c in RT.contexts.values() if not c.default),
            "device_refs": sum(d.refcount for d in RT.devices.values()),
        }


def live_summary() -> list[str]:
    """One line per kind of live resource, with where each device allocation was made."""
    with RT.lock:
        lines = [
            f"{count} {kind}"
            for kind, count in stats().items()
            if count and kind != "allocated_bytes"
        ]
        for alloc in RT.memory.live.values():
            if alloc.owner == "user":
                lines.append(
                    f"device {alloc.device} allocation {alloc.ptr:#x} of {alloc.size} "
                    f"bytes, made at:\n{alloc.site}"
                )
        return lines


def violations() -> list[str]:
    with RT.lock:
        return list(RT.violations)


def assert_clean() -> None:
    """Fail on any leak (memory, buffer, dataset, desc, model, stream, context, device ref) or
    any recorded misuse (double free, concurrent model use, dangling host pointer, ...)."""
    problems = violations() + live_summary()
    if problems:
        raise EmulatorViolation("acl emulator is not clean:\n  " + "\n  ".join(problems))


def last_execution(model_id: int) -> dict:
    """What the device saw in the model's last execution: gear, inputs (padded rows included)
    and the execution count."""
    with RT.lock:
        return dict(RT.executions.get(model_id, {"count": 0}))


def _write_report() -> None:
    """Add this process's findings to the report: a server runs the binding in several
    processes (one NPU executor per model group and device), each adds its own, under a lock."""
    path = os.environ.get("ACL_EMU_REPORT")
    if not path:
        return
    import fcntl

    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        text = handle.read()
        report = json.loads(text) if text.strip() else {"violations": [], "live": [], "stats": {}}
        report["violations"] += violations()
        report["live"] += live_summary()
        for key, value in stats().items():
            report["stats"][key] = report["stats"].get(key, 0) + value
        report["processes"] = report.get("processes", 0) + 1
        handle.seek(0)
        handle.truncate()
        json.dump(report, handle, indent=1)


atexit.register(_write_report)
