"""A CPU emulator of pyACL, the `acl` module that ships with Huawei CANN.

Put `tests/npu/emulator` first on the import path (PYTHONPATH) and `import acl` gives this module:
the same names, argument parsing, return tuples, integer handles and error codes as the real
binding (see shared reference/pyacl.md), with a device-memory ledger, thread-bound contexts,
dynamic-batch gears and fault injection behind them. `acl._emu` is the test control API, which
the real module does not have.

With ACL_EMU_IMPORTS naming a file, each process that imports this module appends its pid
there (one line, O_APPEND): how a test shows that `acl` was imported only where it should be.
"""

from __future__ import annotations

import os as _os

if _os.environ.get("ACL_EMU_IMPORTS"):
    _fd = _os.open(_os.environ["ACL_EMU_IMPORTS"], _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT)
    try:
        _os.write(_fd, f"{_os.getpid()}\n".encode())
    finally:
        _os.close(_fd)

from . import _codes as C
from ._runtime import RT, AclFail, entry, ret_only
from ._runtime import DataBuffer as _DataBuffer


@entry("init", "|s", ret_only)
def init(config_path: str = "") -> int:
    with RT.lock:
        if RT.initialised:
            raise AclFail(C.REPEAT_INITIALIZE, "acl.init was already called in this process")
        RT.initialised = RT.ever_initialised = True
        return C.SUCCESS


@entry("finalize", "", ret_only)
def finalize() -> int:
    with RT.lock:
        if not RT.initialised:
            raise AclFail(C.REPEAT_FINALIZE, "acl.finalize without a live acl.init")
        if RT.syncing:
            RT.violate(
                "acl.finalize while threads still wait in acl.rt.synchronize_stream: "
                + ", ".join(RT.syncing.values())
            )
        from . import _emu

        live = _emu.live_summary()
        if live:
            RT.violate("acl.finalize with live resources: " + "; ".join(live))
        RT.initialised = False
        return C.SUCCESS


@entry("create_data_buffer", "kk")
def create_data_buffer(addr: int, size: int) -> int:
    with RT.lock:
        buffer = _DataBuffer(RT.new_handle("buffer"), addr, size)
        RT.buffers[buffer.handle] = buffer
        return buffer.handle


@entry("destroy_data_buffer", "k", ret_only)
def destroy_data_buffer(buffer: int) -> int:
    with RT.lock:
        if buffer not in RT.buffers:
            if buffer in RT.retired:
                RT.violate(f"double destroy of data buffer {buffer:#x}")
            raise AclFail(C.INVALID_PARAM, f"data buffer {buffer:#x} does not exist")
        del RT.buffers[buffer]  # the memory it points at is not freed: the caller frees it
        RT.retired.add(buffer)
        return C.SUCCESS


@entry("get_data_buffer_addr", "k")
def get_data_buffer_addr(buffer: int) -> int:
    found = RT.buffers.get(buffer)
    return found.addr if found else 0


@entry("get_data_buffer_size", "k")
def get_data_buffer_size(buffer: int) -> int:
    found = RT.buffers.get(buffer)
    return found.size if found else 0


get_data_buffer_size_v2 = get_data_buffer_size


@entry("update_data_buffer", "kkk", ret_only)
def update_data_buffer(buffer: int, addr: int, size: int) -> int:
    with RT.lock:
        found = RT.buffers.get(buffer)
        if found is None:
            raise AclFail(C.INVALID_PARAM, f"data buffer {buffer:#x} does not exist")
        found.addr, found.size = addr, size
        return C.SUCCESS


@entry("get_recent_err_msg", "")
def get_recent_err_msg() -> str | None:
    return RT.take_err()


@entry("get_soc_name", "")
def get_soc_name() -> str:
    return RT.config.soc_name


@entry("get_version", "", lambda code: (0, 0, 0, code))
def get_version() -> tuple[int, int, int, int]:
    return 1, 0, 0, C.SUCCESS


@entry("data_type_size", "k")
def data_type_size(dtype: int) -> int:
    import numpy as np

    return np.dtype(C.DTYPES[dtype]).itemsize if dtype in C.DTYPES else 0


# The submodules, attached as attributes as in the real binding (acl.rt, acl.mdl, ...).
from . import _emu, mdl, rt, util  # noqa: E402, F401  (imported to become attributes)
