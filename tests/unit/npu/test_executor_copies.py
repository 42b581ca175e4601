"""Tensor bytes between the scheduler and the NPU executor (npu/executor/buffers.py): a batch is
joined once, straight into the shared memory the executor reads, and its outputs come back as
the bytes the device copy wrote into shared memory, not as a copy of them."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.base import InstanceSpec
from npu.executor.client import AscendExecutorBackend
from tests.support.npu_harness import prepare, rows
from tests.support.om_fixtures import EMULATOR_PATH

ROOT = Path(__file__).resolve().parents[3]


def shared_ranges() -> list[tuple[int, int]]:
    """The address ranges of this process's tensor arenas (memfds named by the wire)."""
    found = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "ascend-serve-tensors" in line:
            start, end = line.split()[0].split("-")
            found.append((int(start, 16), int(end, 16)))
    return found


def in_shared_memory(array: np.ndarray) -> bool:
    address = array.ctypes.data
    return any(start <= address and address + array.nbytes <= end for start, end in shared_ranges())


@pytest.fixture
def executor(acl_emu, tmp_path, monkeypatch) -> Iterator[AscendExecutorBackend]:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EMULATOR_PATH), str(ROOT)]))
    config, model_dir, version_dir = prepare(tmp_path)
    instance = AscendExecutorBackend(
        config, model_dir, version_dir, InstanceSpec("m_0", "KIND_GPU", 0, 0)
    )
    instance.load()
    try:
        yield instance
    finally:
        instance.unload()


def test_a_batch_is_joined_once_into_shared_memory(executor: AscendExecutorBackend) -> None:
    a, b = rows(2), rows(3) + 100
    gathered = executor.gather([{"INPUT0": a}, {"INPUT0": b}])
    assert in_shared_memory(gathered["INPUT0"])
    np.testing.assert_array_equal(gathered["INPUT0"], np.concatenate([a, b]))
    out = executor.execute(gathered)
    np.testing.assert_array_equal(out["OUTPUT0"], np.concatenate([a, b]) * 2 + 1)
    np.testing.assert_array_equal(out["OUTPUT1"], np.concatenate([a, b]).sum(1, keepdims=True))


def test_outputs_are_the_devices_bytes_in_shared_memory(executor: AscendExecutorBackend) -> None:
    for n in (1, 3, 8, 2, 5, 4, 7, 6, 1, 8):  # more batches than slabs: each one comes back
        x = rows(n) + n
        out = executor.execute(executor.gather([{"INPUT0": x}]))
        assert in_shared_memory(out["OUTPUT0"]) and in_shared_memory(out["OUTPUT1"])
        np.testing.assert_array_equal(out["OUTPUT0"], x * 2 + 1)
        del out
        gc.collect()


def test_outputs_still_held_keep_their_slab_and_later_batches_get_copies(
    executor: AscendExecutorBackend,
) -> None:
    kept = []
    for n in range(1, 8):  # 4 slabs (the default): batches 5-7 find none free
        kept.append((n, executor.execute(executor.gather([{"INPUT0": rows(n)}]))))
    placed = [in_shared_memory(out["OUTPUT0"]) for _, out in kept]
    assert placed == [True] * 4 + [False] * 3
    for n, out in kept:  # nothing was overwritten meanwhile
        np.testing.assert_array_equal(out["OUTPUT0"], rows(n) * 2 + 1)
    kept.clear()
    gc.collect()
    out = executor.execute(executor.gather([{"INPUT0": rows(2)}]))
    assert in_shared_memory(out["OUTPUT0"])


def test_a_direct_execute_without_gather_still_works(executor: AscendExecutorBackend) -> None:
    out = executor.execute({"INPUT0": rows(3)})
    np.testing.assert_array_equal(out["OUTPUT0"], rows(3) * 2 + 1)


def test_no_output_buffers_means_outputs_are_copied_out(acl_emu, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EMULATOR_PATH), str(ROOT)]))
    text = 'parameters { key: "executor_output_buffers" value: { string_value: "0" } }\n'
    config, model_dir, version_dir = prepare(tmp_path, text)
    instance = AscendExecutorBackend(
        config, model_dir, version_dir, InstanceSpec("m_0", "KIND_GPU", 0, 0)
    )
    instance.load()
    try:
        out = instance.execute(instance.gather([{"INPUT0": rows(3)}]))
        assert not in_shared_memory(out["OUTPUT0"])
        np.testing.assert_array_equal(out["OUTPUT0"], rows(3) * 2 + 1)
    finally:
        instance.unload()
