"""aclError codes turned into BackendErrors a person can act on.

Every failed call names the call, the code, what the code means and pyACL's own recent error
text. Codes that mean the device itself is gone make the error fatal, which takes the instance
out of service; anything else fails only the current load or batch.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from backends.base import BackendError
from protocol.errors import Unavailable

# code -> (name, meaning). Names are the C enum names from acl_base.h / acl_rt.h / ge_error_codes.h.
KNOWN: dict[int, tuple[str, str]] = {
    100000: ("ACL_ERROR_INVALID_PARAM", "invalid parameter"),
    100001: ("ACL_ERROR_UNINITIALIZE", "acl.init has not been called"),
    100002: ("ACL_ERROR_REPEAT_INITIALIZE", "acl.init was already called"),
    100011: ("ACL_ERROR_INVALID_MODEL_ID", "invalid model id"),
    100037: ("ACL_ERROR_REPEAT_FINALIZE", "acl.finalize was already called"),
    107000: (
        "ACL_ERROR_RT_PARAM_INVALID",
        "invalid runtime parameter (bad pointer, size or handle)",
    ),
    107001: ("ACL_ERROR_RT_INVALID_DEVICEID", "invalid device id"),
    107002: ("ACL_ERROR_RT_CONTEXT_NULL", "no context is current on this thread"),
    107003: ("ACL_ERROR_RT_STREAM_CONTEXT", "the stream belongs to another context"),
    107004: ("ACL_ERROR_RT_MODEL_CONTEXT", "the model belongs to another context"),
    145000: (
        "ACL_ERROR_GE_PARAM_INVALID",
        "invalid model parameter (buffer count or size, or bad model file)",
    ),
    145002: ("ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID", "model file path invalid or missing"),
    145003: ("ACL_ERROR_GE_EXEC_MODEL_ID_INVALID", "model id invalid"),
    145012: ("ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID", "dynamic input buffer too small"),
    145013: (
        "ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID",
        "batch size is not one of the compiled gears",
    ),
    207000: ("ACL_ERROR_RT_FEATURE_NOT_SUPPORT", "feature not supported on this device"),
    207001: (
        "ACL_ERROR_RT_MEMORY_ALLOCATION",
        "device memory allocation failed (out of device memory)",
    ),
    207002: ("ACL_ERROR_RT_MEMORY_FREE", "device memory free failed"),
    207018: ("ACL_ERROR_RT_DEVICE_OOM", "device out of memory"),
    245000: (
        "ACL_ERROR_GE_MEMORY_ALLOCATION",
        "model memory allocation failed (out of device memory)",
    ),
    500000: ("ACL_ERROR_INTERNAL_ERROR", "internal error"),
    500001: ("ACL_ERROR_FAILURE", "ACL failure"),
    500002: ("ACL_ERROR_GE_FAILURE", "GE failure"),
    500003: ("ACL_ERROR_RT_FAILURE", "runtime failure"),
    500004: ("ACL_ERROR_DRV_FAILURE", "driver failure"),
    507000: ("ACL_ERROR_RT_INTERNAL_ERROR", "runtime internal error"),
    507010: ("ACL_ERROR_RT_LOST_HEARTBEAT", "device lost heartbeat (device fault)"),
    507011: ("ACL_ERROR_RT_MODEL_EXECUTE", "model execution failed"),
    507014: ("ACL_ERROR_RT_AICORE_TIMEOUT", "AI Core timed out"),
    507015: ("ACL_ERROR_RT_AICORE_EXCEPTION", "AI Core exception"),
    507033: ("ACL_ERROR_RT_DEV_SETUP_ERROR", "device setup failed (driver or firmware problem)"),
    507046: ("ACL_ERROR_RT_STREAM_SYNC_TIMEOUT", "stream synchronisation timed out"),
    507899: ("ACL_ERROR_RT_DRV_INTERNAL_ERROR", "driver internal error"),
    545001: ("ACL_ERROR_GE_LOAD_MODEL", "model load failed"),
}

# The device itself is unusable: the instance stops serving (and the model stops being ready)
# rather than failing batch after batch.
DEVICE_FAULTS = frozenset({500004, 507010, 507033, 507899})
# The stream the fault hit is left broken, the device is not: the instance recreates its stream
# and model copy (a judgement to confirm on hardware).
STREAM_FAULTS = frozenset({507014, 507015})
# synchronize_stream_with_timeout ran out: the execution is still on the device (or never
# ends). The instance stops serving and touches that stream no more (npu/backend.py).
SYNC_TIMEOUT = 507046

_FAMILIES = {
    1: "caller or environment error",
    2: "resource or feature mismatch",
    3: "business state error",
    5: "internal or device failure",
}


def describe(code: int) -> str:
    """'NAME: meaning' for a known code, the family for an unknown one."""
    if code in KNOWN:
        name, meaning = KNOWN[code]
        return f"{name}: {meaning}"
    return f"unlisted code, {_FAMILIES.get(code // 100000, 'unknown family')}"


def is_device_fault(code: int) -> bool:
    return code in DEVICE_FAULTS


def is_stream_fault(code: int) -> bool:
    return code in STREAM_FAULTS


def is_sync_timeout(code: int) -> bool:
    return code == SYNC_TIMEOUT


class ExecutionHung(Unavailable):
    """An execution did not finish within its timeout: the instance is out of service, and
    the request answers UNAVAILABLE (503), as a server-side outage does."""


class AclError(BackendError):
    """A pyACL call returned a non-zero code."""

    def __init__(self, call: str, code: int, detail: str = "") -> None:
        message = f"{call} failed with error {code} ({describe(code)})"
        if detail:
            message += f": {detail}"
        super().__init__(message, fatal=is_device_fault(code))
        self.call = call
        self.code = code


def recent_message(acl: ModuleType) -> str:
    """pyACL's own text for the last failure on this thread ('' when it has none)."""
    try:
        text = acl.get_recent_err_msg()
    except Exception:  # an old binding without it, or one that raises: the code still speaks
        return ""
    return " ".join(str(text).split()) if text else ""


def check(acl: ModuleType, ret: int, call: str) -> None:
    """Raise AclError unless `ret` is ACL_SUCCESS."""
    if ret != 0:
        raise AclError(call, ret, recent_message(acl))


def unwrap(acl: ModuleType, result: tuple, call: str) -> Any:
    """For the `(value..., ret)` tuples: check ret, return the value (or values)."""
    *values, ret = result
    check(acl, ret, call)
    return values[0] if len(values) == 1 else tuple(values)
