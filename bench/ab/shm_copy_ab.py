"""What reading and writing client shared memory through the descriptor costs against the
mapping it replaced (issue 28, item 1).

Why: a mapped region faults (SIGBUS, the server dies) when its file is truncated under it, so
regions are read with preadv into private buffers and written with fstat + pwrite. This times,
per tensor and in this process (no server): the mapping's view (the old bind: zero copy, but
unsafe), the mapping's view after an fstat check (still unsafe: the file can shrink between the
check and the model's touch), a memcpy out of the mapping (the same window), and preadv into a
fresh buffer (what the server does now); for outputs, a memcpy into the mapping against
fstat + pwrite. `--registry` times server/core/client_shm.py's bind and finish as they are.

    .venv/bin/python -m bench.ab.shm_copy_ab [--registry]
"""

from __future__ import annotations

import argparse
import mmap
import os
import timeit
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

SIZES = (64, 64 << 10, 1 << 20, 16 << 20)
REGION = 64 << 20


def best(action: Callable[[], object], nbytes: int) -> float:
    """Best of 5 runs, in µs per call."""
    number = max(3, min(20000, (256 << 20) // nbytes))
    return min(timeit.repeat(action, number=number, repeat=5)) / number * 1e6


def mechanisms(fd: int, view: memoryview) -> None:
    print(
        f"{'bytes':>9}  {'view':>8} {'fstat+view':>10} {'memcpy':>9} {'preadv':>9}"
        f"  | out: {'memcpy':>9} {'fstat+pwrite':>12}  (µs)"
    )
    for nbytes in SIZES:
        print(_mechanism_row(fd, view, nbytes))


def _mechanism_row(fd: int, view: memoryview, nbytes: int) -> str:
    data = np.ones(nbytes, np.uint8)
    raw = memoryview(data)  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ on Python 3.12+ only

    def fstat_view() -> object:
        os.fstat(fd)
        return np.frombuffer(view[:nbytes], np.uint8)

    def fresh_preadv() -> int:
        return os.preadv(fd, [memoryview(np.empty(nbytes, np.uint8))], 0)  # type: ignore[arg-type]

    def write_checked() -> None:
        os.fstat(fd)
        os.pwrite(fd, raw, 0)

    def memcpy_in() -> None:
        view[:nbytes] = raw

    figures = (
        best(lambda: np.frombuffer(view[:nbytes], np.uint8), nbytes),
        best(fstat_view, nbytes),
        best(lambda: np.frombuffer(view[:nbytes], np.uint8).copy(), nbytes),
        best(fresh_preadv, nbytes),
        best(memcpy_in, nbytes),
        best(write_checked, nbytes),
    )
    return (
        f"{nbytes:>9}  {figures[0]:8.2f} {figures[1]:10.2f} {figures[2]:9.2f} {figures[3]:9.2f}"
        f"  |      {figures[4]:9.2f} {figures[5]:12.2f}"
    )


def registry(key: str) -> None:
    from server.core.client_shm import SharedMemoryRegistry

    shm = SharedMemoryRegistry(max_input_bytes=1 << 40, offload_threshold=1 << 40)
    shm.register("r", key, 0, REGION)
    print(f"{'bytes':>9}  {'bind (read)':>11} {'bind+finish (write)':>20}  (µs)")
    for nbytes in SIZES:
        print(_registry_row(shm, nbytes))


def _registry_row(shm: Any, nbytes: int) -> str:
    from protocol.shared_memory import placeholder
    from protocol.types import InferRequest, InferResponse, RequestedOutput, Tensor

    count = nbytes // 4
    data = np.ones(count, np.int32)
    parameters = {
        "shared_memory_region": "r",
        "shared_memory_offset": 0,
        "shared_memory_byte_size": nbytes,
    }

    def read() -> None:
        tensor = Tensor("x", "INT32", (count,), placeholder(np.int32), dict(parameters))
        binding = shm.bind(InferRequest("m", inputs=[tensor]))
        binding.release()

    def write() -> None:
        wanted = [RequestedOutput("y", parameters=parameters)]
        binding = shm.bind(InferRequest("m", inputs=[], outputs=wanted))
        binding.finish(InferResponse("m", "1", outputs=[Tensor("y", "INT32", (count,), data)]))
        binding.release()

    return f"{nbytes:>9}  {best(read, nbytes):11.2f} {best(write, nbytes):20.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--registry", action="store_true", help="time client_shm.py as it is")
    args = parser.parse_args(argv)
    name = f"ascend_shm_ab_{uuid.uuid4().hex[:8]}"
    path = os.path.join("/dev/shm", name)
    with open(path, "wb") as handle:
        handle.write(b"\1" * REGION)  # written, not sparse: pages exist, as a client's would
    fd = os.open(path, os.O_RDWR)
    try:
        if args.registry:
            registry("/" + name)
        else:
            mapping = mmap.mmap(fd, REGION)
            mechanisms(fd, memoryview(mapping))
    finally:
        os.close(fd)
        os.unlink(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
