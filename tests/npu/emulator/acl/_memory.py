"""Device memory ledger, and copies between real host addresses and emulated device memory.

Device addresses live above 2**48, where no user-space pointer can be, so a device pointer
handed to a host API (or the reverse) is caught. Host pointers are real process addresses
(numpy arrays, bytes objects, `malloc_host`), read and written through ctypes after a check
against /proc/self/maps so a bad pointer is an error, not a crash of the test process.
"""

from __future__ import annotations

import bisect
import ctypes
import sys
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import _codes as C
from ._runtime import DEVICE_BASE, DEVICE_SPAN, AclFail, DanglingHostPointer

if TYPE_CHECKING:  # pragma: no cover
    from ._runtime import Runtime


def align_up(value: int, to: int) -> int:
    return (value + to - 1) // to * to


@dataclass(eq=False)
class Allocation:
    ptr: int
    size: int
    charged: int
    device: int
    storage: np.ndarray
    site: str
    owner: str  # "user", or "model <id>" for weights and workspace charged at load


class HostMaps:
    """Which host address ranges are mapped readable / writable (refreshed on a miss)."""

    def __init__(self) -> None:
        self._ranges: list[tuple[int, int, str]] = []
        self._starts: list[int] = []
        self._available = True

    def _load(self) -> None:
        try:
            with open("/proc/self/maps") as maps:
                lines = maps.read().splitlines()
        except OSError:
            self._available = False
            return
        ranges = []
        for line in lines:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            ranges.append((start, end, perms))
        ranges.sort()
        self._ranges = ranges
        self._starts = [r[0] for r in ranges]

    def _covered(self, ptr: int, count: int, write: bool) -> bool:
        need = "w" if write else "r"
        position, end = ptr, ptr + count
        index = bisect.bisect_right(self._starts, position) - 1
        while position < end:
            if index < 0 or index >= len(self._ranges):
                return False
            start, stop, perms = self._ranges[index]
            if not start <= position < stop or need not in perms:
                return False
            position = stop
            index += 1
        return True

    def check(self, ptr: int, count: int, write: bool) -> bool:
        if self._covered(ptr, count, write):
            return True
        self._load()
        return not self._available or self._covered(ptr, count, write)


class Ledger:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.live: dict[int, Allocation] = {}
        self._bases: list[int] = []
        self.freed: set[int] = set()
        self.host: dict[int, np.ndarray] = {}  # malloc_host blocks, kept alive here
        self.host_freed: set[int] = set()
        self.pinned: dict[int, bytes] = {}  # bytes_to_ptr: address -> the bytes object
        self.maps = HostMaps()

    # -- device allocations -------------------------------------------------------------------
    def allocate(
        self, device: int, size: int, owner: str = "user", oom_code: int = C.RT_MEMORY_ALLOCATION
    ) -> Allocation:
        if size <= 0:
            raise AclFail(C.INVALID_PARAM, "malloc size must be greater than 0")
        dev = self.rt.devices[device]
        charged = align_up(size, 32) + 32
        capacity = self.rt.config.memory_bytes
        ptr = align_up(dev.next_addr, 64)
        if ptr + charged >= dev.base + DEVICE_SPAN:
            raise AclFail(oom_code, f"device {device} address space exhausted")
        fits, others = dev.timeline.charge(dev.charged + charged, capacity)  # every process's
        if not fits:
            raise AclFail(
                oom_code,
                f"device {device} out of memory: asked {size} bytes, "
                f"{capacity - dev.charged - others} of {capacity} free",
            )
        dev.next_addr = ptr + charged
        dev.charged += charged
        storage = np.full(size, self.rt.config.fill_byte, dtype=np.uint8)
        site = "".join(traceback.format_stack(limit=10)[:-3])
        alloc = Allocation(ptr, size, charged, device, storage, site, owner)
        self.live[ptr] = alloc
        bisect.insort(self._bases, ptr)
        return alloc

    def release(self, ptr: int) -> Allocation:
        if ptr == 0:
            raise AclFail(C.INVALID_PARAM, "free of a null pointer")
        alloc = self.live.get(ptr)
        if alloc is None:
            if ptr in self.freed:
                self.rt.violate(f"double free of device pointer {ptr:#x}")
                raise AclFail(C.RT_PARAM_INVALID, f"device pointer {ptr:#x} was already freed")
            self.rt.violate(f"free of unknown device pointer {ptr:#x}")
            raise AclFail(C.RT_PARAM_INVALID, f"{ptr:#x} is not the start of a device allocation")
        del self.live[ptr]
        self._bases.remove(ptr)
        self.freed.add(ptr)
        dev = self.rt.devices[alloc.device]
        dev.charged -= alloc.charged
        dev.timeline.charge(dev.charged, self.rt.config.memory_bytes)
        return alloc

    @staticmethod
    def is_device(ptr: int) -> bool:
        return DEVICE_BASE <= ptr < DEVICE_BASE + 64 * DEVICE_SPAN

    def find(self, ptr: int, count: int) -> tuple[Allocation, int]:
        """The allocation holding [ptr, ptr+count) (interior pointers allowed)."""
        index = bisect.bisect_right(self._bases, ptr) - 1
        if index >= 0:
            alloc = self.live[self._bases[index]]
            offset = ptr - alloc.ptr
            if offset < alloc.size:
                if offset + count > alloc.size:
                    raise AclFail(
                        C.RT_PARAM_INVALID,
                        f"access of {count} bytes at {ptr:#x} runs "
                        f"{offset + count - alloc.size} bytes past the end of a "
                        f"{alloc.size}-byte allocation",
                    )
                return alloc, offset
        if ptr in self.freed:
            raise AclFail(C.RT_PARAM_INVALID, f"use of freed device pointer {ptr:#x}")
        raise AclFail(C.RT_PARAM_INVALID, f"{ptr:#x} is not inside any live device allocation")

    def device_view(self, ptr: int, count: int) -> np.ndarray:
        alloc, offset = self.find(ptr, count)
        self.rt.require_alive(alloc.device)
        return alloc.storage[offset : offset + count]

    # -- host memory --------------------------------------------------------------------------
    def malloc_host(self, size: int) -> int:
        if size <= 0:
            raise AclFail(C.INVALID_PARAM, "malloc_host size must be greater than 0")
        block = np.full(size, self.rt.config.fill_byte, dtype=np.uint8)
        self.host[block.ctypes.data] = block
        return block.ctypes.data

    def free_host(self, ptr: int) -> None:
        if ptr not in self.host:
            what = "double free" if ptr in self.host_freed else "free of unknown"
            self.rt.violate(f"{what} host pointer {ptr:#x}")
            raise AclFail(C.RT_PARAM_INVALID, f"{what} host pointer {ptr:#x}")
        del self.host[ptr]
        self.host_freed.add(ptr)

    def pin(self, obj: bytes) -> int:
        address = ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value or 0
        self.pinned[address] = obj
        return address

    def _check_host(self, ptr: int, count: int, write: bool) -> None:
        if self.is_device(ptr):
            raise AclFail(C.RT_PARAM_INVALID, f"{ptr:#x} is a device pointer, a host one is needed")
        for base in list(self.pinned):
            if base <= ptr < base + max(len(self.pinned[base]), 1):
                # Referenced by this dict and getrefcount's argument only: the caller let it go.
                if sys.getrefcount(self.pinned[base]) <= 2:
                    self.rt.violate(
                        f"host pointer {ptr:#x} from bytes_to_ptr outlived its bytes object",
                        DanglingHostPointer,
                    )
                break
        if not self.maps.check(ptr, count, write):
            access = "writable" if write else "readable"
            raise AclFail(C.RT_PARAM_INVALID, f"host range {ptr:#x}+{count} is not mapped {access}")

    def host_read(self, ptr: int, count: int) -> bytes:
        self._check_host(ptr, count, write=False)
        return ctypes.string_at(ptr, count)

    def host_write(self, ptr: int, data: np.ndarray) -> None:
        self._check_host(ptr, data.nbytes, write=True)
        ctypes.memmove(ptr, data.ctypes.data, data.nbytes)

    # -- copies -------------------------------------------------------------------------------
    def _space_ok(self, ptr: int, wanted: str) -> bool:
        is_dev = self.is_device(ptr)
        if wanted == "device":
            return is_dev or self.rt.config.run_mode == C.RUN_MODE_DEVICE
        return not is_dev

    def copy(self, dst: int, dst_max: int, src: int, count: int, kind: int) -> None:
        """acl.rt.memcpy's checks in the real order, then the copy."""
        if count == 0:
            return
        if dst == 0 or src == 0:
            raise AclFail(C.INVALID_PARAM, "memcpy with a null pointer")
        if count > dst_max:
            raise AclFail(C.RT_PARAM_INVALID, f"memcpy count {count} exceeds dst_max {dst_max}")
        spaces = {
            C.MEMCPY_HOST_TO_HOST: ("host", "host"),
            C.MEMCPY_HOST_TO_DEVICE: ("host", "device"),
            C.MEMCPY_DEVICE_TO_HOST: ("device", "host"),
            C.MEMCPY_DEVICE_TO_DEVICE: ("device", "device"),
        }
        if kind == C.MEMCPY_DEFAULT or (self.rt.config.memcpy_kind_reserved and kind in spaces):
            pass  # CANN 8: the runtime takes the direction from the pointers themselves
        elif kind not in spaces:
            raise AclFail(C.INVALID_PARAM, f"invalid memcpy kind {kind}")
        else:
            src_space, dst_space = spaces[kind]
            if not (self._space_ok(src, src_space) and self._space_ok(dst, dst_space)):
                raise AclFail(
                    C.RT_PARAM_INVALID,
                    f"memcpy kind {kind} does not match the pointers: src {src:#x}, dst {dst:#x}",
                )
        data = (
            self.device_view(src, count).copy()
            if self.is_device(src)
            else np.frombuffer(self.host_read(src, count), dtype=np.uint8)
        )
        if self.is_device(dst):
            self.device_view(dst, count)[:] = data
        else:
            self.host_write(dst, np.ascontiguousarray(data))

    def fill(self, ptr: int, max_size: int, value: int, count: int) -> None:
        if ptr == 0:
            raise AclFail(C.INVALID_PARAM, "memset of a null pointer")
        if count > max_size:
            raise AclFail(C.RT_PARAM_INVALID, f"memset count {count} exceeds max {max_size}")
        if count == 0:
            return
        if self.is_device(ptr):
            self.device_view(ptr, count)[:] = value & 0xFF
        else:
            self.host_write(ptr, np.full(count, value & 0xFF, dtype=np.uint8))

    def read_device(self, ptr: int, count: int) -> np.ndarray:
        return self.device_view(ptr, count).copy()

    def write_device(self, ptr: int, data: np.ndarray) -> None:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        self.device_view(ptr, raw.size)[:] = raw
