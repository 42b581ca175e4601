"""System shared memory regions that clients register, and the tensors read from and written to
them (Triton's shared-memory extension).

Why a registry of its own: a region is mapped once, at register, and every request that names it
reads its inputs as numpy views over that mapping, so a large tensor never crosses a socket.
Only the process that owns the models holds regions (frontend processes forward the calls to it,
server/multiprocess/remote_core.py), so a region registered over any connection serves them all.

Safety: a key names a file directly in /dev/shm (no path, no symlink, a regular file only), the
server's own segments cannot be registered, and every offset and size is checked against the
region before it is touched. An unregister only forgets the name: the mapping lives as long as a
request (or a numpy view over it) still uses it, so nothing is ever unmapped under a request.
"""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol import datatypes
from protocol.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from protocol.shared_memory import BYTE_SIZE, OFFSET, PARAMETERS, REGION
from protocol.types import InferRequest, InferResponse, Tensor

SHM_DIR = "/dev/shm"
# Keys no client may register: Triton's Python backend's (refused as Triton refuses them) and
# the files this server itself keeps in /dev/shm (server/http/parsers.py,
# backends/python/wire/framing.py).
RESERVED_PREFIXES = ("triton_python_backend_shm_region_", "ascend-serve-")
SIZE_MAX = 2**64 - 1
DEFAULT_MAX_REGIONS = 1024


@dataclass(eq=False)
class Region:
    """One registered region: `view` covers exactly [offset, offset + byte_size) of the file."""

    name: str
    key: str
    offset: int
    byte_size: int
    view: memoryview
    users: int = 0  # requests using it now
    retiring: bool = False  # unregistered while in use: goes when the last user is done

    def slice(self, offset: int, byte_size: int) -> memoryview:
        """The bytes a tensor names, checked against the region first (Triton's texts)."""
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
        return self.view[offset : offset + byte_size]

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


def _open_region(name: str, key: str, offset: int, byte_size: int) -> Region:
    """Map [offset, offset + byte_size) of /dev/shm/<key>, read-write, at any offset."""
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
        raise InvalidArgument(f"Unable to open shared memory region: '{key}'")
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(os.path.join(SHM_DIR, base), flags)
    except OSError:
        raise InvalidArgument(f"Unable to open shared memory region: '{key}'") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidArgument(f"Unable to open shared memory region: '{key}'")
        if byte_size == 0 or offset + byte_size > info.st_size:
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
        start = offset - offset % mmap.ALLOCATIONGRANULARITY  # mmap wants an aligned offset
        mapping = mmap.mmap(fd, byte_size + offset - start, offset=start)
    except OSError as exc:
        raise InvalidArgument(
            f"failed to register shared memory region '{name}': {exc.strerror or exc}"
        ) from None
    finally:
        os.close(fd)  # the mapping keeps what it needs
    view = memoryview(mapping)[offset - start :]
    return Region(name, key, offset, byte_size, view)


class SharedMemoryRegistry:
    """The system shared memory regions of this server, by name."""

    def __init__(self, max_regions: int = DEFAULT_MAX_REGIONS) -> None:
        self.max_regions = max_regions
        self.regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidArgument(
                "'region name' is necessary to register system shared memory region"
            )
        if name in self.regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
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
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [region.status()]

    def unregister(self, name: str = "") -> None:
        """Unregister one region (unknown names are no error, as in Triton) or all of them. A
        region in use stays (listed, and usable) until its last request is done, as in Triton;
        the mapping itself lives as long as any tensor view over it."""
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
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        return region

    # ----- requests ----------------------------------------------------------------------
    def bind(self, request: InferRequest) -> Binding | None:
        """Read `request`'s shared-memory inputs in place and check its shared-memory outputs;
        None when it uses no shared memory (the common case: a dict lookup per tensor). The
        returned binding writes the outputs once the response is there, and must be released
        however the request ends."""
        binding: Binding | None = None
        try:
            for tensor in request.inputs:
                if REGION in tensor.parameters:
                    binding = binding or Binding(self)
                    self._read_input(tensor, request.model_name, binding)
            for output in request.outputs or ():
                parameters = output.parameters
                if REGION in parameters:
                    name, offset, byte_size = _location(parameters, f"output '{output.name}'")
                    binding = binding or Binding(self)
                    region = binding.hold(self.get(name))
                    binding.targets[output.name] = (
                        region.slice(offset, byte_size),
                        name,
                        byte_size,
                    )
        except BaseException:
            if binding is not None:
                binding.release()
            raise
        return binding

    def _read_input(self, tensor: Tensor, model: str, binding: Binding) -> None:
        name, offset, byte_size = _location(tensor.parameters, f"input '{tensor.name}'")
        raw = binding.hold(self.get(name)).slice(offset, byte_size)
        datatype = datatypes.lookup(tensor.datatype)
        if datatype.name != "BYTES":
            expected = (
                datatypes.checked_element_count(tensor.name, tensor.shape, datatype)
                * datatype.itemsize
            )
            if expected != byte_size:
                raise InvalidArgument(
                    f"input byte size mismatch for input '{tensor.name}' for "
                    f"model '{model}'. Expected {expected}, got {byte_size}"
                )
        tensor.data = datatypes.tensor_from_raw(datatype, tensor.shape, raw, tensor.name)
        tensor.parameters = {k: v for k, v in tensor.parameters.items() if k not in PARAMETERS}


class Binding:
    """One request's use of regions: held while it runs, and where each shared-memory output
    goes, written after inference."""

    __slots__ = ("registry", "held", "targets")

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self.registry: SharedMemoryRegistry | None = registry
        self.held: list[Region] = []
        self.targets: dict[str, tuple[memoryview, str, int]] = {}

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
            view, region, byte_size = target
            raw = memoryview(datatypes.raw_from_tensor(tensor.data, tensor.datatype)).cast("B")
            if raw.nbytes > byte_size:
                raise InvalidArgument(
                    f"shared memory size specified with the request for output "
                    f"'{tensor.name}' ({byte_size} bytes) should be at least {raw.nbytes} "
                    f"bytes to hold the results"
                )
            view[: raw.nbytes] = raw
            outputs.append(
                Tensor(
                    tensor.name,
                    tensor.datatype,
                    tensor.shape,
                    np.empty(0, dtype=np.uint8),
                    {REGION: region, BYTE_SIZE: raw.nbytes},
                )
            )
        response.outputs = outputs
        return response


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
            raise InvalidArgument(f"'{key}' of {what} must be a non-negative integer")
    return region, offset, byte_size
