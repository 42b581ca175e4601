"""The server's side of one NPU batch's bytes, in this process (no server, no executor): the
copy path before issue 26 item 2 against npu/executor/buffers.py.

    .venv/bin/python -m bench.ab.npu_buffers_ab

Before: the scheduler joined the requests (concat_inputs, a fresh array), the backend packed
that into the shared arena, the executor packed its outputs into its arena (a copy of the
d2h destination) and the server copied them out (another fresh array). After: one gather
straight into the (reused) arena, and the outputs are views of a reused slab. Times one batch,
best of 5, per request size and batch size; fresh arrays of 128 KB and more are mmap'd by the
allocator, so each one faults its pages in again: that, more than the copy itself, is what
the old path paid.
"""

from __future__ import annotations

import os
import timeit
from collections.abc import Callable

import numpy as np

from backends.python.wire.framing import ArenaReader, ArenaWriter
from npu.executor.buffers import InputArena, OutputSlabs
from scheduler.batch import concat_inputs

SIZES = (4096, 150 * 1024, 600 * 1024, 4 << 20)


def best(action: Callable[[], object], nbytes: int) -> float:
    number = max(20, min(5000, (200 << 20) // nbytes))
    return min(timeit.repeat(action, number=number, repeat=5)) / number * 1e6


def row(size: int, n: int) -> str:
    requests = [{"INPUT0": np.ones((1, size), np.uint8)} for _ in range(n)]
    produced = np.ones((n, size), np.uint8)
    inputs, outputs, reader = ArenaWriter(), ArenaWriter(), ArenaReader()
    _, fd = outputs.pack([{"OUTPUT0": produced}])
    assert fd is not None
    reader.adopt(os.dup(fd))

    def before() -> object:
        batch = concat_inputs(requests) if n > 1 else requests[0]
        inputs.pack([batch])
        refs, _ = outputs.pack([{"OUTPUT0": produced}])
        return {ref[0]: reader.copy(ref) for ref in refs[0]}

    arena, slabs = InputArena(), OutputSlabs(n * size, 4)
    refs = [("OUTPUT0", "|u1", (n, size), 0, n * size)]

    def after() -> object:
        arena.gather(requests)
        taken = slabs.acquire()
        assert taken is not None
        return slabs.views(taken[0], refs)

    old, new = best(before, n * size), best(after, n * size)
    kb = n * size / 1024
    return f"{size:>8} {n:>5} {old:10.1f} {new:10.1f} {old / kb:10.3f} {new / kb:10.3f}"


def main() -> int:
    head = f"{'bytes':>8} {'batch':>5} {'before µs':>10} {'after µs':>10}"
    print(head + f" {'µs/KB':>10} {'µs/KB':>10}")
    for size in SIZES:
        for n in (1, 4):
            print(row(size, n))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
