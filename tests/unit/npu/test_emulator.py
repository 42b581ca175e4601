"""The pyACL emulator itself: it must behave like the real binding (reference/pyacl.md §9.7)
for the backend tests to mean anything."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.support import om_fixtures as omf


@pytest.fixture
def ready(acl_emu):
    """Initialised, device 0 set, an explicit context and a stream on this thread."""
    acl = acl_emu
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    ctx, ret = acl.rt.create_context(0)
    stream, ret2 = acl.rt.create_stream()
    assert ret == ret2 == 0
    yield acl, ctx, stream
    acl.rt.destroy_stream(stream)
    acl.rt.destroy_context(ctx)
    acl.rt.reset_device(0)


def load(acl, path):
    model_id, ret = acl.mdl.load_from_file(str(path))
    assert ret == 0, acl.get_recent_err_msg()
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, model_id) == 0
    return model_id, desc


def io(acl, desc, n_in, n_out):
    """Datasets with device buffers at the reported sizes; returns (in_ds, out_ds, ptrs, bufs)."""
    ptrs, bufs, datasets = [], [], []
    for count, size_of in (
        (n_in, acl.mdl.get_input_size_by_index),
        (n_out, acl.mdl.get_output_size_by_index),
    ):
        ds = acl.mdl.create_dataset()
        for i in range(count):
            ptr, ret = acl.rt.malloc(size_of(desc, i), 0)
            assert ret == 0
            buf = acl.create_data_buffer(ptr, size_of(desc, i))
            assert acl.mdl.add_dataset_buffer(ds, buf) == (ds, 0)
            ptrs.append(ptr)
            bufs.append(buf)
        datasets.append(ds)
    return datasets[0], datasets[1], ptrs, bufs


def release(acl, model_id, desc, datasets, ptrs, bufs):
    for ptr in ptrs:
        assert acl.rt.free(ptr) == 0
    for buf in bufs:
        assert acl.destroy_data_buffer(buf) == 0
    for ds in datasets:
        assert acl.mdl.destroy_dataset(ds) == 0
    assert acl.mdl.unload(model_id) == 0
    assert acl.mdl.destroy_desc(desc) == 0


def test_return_shapes_and_argument_parsing(acl_emu):
    acl = acl_emu
    assert acl.rt.malloc(16, 0) == (0, 100001)  # before init
    assert acl.init() == 0 and acl.init() == 100002
    assert acl.rt.malloc(16, 0) == (0, 107002)  # no context on this thread
    assert "set_device" in acl.get_recent_err_msg()
    assert acl.rt.set_device(0) == 0
    ptr, ret = acl.rt.malloc(16, 0)
    assert ret == 0 and ptr >= 1 << 48
    free, total, ret = acl.rt.get_mem_info(1)
    assert ret == 0 and total - free == 16 + 16 + 32  # rounded up to 32, plus 32
    with pytest.raises(TypeError, match="args parse failed"):
        acl.rt.free(None)
    with pytest.raises(TypeError):
        acl.rt.malloc(16.0, 0)
    with pytest.raises(TypeError):
        acl.rt.malloc(16)
    assert acl.rt.get_device_count() == (2, 0)
    assert acl.rt.get_run_mode() == (1, 0)
    assert acl.rt.free(ptr) == 0
    assert acl.rt.reset_device(0) == 0
    assert acl.finalize() == 0 and acl.finalize() == 100037


def test_device_memory_ledger(ready):
    acl, _, _ = ready
    assert acl.rt.malloc(0, 0) == (0, 100000)
    acl._emu.configure(memory_bytes=1024)
    assert acl.rt.malloc(4096, 0) == (0, 207001)
    ptr, _ = acl.rt.malloc(100, 0)
    assert acl.rt.free(ptr + 8) == 107000  # interior pointer
    assert acl.rt.free(ptr) == 0
    assert acl.rt.free(ptr) == 107000  # double free
    assert acl.rt.free(0) == 100000
    assert any("double free" in v for v in acl._emu.violations())
    with pytest.raises(AssertionError, match="double free"):
        acl._emu.assert_clean()
    acl._emu.reset()
    acl.init(), acl.rt.set_device(0), acl.rt.create_context(0), acl.rt.create_stream()


def test_leaks_are_reported_at_reset_device(acl_emu):
    acl = acl_emu
    acl.init()
    acl.rt.set_device(0)
    acl.rt.malloc(64, 0)
    acl.create_data_buffer(0, 0)
    acl.mdl.create_dataset()
    assert acl.rt.reset_device(0) == 0
    assert any("reset_device(0) left 1 device allocation" in v for v in acl._emu.violations())
    with pytest.raises(AssertionError) as info:
        acl._emu.assert_clean()
    text = str(info.value)
    assert "1 data_buffers" in text and "1 datasets" in text and "made at" in text
    acl._emu.reset()


def test_layers_leak_independently(ready, tmp_path):
    acl, _, _ = ready
    model_id, desc = load(acl, omf.scale_model(tmp_path / "m.om"))
    in_ds, out_ds, ptrs, bufs = io(acl, desc, 2, 2)
    acl.mdl.destroy_dataset(in_ds)
    acl.mdl.destroy_dataset(out_ds)
    acl.mdl.unload(model_id)
    acl.mdl.destroy_desc(desc)
    stats = acl._emu.stats()
    assert stats["data_buffers"] == 4 and stats["allocations"] == 4 and stats["models"] == 0
    for ptr in ptrs:
        acl.rt.free(ptr)
    for buf in bufs:
        acl.destroy_data_buffer(buf)


def test_memcpy_checks(ready):
    acl, _, _ = ready
    dev, _ = acl.rt.malloc(64, 0)
    host = np.arange(16, dtype=np.float32)
    assert acl.rt.memcpy(dev, 64, host.ctypes.data, 0, 1) == 0  # count 0: no-op
    assert acl.rt.memcpy(0, 64, host.ctypes.data, 64, 1) == 100000
    assert acl.rt.memcpy(dev, 32, host.ctypes.data, 64, 1) == 107000  # count > dst_max
    assert acl.rt.memcpy(dev, 64, host.ctypes.data, 64, 2) == 0  # CANN 8: kind is reserved
    acl._emu.configure(memcpy_kind_reserved=False)  # older CANN checks kind against the pointers
    assert acl.rt.memcpy(dev, 64, host.ctypes.data, 64, 2) == 107000  # kind says D2H
    acl._emu.configure(memcpy_kind_reserved=True)
    assert acl.rt.memcpy(dev + 32, 64, host.ctypes.data, 64, 1) == 107000  # past the end
    assert acl.rt.memcpy(dev, 64, host.ctypes.data, 64, 1) == 0
    # D2H into an immutable bytes object, as acllite does
    target = bytes(64)
    assert acl.rt.memcpy(acl.util.bytes_to_ptr(target), 64, dev, 64, 2) == 0
    np.testing.assert_array_equal(np.frombuffer(target, dtype=np.float32), host)
    assert acl.util.ptr_to_bytes(acl.util.bytes_to_ptr(target), 8) == target[:8]
    assert acl.rt.memcpy(dev, 64, 12345, 64, 1) == 107000  # unmapped host address, no crash
    assert acl.rt.free(dev) == 0


def test_dangling_bytes_pointer_is_caught(ready):
    acl, _, _ = ready
    dev, _ = acl.rt.malloc(8, 0)
    ptr = acl.util.bytes_to_ptr(bytes(range(9)))  # the bytes object dies at once
    with pytest.raises(AssertionError, match="outlived its bytes"):
        acl.rt.memcpy(dev, 8, ptr, 8, 1)
    acl.rt.free(dev)
    acl._emu.reset()
    acl.init(), acl.rt.set_device(0), acl.rt.create_context(0), acl.rt.create_stream()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_numpy_to_ptr_warns(acl_emu):
    with pytest.warns(RuntimeWarning, match="not C-contiguous"):
        acl_emu.util.numpy_to_ptr(np.zeros((4, 4))[:, 1])


def test_contexts_are_per_thread(ready, tmp_path):
    acl, ctx, stream = ready
    model_id, desc = load(acl, omf.scale_model(tmp_path / "m.om"))
    seen = {}

    def other_thread():
        seen["malloc"] = acl.rt.malloc(8, 0)[1]
        seen["sync"] = acl.rt.synchronize_stream(stream)
        acl.rt.set_device(1)
        seen["foreign_stream"] = acl.rt.synchronize_stream(stream)
        seen["foreign_model"] = acl.mdl.unload(model_id)
        acl.rt.reset_device(1)

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert seen == {
        "malloc": 107002,
        "sync": 107002,
        "foreign_stream": 107003,
        "foreign_model": 107004,
    }
    acl.mdl.unload(model_id)
    acl.mdl.destroy_desc(desc)


def test_model_description(ready, tmp_path):
    acl, _, _ = ready
    model_id, desc = load(acl, omf.scale_model(tmp_path / "m.om"))
    assert acl.mdl.get_num_inputs(desc) == 2  # the gear tensor counts
    assert acl.mdl.get_input_name_by_index(desc, 1) == "ascend_mbatch_shape_data"
    assert acl.mdl.get_input_dims(desc, 0) == (
        {"name": "INPUT0", "dimCount": 2, "dims": [-1, 4]},
        0,
    )
    assert acl.mdl.get_input_size_by_index(desc, 0) == 8 * 4 * 4  # the largest gear
    assert acl.mdl.get_output_name_by_index(desc, 0) == "PartitionedCall_OUTPUT0_0:0:OUTPUT0"
    assert acl.mdl.get_input_data_type(desc, 0) == 0
    assert acl.mdl.get_dynamic_batch(desc) == ({"batchCount": 4, "batch": [4, 1, 8, 2]}, 0)
    # out of range getters: 0 / "" / -1 / ({}, 100000)
    assert acl.mdl.get_input_size_by_index(desc, 9) == 0
    assert acl.mdl.get_input_name_by_index(desc, 9) == ""
    assert acl.mdl.get_input_data_type(desc, 9) == -1
    assert acl.mdl.get_input_dims(desc, 9) == ({}, 100000)
    assert acl.mdl.get_input_index_by_name(desc, "nope") == (0, 100000)
    assert acl.mdl.get_input_index_by_name(desc, "ascend_mbatch_shape_data") == (1, 0)
    static_id, static_desc = load(
        acl, omf.scale_model(tmp_path / "s.om", gears=None, static_batch=2)
    )
    assert acl.mdl.get_dynamic_batch(static_desc) == ({"batchCount": 0, "batch": []}, 0)
    assert acl.mdl.get_num_inputs(static_desc) == 1
    for mid, d in ((model_id, desc), (static_id, static_desc)):
        acl.mdl.unload(mid)
        acl.mdl.destroy_desc(d)
    assert acl.mdl.load_from_file(str(tmp_path / "missing.om")) == (0, 145002)


def test_dynamic_gears(ready, tmp_path):
    acl, _, stream = ready
    model_id, desc = load(acl, omf.scale_model(tmp_path / "m.om"))
    in_ds, out_ds, ptrs, bufs = io(acl, desc, 2, 2)
    assert acl.mdl.execute_async(model_id, in_ds, out_ds, stream) == 145013  # no gear set
    assert acl.mdl.set_dynamic_batch_size(model_id, in_ds, 1, 3) == 145013
    assert acl.mdl.set_dynamic_batch_size(model_id, in_ds, 1, 0) == 100000
    # GE writes the gear into whatever buffer sits at the index: here it clobbers INPUT0
    assert acl.mdl.set_dynamic_batch_size(model_id, in_ds, 0, 2) == 0
    clobbered = np.zeros(2, dtype=np.uint32)
    acl.rt.memcpy(clobbered.ctypes.data, 8, ptrs[0], 8, 2)
    assert clobbered.tolist() == [2, 0]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert acl.rt.memcpy(ptrs[0], x.nbytes, x.ctypes.data, x.nbytes, 1) == 0
    assert acl.mdl.get_input_data_type(desc, 1) == 3  # the gear tensor is INT32 [1], as GE makes it
    assert acl.mdl.get_input_dims(desc, 1)[0]["dims"] == [1]
    assert acl.mdl.set_dynamic_batch_size(model_id, in_ds, 1, 2) == 0
    gear_value = np.zeros(1, dtype=np.uint32)
    acl.rt.memcpy(gear_value.ctypes.data, 4, ptrs[1], 4, 2)
    assert gear_value[0] == 2
    assert acl.mdl.execute_async(model_id, in_ds, out_ds, stream) == 0
    out = np.zeros((2, 4), dtype=np.float32)
    acl.rt.memcpy(out.ctypes.data, out.nbytes, ptrs[2], out.nbytes, 2)
    assert not np.array_equal(out, x * 2 + 1)  # the copy does not wait for the stream
    assert acl.rt.synchronize_stream(stream) == 0
    acl.rt.memcpy(out.ctypes.data, out.nbytes, ptrs[2], out.nbytes, 2)
    np.testing.assert_array_equal(out, x * 2 + 1)
    assert acl.mdl.get_cur_output_dims(desc, 0)[0]["dims"] == [2, 4]
    release(acl, model_id, desc, (in_ds, out_ds), ptrs, bufs)


def test_execute_validation(ready, tmp_path):
    acl, _, stream = ready
    model_id, desc = load(
        acl, omf.scale_model(tmp_path / "s.om", gears=None, static_batch=2, features=64)
    )
    in_ds, out_ds, ptrs, bufs = io(acl, desc, 1, 2)
    assert acl.mdl.execute(model_id, 0, out_ds) == 100000
    assert acl.mdl.execute(model_id, out_ds, out_ds) == 145000  # buffer count
    assert acl.mdl.execute(999, in_ds, out_ds) == 145003
    small, _ = acl.rt.malloc(8, 0)
    small_buf = acl.create_data_buffer(small, 8)
    small_ds = acl.mdl.create_dataset()
    acl.mdl.add_dataset_buffer(small_ds, small_buf)
    assert acl.mdl.execute(model_id, small_ds, out_ds) == 145000  # 8 + 64 < 512 bytes
    assert acl.mdl.execute(model_id, in_ds, out_ds) == 0
    release(acl, model_id, desc, (in_ds, out_ds, small_ds), ptrs + [small], bufs + [small_buf])


def test_one_model_entered_from_two_threads_is_caught(ready, tmp_path):
    acl, ctx, stream = ready
    model_id, desc = load(acl, omf.scale_model(tmp_path / "m.om"))
    in_ds, out_ds, ptrs, bufs = io(acl, desc, 2, 2)
    acl.mdl.set_dynamic_batch_size(model_id, in_ds, 1, 1)
    assert acl.mdl.execute_async(model_id, in_ds, out_ds, stream) == 0
    caught = []

    def intruder():
        acl.rt.set_context(ctx)
        other, _ = acl.rt.create_stream()
        try:
            acl.mdl.execute_async(model_id, in_ds, out_ds, other)
        except AssertionError as exc:
            caught.append(exc)
        acl.rt.destroy_stream(other)

    worker = threading.Thread(target=intruder)
    worker.start()
    worker.join()
    assert caught and type(caught[0]).__name__ == "ConcurrentModelUse"
    assert acl.rt.synchronize_stream(stream) == 0
    release(acl, model_id, desc, (in_ds, out_ds), ptrs, bufs)
    acl._emu.reset()
    acl.init(), acl.rt.set_device(0), acl.rt.create_context(0), acl.rt.create_stream()


def test_fault_injection(ready):
    acl, _, _ = ready
    acl._emu.inject("rt.malloc", 207001, count=2, after=1)
    results = [acl.rt.malloc(8, 0) for _ in range(4)]
    assert [r[1] for r in results] == [0, 207001, 207001, 0]
    assert "injected" in acl.get_recent_err_msg()
    assert acl.get_recent_err_msg() is None  # read once
    for ptr, ret in results:
        if ret == 0:
            acl.rt.free(ptr)
    acl._emu.lose_device(0)
    assert acl.rt.malloc(8, 0) == (0, 507010)
    assert acl.rt.set_device(0) == 507033


def test_telemetry_follows_the_ledger(ready):
    acl, _, _ = ready
    free, total, _ = acl.rt.get_mem_info(1)
    assert (free, total) == acl.rt.get_mem_info(0)[:2]  # 310P: HBM redirected to DDR
    assert acl.rt.get_mem_info(5) == (0, 0, 0)
    ptr, _ = acl.rt.malloc(1000, 0)
    assert acl.rt.get_mem_info(1)[0] == free - 1056
    rates, ret = acl.rt.get_device_utilization_rate(0)
    assert ret == 0 and set(rates) == {
        "cube_utilization",
        "vector_utilization",
        "aicpu_utilization",
        "memory_utilization",
        "utilization_extend",
    }
    acl.rt.free(ptr)


def test_environment_configures_a_subprocess_emulator(tmp_path):
    import json
    import subprocess
    import sys

    env = omf.emulator_env(
        config={"device_count": 3, "faults": [{"fn": "rt.malloc", "ret": 207001}]},
        report_path=tmp_path / "report.json",
    )
    code = (
        "import acl; acl.init(); acl.rt.set_device(0); "
        "print(acl.rt.get_device_count(), acl.rt.malloc(8, 0)[1], acl.rt.malloc(8, 0)[1])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.split() == ["(3,", "0)", "207001", "0"], result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["stats"]["allocations"] == 1 and report["stats"]["device_refs"] == 1


# ----- time and the GIL, as the real binding spends them (reference/pyacl.md, section 6) -----


class Ticker:
    """A pure-Python thread that ticks every 5 ms: the longest gap between ticks is how long
    something kept the GIL from every other thread (the event loop of a server, say)."""

    def __init__(self) -> None:
        self.ticks: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.ticks.append(time.monotonic())
            time.sleep(0.005)

    def __enter__(self) -> Ticker:
        self._thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.05)
        self._stop.set()
        self._thread.join()

    @property
    def longest_gap(self) -> float:
        return max(b - a for a, b in zip(self.ticks, self.ticks[1:], strict=False))


def test_load_memcpy_and_sync_execute_hold_the_gil(ready, tmp_path):
    acl, _, _ = ready
    path = omf.with_fields(omf.scale_model, load_ms=800)(tmp_path / "slow.om")
    with Ticker() as ticker:
        model_id, desc = load(acl, path)
    assert ticker.longest_gap > 0.5  # the whole load stalled the other thread
    acl._emu.configure(copy_bytes_per_s=100e6)
    size = 60 << 20  # 0.6 s at 100 MB/s
    ptr, _ = acl.rt.malloc(size, 0)
    host = np.zeros(size, dtype=np.uint8)
    with Ticker() as ticker:
        started = time.monotonic()
        assert acl.rt.memcpy(ptr, size, host.ctypes.data, size, 1) == 0
        took = time.monotonic() - started
    assert took > 0.4 and ticker.longest_gap > 0.4  # in proportion to the bytes, GIL held
    acl.rt.free(ptr)
    acl._emu.configure(copy_bytes_per_s=0)
    acl.mdl.unload(model_id)
    acl.mdl.destroy_desc(desc)
    static = omf.scale_model(tmp_path / "s.om", gears=None, latency_ms={"fixed": 800})
    model_id, desc = load(acl, static)
    in_ds, out_ds, ptrs, bufs = io(acl, desc, 1, 2)
    with Ticker() as ticker:
        assert acl.mdl.execute(model_id, in_ds, out_ds) == 0
    assert ticker.longest_gap > 0.5
    release(acl, model_id, desc, (in_ds, out_ds), ptrs, bufs)


def test_configured_calls_and_the_first_set_device_hold_the_gil(acl_emu):
    acl = acl_emu
    acl._emu.configure(gil_s={"rt.set_device": 0.8, "rt.get_run_mode": 0.8})
    assert acl.init() == 0
    with Ticker() as ticker:
        assert acl.rt.set_device(1) == 0
    assert ticker.longest_gap > 0.5
    with Ticker() as ticker:
        assert acl.rt.set_device(1) == 0  # only the first open of a device is slow
        assert acl.rt.reset_device(1) == 0
    assert ticker.longest_gap < 0.5
    with Ticker() as ticker:
        assert acl.rt.get_run_mode()[1] == 0
    assert ticker.longest_gap > 0.5
    acl._emu.configure(gil_s={})
    assert acl.rt.reset_device(1) == 0


def _run_on(acl, device, model_path, gear, results):
    """One thread: its own context and stream on `device`, one execution at `gear`."""
    ctx, _ = acl.rt.create_context(device)
    stream, _ = acl.rt.create_stream()
    model_id, desc = load(acl, model_path)
    in_ds, out_ds, ptrs, bufs = io(acl, desc, 2, 2)
    assert acl.mdl.set_dynamic_batch_size(model_id, in_ds, 1, gear) == 0
    results.append(("ready", time.monotonic()))
    assert acl.mdl.execute_async(model_id, in_ds, out_ds, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    results.append(("done", time.monotonic()))
    release(acl, model_id, desc, (in_ds, out_ds), ptrs, bufs)
    acl.rt.destroy_stream(stream)
    acl.rt.destroy_context(ctx)


def _two_executions(acl, devices, model_path, gear=1):
    acl.rt.set_device(0), acl.rt.set_device(1)
    results: list = []
    threads = [
        threading.Thread(target=_run_on, args=(acl, d, model_path, gear, results)) for d in devices
    ]
    with Ticker() as ticker:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    acl.rt.reset_device(0), acl.rt.reset_device(1)
    done = [t for kind, t in results if kind == "done"]
    started = max(t for kind, t in results if kind == "ready")
    return max(done) - started, ticker.longest_gap


def test_devices_run_in_parallel_streams_on_one_device_serialise(acl_emu, tmp_path):
    acl = acl_emu
    assert acl.init() == 0
    path = omf.scale_model(tmp_path / "m.om", latency_ms={"fixed": 500})
    apart, gap = _two_executions(acl, (0, 1), path)
    assert apart < 0.85  # two devices: side by side
    assert gap < 0.4  # synchronize_stream waits with the GIL released
    together, _ = _two_executions(acl, (0, 0), path)
    assert together > 0.9  # two streams on one device: one after the other


def test_device_time_depends_on_the_gear(acl_emu, tmp_path):
    acl = acl_emu
    assert acl.init() == 0
    path = omf.scale_model(tmp_path / "m.om", latency_ms={"fixed": 0, "per_sample": 100})
    small, _ = _two_executions(acl, (0,), path, gear=1)
    large, _ = _two_executions(acl, (0,), path, gear=8)
    assert small < 0.5 < large


def _hang_ready(acl, path, value):
    """A static model whose input holds `value`, queued on a new stream; (stream, io, ids)."""
    model_id, desc = load(acl, path)
    in_ds, out_ds, ptrs, bufs = io(acl, desc, 1, 2)
    x = np.full((1, 4), value, dtype=np.float32)
    assert acl.rt.memcpy(ptrs[0], x.nbytes, x.ctypes.data, x.nbytes, 1) == 0
    stream, ret = acl.rt.create_stream()
    assert ret == 0
    assert acl.mdl.execute_async(model_id, in_ds, out_ds, stream) == 0
    return stream, (model_id, desc, (in_ds, out_ds), ptrs, bufs)


def test_a_hung_execution_times_out_the_sync_and_holds_the_device(ready, tmp_path):
    """A hang poison: the execution never finishes. synchronize_stream_with_timeout gives up
    with 507046 and the work carries on, keeping the device: a second stream there (another
    instance) times out too. Released by the test, everything finishes and cleans up."""
    acl, _, _ = ready
    path = omf.scale_model(tmp_path / "m.om", gears=None, poison={"value": -3.0, "hang": True})
    hung, first = _hang_ready(acl, path, -3.0)
    other, second = _hang_ready(acl, path, 1.0)  # healthy inputs, same device
    assert acl.rt.synchronize_stream_with_timeout(hung, 0) == 100000  # -1 or > 0 ms only
    assert acl.rt.synchronize_stream_with_timeout(hung, 200) == 507046
    assert "Stream synchronize timeout" in acl.get_recent_err_msg()
    assert acl._emu.hung() == 1
    assert acl.rt.synchronize_stream_with_timeout(other, 200) == 507046  # the device is hung
    acl._emu.release_hangs()
    assert acl.rt.synchronize_stream_with_timeout(hung, -1) == 0  # waits for the stuck work
    assert acl.rt.synchronize_stream(other) == 0
    for stream, resources in ((hung, first), (other, second)):
        assert acl.rt.destroy_stream(stream) == 0
        release(acl, *resources)


def test_destroying_a_stream_whose_work_hung_is_misuse(ready, tmp_path):
    acl, _, _ = ready
    path = omf.scale_model(tmp_path / "m.om", gears=None, poison={"value": -3.0, "hang": True})
    hung, resources = _hang_ready(acl, path, -3.0)
    assert acl.rt.synchronize_stream_with_timeout(hung, 100) == 507046
    assert acl.rt.destroy_stream(hung) == 0
    assert any("never finished" in v for v in acl._emu.violations())
    acl._emu.release_hangs()
    release(acl, *resources)
    acl._emu.reset()  # the misuse above was the point


def test_an_older_binding_has_no_sync_with_timeout(acl_emu):
    assert hasattr(acl_emu.rt, "synchronize_stream_with_timeout")
    acl_emu._emu.reset(sync_with_timeout=False)
    assert not hasattr(acl_emu.rt, "synchronize_stream_with_timeout")


def test_set_input_aipp_makes_ge_s_checks(ready, tmp_path):
    """GE's aclmdlSetInputAIPP checks (acl_aipp.cpp, aipp_param_check.cpp): batch and AIPP output
    equal to the model's (here N 4, 16x16), sources within max_src_image_size, even YUV420SP."""
    acl, _, _ = ready
    om = omf.aipp_model(tmp_path / "m.om", mode="dynamic", max_src_image_size=4 * 384)
    model_id, desc = load(acl, om)
    in_ds, out_ds, ptrs, bufs = io(acl, desc, 3, 1)  # image, gear tensor, AIPP data; total

    def attempt(batch: int, w: int, h: int) -> int:
        handle = acl.mdl.create_aipp(batch)
        assert acl.mdl.set_aipp_input_format(handle, 1) == 0
        assert acl.mdl.set_aipp_src_image_size(handle, w, h) == 0
        ret = acl.mdl.set_input_aipp(model_id, in_ds, 2, handle)
        assert acl.mdl.destroy_aipp(handle) == 0
        return ret

    assert attempt(2, 16, 16) == 100000  # batch 2, the model's N is 4
    assert "AclAippBatchSize = 2" in acl.get_recent_err_msg()
    assert attempt(4, 16, 12) == 100000  # output 16x12, the model takes 16x16
    assert attempt(4, 18, 18) == 100000  # 4 x 486 bytes > max_src_image_size 1536
    assert "max_src_image_size[1536]" in acl.get_recent_err_msg()
    assert attempt(4, 16, 16) == 0
    assert acl.mdl.get_input_size_by_index(desc, 0) == 4 * 384
    release(acl, model_id, desc, (in_ds, out_ds), ptrs, bufs)


def _gear_tensor(acl, tmp_path, writer, name):
    model_id, desc = load(acl, writer(tmp_path / f"{name}.om"))
    n_in, n_out = acl.mdl.get_num_inputs(desc), acl.mdl.get_num_outputs(desc)
    in_ds, out_ds, ptrs, bufs = io(acl, desc, n_in, n_out)
    return model_id, desc, in_ds, out_ds, ptrs, bufs, n_in - 1


def test_gear_setters_hold_the_gil_while_they_copy_the_gear(ready, tmp_path):
    """GE writes each gear value with its own synchronous memcpy, inside a wrapper that never
    releases the GIL: every other thread stalls for the copies (gear_copy_s per value)."""
    acl, _, _ = ready
    assert acl._emu.Config().gear_copy_s > 0  # by default, not only when configured
    acl._emu.configure(gear_copy_s=0.4)
    calls = {
        "batch": (omf.scale_model, lambda m, ds, i: acl.mdl.set_dynamic_batch_size(m, ds, i, 4)),
        "hw": (omf.hw_model, lambda m, ds, i: acl.mdl.set_dynamic_hw_size(m, ds, i, 16, 16)),
        "dims": (
            omf.dims_model,
            lambda m, ds, i: acl.mdl.set_input_dynamic_dims(
                m, ds, i, {"name": "", "dimCount": 2, "dims": [1, 8]}
            ),
        ),
    }
    for name, (writer, setter) in calls.items():
        model_id, desc, in_ds, out_ds, ptrs, bufs, index = _gear_tensor(acl, tmp_path, writer, name)
        with Ticker() as ticker:
            assert setter(model_id, in_ds, index) == 0, (name, acl.get_recent_err_msg())
        assert ticker.longest_gap > 0.3, name  # at least one copy of 0.4 s with the GIL held
        release(acl, model_id, desc, (in_ds, out_ds), ptrs, bufs)
    acl._emu.configure(gear_copy_s=0.0)


def test_dims_gears_are_read_and_set_in_the_input_shape_order(ready, tmp_path):
    """GE (ge_executor.cc GetCurDynamicDims): a gear is the dims of the inputs --input_shape
    lists, in its order; a wrong length or a changed static dim is 145012, a non-gear 145013."""
    acl, _, _ = ready
    model_id, desc, in_ds, out_ds, ptrs, bufs, index = _gear_tensor(
        acl, tmp_path, omf.dims_pair_model, "pair"
    )
    count, ret = acl.mdl.get_input_dynamic_gear_count(desc, -1)
    gears, ret2 = acl.mdl.get_input_dynamic_dims(desc, -1, count)
    assert ret == ret2 == 0
    assert [g["dims"] for g in gears] == [[2, 2, 1, 8], [4, 2, 1, 16]]  # weights, then tokens
    assert [g["name"] for g in gears] == ["", ""]  # the binding does not say whose dims

    def set_dims(values):
        return acl.mdl.set_input_dynamic_dims(
            model_id, in_ds, index, {"name": "", "dimCount": len(values), "dims": values}
        )

    assert set_dims([4, 2, 1, 16]) == 0
    assert set_dims([1, 16, 4, 2]) == 145012  # model order: static dims do not match
    assert set_dims([4, 2, 1, 16, 3]) == 145012  # bias is not listed
    assert set_dims([3, 2, 1, 16]) == 145013  # no such gear
    release(acl, model_id, desc, (in_ds, out_ds), ptrs, bufs)


# A child process: `runs` executions of the model at argv[1] on device 0, one after another;
# prints when it started submitting and when its last execution came back.
_CHILD = """
import sys, time
import acl
path, runs = sys.argv[1], int(sys.argv[2])
acl.init(); acl.rt.set_device(0)
stream, _ = acl.rt.create_stream()
model_id, _ = acl.mdl.load_from_file(path)
desc = acl.mdl.create_desc(); acl.mdl.get_desc(desc, model_id)
datasets = []
for count, size_of in ((acl.mdl.get_num_inputs(desc), acl.mdl.get_input_size_by_index),
                       (acl.mdl.get_num_outputs(desc), acl.mdl.get_output_size_by_index)):
    ds = acl.mdl.create_dataset()
    for i in range(count):
        ptr, _ = acl.rt.malloc(size_of(desc, i), 0)
        acl.mdl.add_dataset_buffer(ds, acl.create_data_buffer(ptr, size_of(desc, i)))
    datasets.append(ds)
print("ready", flush=True)
sys.stdin.readline()
started = time.monotonic()
for _ in range(runs):
    assert acl.mdl.execute_async(model_id, datasets[0], datasets[1], stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
print(started, time.monotonic(), flush=True)
"""


def test_two_processes_share_one_device(tmp_path):
    """Executions that two processes submit to one NPU run one after another on it, as on a
    card (its AI cores serve every process's streams), when they share a timeline
    directory: the second process's work waits for the first's, so the two finish no sooner
    than the sum of their device times."""
    import subprocess
    import sys

    path = omf.scale_model(tmp_path / "m.om", gears=None, latency_ms={"fixed": 20})
    env = omf.emulator_env(config={"timeline_dir": str(tmp_path / "timeline")})
    runs = 20
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path), str(runs)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        spans = [child.communicate(timeout=60)[0].split() for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()
    started = min(float(span[0]) for span in spans)
    ended = max(float(span[1]) for span in spans)
    # 40 executions of 20 ms on one device: at least 0.8 s of device time, in any order.
    # With a timeline per process (the emulator before) the two ran side by side (~0.4 s).
    assert ended - started >= 2 * runs * 0.020 * 0.99, (ended - started, spans)


def test_processes_share_one_device_s_memory(tmp_path):
    """A device's memory is physical: what one process holds there is not free to another,
    and comes back when that process ends."""
    import subprocess
    import sys

    config = {"timeline_dir": str(tmp_path / "timeline"), "memory_bytes": 1 << 20}
    env = omf.emulator_env(config=config)
    grab = (
        "import sys, acl; acl.init(); acl.rt.set_device(0); "
        "ptr, ret = acl.rt.malloc(700 << 10, 0); free, total, _ = acl.rt.get_mem_info(1); "
        "print(ret, free, flush=True); sys.stdin.readline(); ret == 0 and acl.rt.free(ptr); "
        "acl.rt.reset_device(0)"
    )

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", grab],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    holder = start()
    try:
        assert holder.stdout is not None and holder.stdout.readline().split()[0] == "0"
        second = start()
        out, _ = second.communicate("\n", timeout=60)
        code, free = (int(v) for v in out.split())
        assert code == 207001 and free < 400 << 10  # out of device memory: the first holds it
    finally:
        holder.communicate("\n", timeout=60)
    third = start()
    out, _ = third.communicate("\n", timeout=60)
    assert out.split()[0] == "0"  # given back when the first ended
