"""System shared memory regions that clients register, and the tensors read from and written to
them (Triton's shared-memory extension).

Why a registry of its own: a region is opened once, at register, and every request that names it
reads its inputs from it and writes its outputs to it, so a large tensor never crosses a socket.
Only the process that owns the models holds regions (frontend processes forward the calls to it,
server/multiprocess/remote_core.py), so a region registered over any connection serves them all.

Why pread/pwrite on a descriptor, not a mapping: the file is the client's, and a client can
shrink it (ftruncate) at any moment; a page of a mapping past the file's new end raises SIGBUS
on the first touch, anywhere (the model's thread included), and kills the server. A read from
the descriptor returns short instead, and a write checks the file's size first (a write racing
a truncation extends the file, never faults). Each tensor is therefore a private copy: inputs
are read into fresh buffers at bind (off the event loop past the offload threshold, as bodies
are), outputs written after inference (the copy a mapping would have made anyway).

Safety: a key names a file directly in /dev/shm (no path, no symlink, a regular file only), the
server's own segments cannot be registered, and every offset and size is checked against the
region before it is touched. An unregister only forgets the name: the descriptor lives as long
as the Region object (a request, or a thread still reading for one), so it is never closed, or
its number reused, under a request.
"""

from __future__ import annotations

import os
import stat
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol import datatypes
from protocol.errors import AlreadyExists, InvalidArgument, NotFound, TooLarge, Unavailable
from protocol.shared_memory import BYTE_SIZE, OFFSET, PARAMETERS, REGION
from protocol.text import shown
from protocol.types import InferRequest, InferResponse, Tensor

SHM_DIR = "/dev/shm"
# Keys no client may register: Triton's Python backend's (refused as Triton refuses them) and
# the files this server itself keeps in /dev/shm (server/http/parsers.py,
# backends/python/wire/framing.py).
RESERVED_PREFIXES = ("triton_python_backend_shm_region_", "ascend-serve-")
SIZE_MAX = 2**64 - 1
DEFAULT_MAX_REGIONS = 1024
DEFAULT_MAX_INPUT_BYTES = 64 * 1024 * 1024  # --http-max-input-size's default
DEFAULT_OFFLOAD_THRESHOLD = 64 * 1024  # --http-offload-threshold's default
_IO_STEP = 1 << 30  # bytes per pread/pwrite call (Linux moves at most 2 GiB - 4 KiB per call)


@dataclass(eq=False)
class Region:
    """One registered region: [offset, offset + byte_size) of the file open as `fd`."""

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    users: int = 0  # requests using it now
    retiring: bool = False  # unregistered while in use: goes when the last user is done
    closer: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # The descriptor goes with the object, not with the name: a thread still reading for a
        # request holds the object, so its descriptor is never closed (or reused) under it.
        self.closer = weakref.finalize(self, os.close, self.fd)

    def check(self, offset: int, byte_size: int) -> None:
        """The bytes a tensor names, checked against the region (Triton's texts)."""
        if offset >= self.byte_size and not (offset == 0 and byte_size == 0):
            raise InvalidArgument(f"Invalid offset for shared memory region: '{self.name}'")
        if byte_size > SIZE_MAX - offset:
            raise InvalidArgument(
                f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) "
                f"exceeds maximum value ({SIZE_MAX}) for region '{self.name}'"
            )
        if offset + byte_size > self.byte_size:
            raise InvalidArgument(
                f"Invalid offset + byte size for shared memory region: '{self.name}'"
            )

    def read(self, offset: int, byte_size: int) -> memoryview:
        """A private copy of `byte_size` bytes at `offset` (checked); a file that shrank under
        the region is an error naming it, never a signal."""
        # np.empty: no zero-filling of a buffer about to be overwritten (bytearray fills it).
        view = memoryview(np.empty(byte_size, dtype=np.uint8))  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ on Python 3.12+ only
        done = 0
        while done < byte_size:
            try:
                count = os.preadv(
                    self.fd, [view[done : done + _IO_STEP]], self.offset + offset + done
                )
            except OSError as exc:
                raise self._failed("read", exc) from None
            if count <= 0:
                raise self._shrunk(offset, byte_size)
            done += count
        return view

    def write(self, offset: int, data: memoryview) -> None:
        """Write `data` at `offset` (checked) if the file still holds it; pwrite never faults
        (a truncation between the check and the write only makes the file longer again)."""
        start = self.offset + offset
        try:
            if os.fstat(self.fd).st_size < start + data.nbytes:
                raise self._shrunk(offset, data.nbytes)
            done = 0
            while done < data.nbytes:
                done += os.pwrite(self.fd, data[done : done + _IO_STEP], start + done)
        except OSError as exc:
            raise self._failed("write", exc) from None

    def _shrunk(self, offset: int, byte_size: int) -> InvalidArgument:
        return InvalidArgument(
            f"shared memory region '{self.name}' no longer holds {byte_size} bytes at offset "
            f"{offset}: its file was truncated after it was registered"
        )

    def _failed(self, what: str, exc: OSError) -> InvalidArgument:
        return InvalidArgument(
            f"failed to {what} shared memory region '{self.name}': {exc.strerror or exc}"
        )

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


def _open_region(name: str, key: str, offset: int, byte_size: int) -> Region:
    """Open /dev/shm/<key> read-write, checked to hold [offset, offset + byte_size)."""
    base = key.lstrip("/")  # as shm_open reads it
    if not base:
        raise InvalidArgument(
            f"cannot register shared memory region '{name}' - invalid shm key '{key}'"
        )
    for prefix in RESERVED_PREFIXES:
        if base.startswith(prefix):
            raise InvalidArgument(
                f"cannot register shared memory region '{name}' with key "
                f"'{key}' as the key contains the reserved prefix '{prefix}'"
            )
    if "/" in base or base in (".", "..") or "\0" in base:
        raise InvalidArgument(f"Unable to open shared memory region: '{shown(key)}'")
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(os.path.join(SHM_DIR, base), flags)
    except OSError:
        raise InvalidArgument(f"Unable to open shared memory region: '{shown(key)}'") from None
    try:
        info = os.fstat(fd)
        # A regular file of /dev/shm's own filesystem: no device, FIFO or directory, and no
        # hard link to a file elsewhere (O_NOFOLLOW already refused symlinks).
        if not stat.S_ISREG(info.st_mode) or info.st_dev != os.stat(SHM_DIR).st_dev:
            raise InvalidArgument(f"Unable to open shared memory region: '{shown(key)}'")
        if byte_size == 0 or offset + byte_size > info.st_size:
            raise InvalidArgument(
                f"failed to register shared memory region '{shown(name)}': invalid args"
            )
    except BaseException:
        os.close(fd)
        raise
    return Region(name, key, offset, byte_size, fd)


class SharedMemoryRegistry:
    """The system shared memory regions of this server, by name.

    `max_input_bytes`: what one request's inputs may take from regions (a body of that data
    would be held to the request size limit; here it becomes private copies). Inputs larger
    than `offload_threshold` are read and parsed off the event loop (Binding.read_deferred)."""

    def __init__(
        self,
        max_regions: int = DEFAULT_MAX_REGIONS,
        max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
        offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD,
    ) -> None:
        self.max_regions = max_regions
        self.max_input_bytes = max_input_bytes
        self.offload_threshold = offload_threshold
        self.regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidArgument(
                "'region name' is necessary to register system shared memory region"
            )
        if name in self.regions:
            raise AlreadyExists(f"shared memory region '{shown(name)}' already in manager")
        if len(self.regions) >= self.max_regions:
            raise Unavailable(
                f"failed to register shared memory region '{name}': "
                f"{self.max_regions} regions are registered already "
                f"(--max-shared-memory-regions)"
            )
        self.regions[name] = _open_region(name, key, offset, byte_size)

    def status(self, name: str = "") -> list[dict[str, Any]]:
        if not name:
            return [region.status() for region in self.regions.values()]
        region = self.regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find system shared memory region: '{shown(name)}'")
        return [region.status()]

    def unregister(self, name: str = "") -> None:
        """Unregister one region (unknown names are no error, as in Triton) or all of them. A
        region in use stays (listed, and usable) until its last request is done, as in Triton;
        the descriptor itself lives as long as anything holds the Region."""
        for region in (
            [self.regions[name]]
            if name in self.regions
            else []
            if name
            else list(self.regions.values())
        ):
            if region.users:
                region.retiring = True
            else:
                del self.regions[region.name]

    def _released(self, region: Region) -> None:
        region.users -= 1
        if not region.users and region.retiring and self.regions.get(region.name) is region:
            del self.regions[region.name]

    def get(self, name: str) -> Region:
        region = self.regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find shared memory region: '{shown(name)}'")
        return region

    # ----- requests ----------------------------------------------------------------------
    def bind(self, request: InferRequest) -> Binding | None:
        """Check `request`'s shared-memory inputs and outputs and read the small inputs; None
        when it uses no shared memory (the common case: a dict lookup per tensor). Inputs over
        the offload threshold are left in `deferred` for Binding.read_deferred, which the
        caller runs in a thread. The binding writes the outputs once the response is there,
        and must be released however the request ends."""
        binding: Binding | None = None
        try:
            total = 0
            for tensor in request.inputs:
                if REGION in tensor.parameters:
                    binding = binding or Binding(self)
                    total += self._bind_input(tensor, request.model_name, binding, total)
            for output in request.outputs or ():
                parameters = output.parameters
                if REGION in parameters:
                    name, offset, byte_size = _location(parameters, f"output '{output.name}'")
                    binding = binding or Binding(self)
                    region = binding.hold(self.get(name))
                    region.check(offset, byte_size)
                    binding.targets[output.name] = (region, offset, byte_size)
        except BaseException:
            if binding is not None:
                binding.release()
            raise
        return binding

    def _bind_input(self, tensor: Tensor, model: str, binding: Binding, before: int) -> int:
        """Check one input against its region and the request's budget; read it now when
        small. Returns its byte size."""
        name, offset, byte_size = _location(tensor.parameters, f"input '{tensor.name}'")
        region = binding.hold(self.get(name))
        region.check(offset, byte_size)
        datatype = datatypes.lookup(tensor.datatype)
        count = datatypes.checked_element_count(tensor.name, tensor.shape, datatype)
        if datatype.name != "BYTES" and count * datatype.itemsize != byte_size:
            raise InvalidArgument(
                f"input byte size mismatch for input '{tensor.name}' for "
                f"model '{model}'. Expected {count * datatype.itemsize}, got {byte_size}"
            )
        if before + byte_size > self.max_input_bytes:
            raise TooLarge(
                f"input '{tensor.name}' in shared memory region '{name}' takes the request's "
                f"inputs to {before + byte_size} bytes, over the request size limit of "
                f"{self.max_input_bytes} bytes (--http-max-input-size, --grpc-max-input-size)"
            )
        tensor.parameters = {k: v for k, v in tensor.parameters.items() if k not in PARAMETERS}
        if byte_size > self.offload_threshold:
            binding.deferred.append((tensor, region, offset, byte_size))
        else:
            _read_input(tensor, region, offset, byte_size)
        return byte_size


def _read_input(tensor: Tensor, region: Region, offset: int, byte_size: int) -> None:
    raw = region.read(offset, byte_size)
    datatype = datatypes.lookup(tensor.datatype)
    tensor.data = datatypes.tensor_from_raw(datatype, tensor.shape, raw, tensor.name)


class Binding:
    """One request's use of regions: held while it runs, the inputs still to read, and where
    each shared-memory output goes, written after inference."""

    __slots__ = ("registry", "threshold", "held", "targets", "deferred")

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self.registry: SharedMemoryRegistry | None = registry
        self.threshold = registry.offload_threshold
        self.held: list[Region] = []
        self.targets: dict[str, tuple[Region, int, int]] = {}
        self.deferred: list[tuple[Tensor, Region, int, int]] = []

    def hold(self, region: Region) -> Region:
        if region not in self.held:
            region.users += 1
            self.held.append(region)
        return region

    def release(self) -> None:
        """The request is done with its regions (safe to call more than once)."""
        registry, self.registry = self.registry, None
        if registry is not None:
            for region in self.held:
                registry._released(region)

    def read_deferred(self) -> None:
        """Read (and parse) the inputs over the offload threshold: run in a thread. preadv
        releases the GIL; a BYTES parse is Python code, which hands the GIL back to the event
        loop every switch interval."""
        deferred, self.deferred = self.deferred, []
        for tensor, region, offset, byte_size in deferred:
            _read_input(tensor, region, offset, byte_size)

    def heavy(self, response: InferResponse) -> bool:
        """Whether writing `response`'s shared-memory outputs is work for a thread (over the
        offload threshold, BYTES counted at 8 bytes an element as gRPC's offload counts)."""
        for tensor in response.outputs:
            if tensor.name in self.targets:
                data = tensor.data
                size = data.size * 8 if tensor.datatype == "BYTES" else data.nbytes
                if size > self.threshold:
                    return True
        return False

    def finish(self, response: InferResponse) -> InferResponse:
        """Copy each shared-memory output into its region; the response keeps its name,
        datatype and shape and carries no data for it."""
        if not self.targets:
            return response
        outputs = []
        for tensor in response.outputs:
            target = self.targets.get(tensor.name)
            if target is None:
                outputs.append(tensor)
                continue
            region, offset, byte_size = target
            if tensor.datatype == "BYTES" and tensor.data.size * 4 > byte_size:
                _too_small(tensor.name, byte_size, tensor.data.size * 4)  # before serializing
            raw = memoryview(datatypes.raw_from_tensor(tensor.data, tensor.datatype)).cast("B")
            if raw.nbytes > byte_size:
                _too_small(tensor.name, byte_size, raw.nbytes)
            region.write(offset, raw)
            outputs.append(
                Tensor(
                    tensor.name,
                    tensor.datatype,
                    tensor.shape,
                    np.empty(0, dtype=np.uint8),
                    {REGION: region.name, BYTE_SIZE: raw.nbytes},
                )
            )
        response.outputs = outputs
        return response


def _too_small(name: str, byte_size: int, needed: int) -> None:
    raise InvalidArgument(
        f"shared memory size specified with the request for output "
        f"'{name}' ({byte_size} bytes) should be at least {needed} "
        f"bytes to hold the results"
    )


def _location(parameters: dict[str, Any], what: str) -> tuple[str, int, int]:
    """(region, offset, byte size) of a tensor's shared-memory parameters, type-checked."""
    region = parameters.get(REGION)
    offset = parameters.get(OFFSET, 0)
    byte_size = parameters.get(BYTE_SIZE)
    if not isinstance(region, str):
        raise InvalidArgument(f"'{REGION}' of {what} must be a string")
    if byte_size is None:
        raise InvalidArgument(
            f"'{BYTE_SIZE}' is missing for {what}, which uses shared memory region '{region}'"
        )
    for key, value in ((OFFSET, offset), (BYTE_SIZE, byte_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument(f"'{shown(key)}' of {what} must be a non-negative integer")
    return region, offset, byte_size
