"""The NPU's part of process exit, in the documented order: stop new work, wait (bounded) for
the executions in flight, release what instances left loaded (buffers, datasets, models, then
streams and contexts), reset the devices, and only then `acl.finalize`.

Instances normally unload before the interpreter exits; this covers the ones that did not (a
deadline passed, a daemon instance thread still waits in `synchronize_stream`). Finalizing under
such a thread is what crashes a process at exit on hardware, so when the wait runs out the
session is left to the driver (which reclaims it when the process ends) and finalize is skipped.
"""

from __future__ import annotations

import logging
import os
import time

from npu import constants as K
from npu import device

log = logging.getLogger(__name__)

EXIT_WAIT_ENV = "ASCEND_SERVE_NPU_EXIT_WAIT_S"
DEFAULT_EXIT_WAIT_S = 5.0  # how long exit waits for an NPU execution still in flight


def exit_wait_s() -> float:
    """The setting, from the environment (seconds, default 5)."""
    try:
        return max(0.0, float(os.environ.get(EXIT_WAIT_ENV, DEFAULT_EXIT_WAIT_S)))
    except ValueError:
        return DEFAULT_EXIT_WAIT_S


def shutdown(wait_s: float) -> bool:
    """Run the ordered teardown; True when acl.finalize ran."""
    acl = device.initialised()
    if acl is None:
        return False
    device.stop_new_work()
    deadline = time.monotonic() + wait_s
    clean = True
    for session in device.open_sessions():
        if session.abandoned:
            log.warning(
                "NPU %s: an execution there never finished; its stream, model and memory are "
                "left to the driver and acl.finalize is skipped",
                session.device_id,
            )
            clean = False
            continue
        if not session.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            log.warning(
                "NPU %s: an execution is still running after %.1fs; its resources are "
                "left to the driver and acl.finalize is skipped",
                session.device_id,
                wait_s,
            )
            clean = False
            continue
        try:
            problems: list[str] = []
            for model in list(session.models):
                problems += model.close()
            problems += session.close()
            for problem in problems:
                log.warning("NPU %s teardown: %s", session.device_id, problem)
        finally:
            session.lock.release()
    if not clean:
        return False
    ret = acl.finalize()
    device.forget(acl)
    if ret not in (K.SUCCESS, K.REPEAT_FINALIZE):
        log.warning("acl.finalize returned %s at exit", ret)
    return True


def at_exit() -> None:
    """Run at exit after the first acl.init (npu/device.py registers it with atexit)."""
    try:
        shutdown(exit_wait_s())
    except Exception as exc:  # interpreter teardown: log and let the process end
        log.warning("NPU teardown at exit failed: %s", exc)


# Importing this module arms it: npu/om_model.py (what loads models) imports it.
device.set_exit_cleanup(at_exit)
