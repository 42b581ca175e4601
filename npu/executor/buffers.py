"""Where a batch's tensor bytes live between the server and its NPU executor, so each byte is
written once on either side of the device.

Inputs: `InputArena.gather` (server side, on the instance thread) joins the batch's requests
straight into the shared-memory arena the executor reads, one copy per byte (the scheduler's
own concatenation is skipped for this backend); the executor copies from there to the device.

Outputs: the server owns a few output slabs (`OutputSlabs`, shared memory of the model's
largest output size, mapped by the executor once). Each batch names a free slab; the executor
copies device -> slab (`SlabCarver` hands npu/om_model.py its destination arrays), and the
server's outputs are views of that slab, which goes back to the free list when the last view of
it is gone (the answers were encoded and dropped). When every slab is still held (a response
cache keeps outputs, say) the batch falls back to a private copy, as before.

Used by both processes: standard library, numpy and the wire's arena helpers only.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from backends.python.wire.framing import ALIGN, MIN_ARENA, TensorRef, map_anonymous, round_up

# A batch's outputs as the executor wrote them: (slab id, refs into it).
SlabRefs = tuple[int, list[TensorRef]]


class InputArena:
    """The server's arena for one instance's inputs; only the instance thread uses it."""

    def __init__(self) -> None:
        self._fd = -1
        self._map: mmap.mmap | None = None
        self.size = 0
        self._new_fd: int | None = None
        self.gathered: dict[str, np.ndarray] | None = None  # the last batch gather() made
        self.refs: list[TensorRef] = []

    def gather(self, requests: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Join the requests' inputs along dim 0 in the arena (one copy). An input whose inner
        dims differ between requests is joined flat, as the scheduler's concat_inputs does;
        BYTES inputs are not supported by the NPU and are refused by the backend's checks."""
        first = requests[0]
        layout: list[tuple[str, tuple[int, ...], np.dtype, list[np.ndarray], int]] = []
        end = 0
        for name in first:
            parts = [np.asarray(request[name]) for request in requests]
            dtype = parts[0].dtype
            if dtype.kind == "O":
                raise ValueError(f"input '{name}' is BYTES, which an NPU model cannot take")
            inner = parts[0].shape[1:]
            if len(parts) == 1:
                shape = parts[0].shape
            elif any(part.shape[1:] != inner for part in parts):
                parts = [part.reshape(-1) for part in parts]
                shape = (sum(part.shape[0] for part in parts),)
            else:
                shape = (sum(part.shape[0] for part in parts), *inner)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            layout.append((name, shape, dtype, parts, end))
            end = round_up(end + nbytes, ALIGN)
        self._reserve(end)
        assert self._map is not None
        gathered: dict[str, np.ndarray] = {}
        refs: list[TensorRef] = []
        for name, shape, dtype, parts, offset in layout:
            target = np.ndarray(shape, dtype, buffer=self._map, offset=offset)
            if len(parts) == 1:
                target[...] = parts[0]
            elif target.size:
                np.concatenate(parts, axis=0, out=target)
            gathered[name] = target
            refs.append((name, dtype.str, tuple(shape), offset, target.nbytes))
        self.gathered, self.refs = gathered, refs
        return gathered

    def take_new_fd(self) -> int | None:
        """The arena's descriptor when it was replaced since the last batch (send it along)."""
        fd, self._new_fd = self._new_fd, None
        return fd

    def _reserve(self, needed: int) -> None:
        if self._map is not None and needed <= self.size:
            return
        size = round_up(max(needed, 2 * self.size, MIN_ARENA), mmap.PAGESIZE)
        fd, mapped = map_anonymous(size)
        self.close()
        self._fd, self._map, self.size, self._new_fd = fd, mapped, size, fd

    def resend(self) -> None:
        """A new executor process: send the arena with the next batch."""
        if self._fd >= 0:
            self._new_fd = self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._map, self.size, self._new_fd = -1, None, 0, None
        self.gathered, self.refs = None, []


class _Slab:
    def __init__(self, slab_id: int, size: int) -> None:
        self.id = slab_id
        self.fd, self.map = map_anonymous(size)
        self.size = size
        self.sent = False  # the executor has mapped it


class OutputSlabs:
    """The server's output slabs for one instance. `acquire` on the instance thread; a slab
    comes back (from whichever thread drops the last view) through a finalizer."""

    def __init__(self, slab_bytes: int, limit: int) -> None:
        self.slab_bytes = max(round_up(slab_bytes, mmap.PAGESIZE), mmap.PAGESIZE)
        self.limit = limit
        self._slabs: dict[int, _Slab] = {}
        self._free: list[int] = []
        self._lock = threading.Lock()
        self._closed = False

    def acquire(self) -> tuple[int, int | None] | None:
        """(slab id, its fd when the executor has not mapped it yet), or None: all held."""
        with self._lock:
            if self._free:
                slab = self._slabs[self._free.pop()]
            elif len(self._slabs) < self.limit:
                slab = _Slab(len(self._slabs), self.slab_bytes)
                self._slabs[slab.id] = slab
            else:
                return None
        new_fd = None if slab.sent else slab.fd
        slab.sent = True
        return slab.id, new_fd

    def give_back(self, slab_id: int) -> None:
        """The batch on this slab produced no views (it failed): free it at once."""
        with self._lock:
            if not self._closed and slab_id in self._slabs:
                self._free.append(slab_id)

    def views(self, slab_id: int, refs: Sequence[TensorRef]) -> dict[str, np.ndarray]:
        """The outputs as views of the slab; it is free again once they are all gone."""
        slab = self._slabs[slab_id]
        end = max((offset + nbytes for _, _, _, offset, nbytes in refs), default=0)
        base = np.frombuffer(slab.map, np.uint8, count=end) if end else np.empty(0, np.uint8)
        weakref.finalize(base, self.give_back, slab_id)
        outputs: dict[str, np.ndarray] = {}
        for name, dtype, shape, offset, nbytes in refs:
            outputs[name] = base[offset : offset + nbytes].view(np.dtype(dtype)).reshape(shape)
        return outputs

    def held(self) -> int:
        with self._lock:
            return len(self._slabs) - len(self._free)

    def close(self) -> None:
        """The instance unloads or its executor went: forget every slab (views still alive
        keep their mapping; the descriptors close now)."""
        with self._lock:
            self._closed = True
            slabs, self._slabs, self._free = list(self._slabs.values()), {}, []
        for slab in slabs:
            os.close(slab.fd)

    def reset(self) -> None:
        """A new executor process: every slab must be sent again."""
        with self._lock:
            for slab in self._slabs.values():
                slab.sent = False


class SlabCarver:
    """The executor's side: the server's slabs mapped here, and one batch's outputs carved
    out of the slab the batch names (d2h copies land there directly)."""

    def __init__(self) -> None:
        self._maps: dict[int, mmap.mmap] = {}
        self._current: mmap.mmap | None = None
        self._address = 0
        self._cursor = 0

    def adopt(self, slab_id: int, fd: int) -> None:
        try:
            self._maps[slab_id] = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def begin(self, slab_id: int | None) -> None:
        self._current = self._maps.get(slab_id) if slab_id is not None else None
        self._cursor = 0
        if self._current is not None:
            probe = np.frombuffer(self._current, np.uint8, count=1)
            self._address = probe.ctypes.data
            del probe

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An output's destination: in the slab while it has room, else private memory."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        slab = self._current
        if slab is None or self._cursor + nbytes > len(slab):
            return np.empty(shape, dtype)
        out = np.ndarray(shape, dtype, buffer=slab, offset=self._cursor)
        self._cursor = round_up(self._cursor + nbytes, ALIGN)
        return out

    def refs(self, outputs: Mapping[str, np.ndarray]) -> list[TensorRef] | None:
        """Every output's place in the slab, copying in those that are elsewhere (a side-input
        model's joined parts); None when they do not all fit (the caller packs them)."""
        slab = self._current
        if slab is None:
            return None
        refs: list[TensorRef] = []
        for name, array in outputs.items():
            if array.dtype.kind == "O":
                return None
            offset = array.ctypes.data - self._address
            inside = 0 <= offset and offset + array.nbytes <= len(slab)
            if not (inside and array.flags.c_contiguous):
                placed = self.allocate(array.shape, array.dtype)
                if placed.base is None:  # no room left in the slab
                    return None
                placed[...] = array
                offset = placed.ctypes.data - self._address
            refs.append((name, array.dtype.str, tuple(array.shape), offset, array.nbytes))
        return refs

    def end(self) -> None:
        self._current = None

    def close(self) -> None:
        self._maps.clear()
        self._current = None
