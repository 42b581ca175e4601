"""The Ascend backend against the pyACL emulator: the real npu/ code, unchanged."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from backends.base import BackendError
from npu.backend import AscendBackend
from protocol.errors import InvalidArgument
from protocol.proto.model_config_pb2 import ModelConfig
from tests.support import om_fixtures as omf
from tests.support.npu_harness import InstanceThread, backend, prepare, rows

# -- the happy path ---------------------------------------------------------------------------


def test_load_execute_unload_leaves_nothing(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path))
    instance_thread.run(instance.load)
    assert instance.batch_gears == (1, 2, 4, 8)
    live = acl_emu._emu.stats()
    assert live["models"] == 1 and live["contexts"] == 1 and live["streams"] == 1
    assert live["datasets"] == 2 and live["data_buffers"] == 4  # INPUT0 + gear tensor, 2 outputs

    x = rows(3)
    out = instance_thread.run(instance.execute, {"INPUT0": x})
    np.testing.assert_array_equal(out["OUTPUT0"], x * 2 + 1)
    np.testing.assert_array_equal(out["OUTPUT1"], x.sum(axis=1, keepdims=True))
    assert out["OUTPUT0"].dtype == np.float32 and out["OUTPUT0"].shape == (3, 4)

    instance_thread.run(instance.unload)
    assert all(v == 0 for v in acl_emu._emu.stats().values()), acl_emu._emu.stats()


def test_no_device_allocation_per_request(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path))
    instance_thread.run(instance.load)
    before = acl_emu._emu.stats()
    for n in (1, 5, 8, 2):
        instance_thread.run(instance.execute, {"INPUT0": rows(n)})
    assert acl_emu._emu.stats() == before
    instance_thread.run(instance.unload)


@pytest.mark.parametrize("n, gear", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (7, 8), (8, 8)])
def test_batch_padded_to_smallest_gear_and_padding_dropped(
    acl_emu, tmp_path, instance_thread, n, gear
):
    instance = backend(prepare(tmp_path))
    instance_thread.run(instance.load)
    x = rows(n)
    out = instance_thread.run(instance.execute, {"INPUT0": x})
    seen = acl_emu._emu.last_execution(instance._model.model_id)
    assert seen["gear"] == gear
    device_input = seen["inputs"]["INPUT0"]
    assert device_input.shape == (gear, 4)
    np.testing.assert_array_equal(device_input[:n], x)  # rows in request order
    assert not device_input[n:].any()  # padding is zeros, not stale data
    np.testing.assert_array_equal(out["OUTPUT0"], x * 2 + 1)  # padded rows dropped
    instance_thread.run(instance.unload)


def test_rows_keep_their_order_across_batches(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path))
    instance_thread.run(instance.load)
    big = instance_thread.run(instance.execute, {"INPUT0": rows(8)})
    small = instance_thread.run(instance.execute, {"INPUT0": rows(3)[::-1]})  # non-contiguous
    np.testing.assert_array_equal(big["OUTPUT0"], rows(8) * 2 + 1)
    np.testing.assert_array_equal(small["OUTPUT0"], rows(3)[::-1] * 2 + 1)
    instance_thread.run(instance.unload)


def test_static_model_pads_to_its_compiled_batch(acl_emu, tmp_path, instance_thread):
    prepared = prepare(tmp_path, gears=None, static_batch=4)
    assert prepared[0].max_batch_size == 4
    assert list(prepared[0].input[0].dims) == [4]
    instance = backend(prepared)
    instance_thread.run(instance.load)
    assert instance.batch_gears == ()
    out = instance_thread.run(instance.execute, {"INPUT0": rows(3)})
    np.testing.assert_array_equal(out["OUTPUT0"], rows(3) * 2 + 1)
    assert acl_emu._emu.last_execution(instance._model.model_id)["gear"] is None
    instance_thread.run(instance.unload)


def test_static_model_without_batching(acl_emu, tmp_path, instance_thread):
    prepared = prepare(
        tmp_path,
        "max_batch_size: 0\ninput [{ name: 'INPUT0' dims: [2, 4] }]",
        gears=None,
        static_batch=2,
    )
    config = prepared[0]
    assert config.max_batch_size == 0
    assert [list(o.dims) for o in config.output] == [[2, 4], [2, 1]]
    instance = backend(prepared)
    instance_thread.run(instance.load)
    out = instance_thread.run(instance.execute, {"INPUT0": rows(2)})
    np.testing.assert_array_equal(out["OUTPUT0"], rows(2) * 2 + 1)
    with pytest.raises(InvalidArgument, match=r"shape \[3, 4\], the model takes \[2, 4\]"):
        instance_thread.run(instance.execute, {"INPUT0": rows(3)})
    instance_thread.run(instance.unload)


def test_fp16_model(acl_emu, tmp_path, instance_thread):
    prepared = prepare(tmp_path, dtype="FP16")
    config = prepared[0]
    assert (
        config.input[0].data_type
        == ModelConfig()
        .input.add()
        .DESCRIPTOR.fields_by_name["data_type"]
        .enum_type.values_by_name["TYPE_FP16"]
        .number
    )
    instance = backend(prepared)
    instance_thread.run(instance.load)
    x = rows(2).astype(np.float16)
    out = instance_thread.run(instance.execute, {"INPUT0": x})
    assert out["OUTPUT0"].dtype == np.float16 and out["OUTPUT1"].dtype == np.float32
    np.testing.assert_array_equal(out["OUTPUT0"], x * 2 + 1)
    instance_thread.run(instance.unload)


def two_input_model(path, **kwargs):
    return omf.write_om(
        path,
        inputs=[omf.tensor("A", "INT32", (-1, 3)), omf.tensor("B", "INT32", (-1, 3))],
        outputs=[omf.tensor("SUM", "INT32", (-1, 3))],
        gears=(4, 2),
        compute=[{"op": "add", "inputs": ["A", "B"], "output": "SUM"}],
        **kwargs,
    )


def test_model_with_two_inputs(acl_emu, tmp_path, instance_thread):
    prepared = prepare(tmp_path, om=two_input_model)
    assert [i.name for i in prepared[0].input] == ["A", "B"]
    instance = backend(prepared)
    instance_thread.run(instance.load)
    a = np.arange(9, dtype=np.int32).reshape(3, 3)
    out = instance_thread.run(instance.execute, {"B": a * 10, "A": a})
    np.testing.assert_array_equal(out["SUM"], a * 11)
    with pytest.raises(InvalidArgument, match="input 'B' has 2 rows, other inputs 3"):
        instance_thread.run(instance.execute, {"A": a, "B": a[:2]})
    with pytest.raises(BackendError, match="missing input 'B'"):
        instance_thread.run(instance.execute, {"A": a})
    instance_thread.run(instance.unload)


def test_execute_from_another_thread_rebinds_the_context(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path))
    instance_thread.run(instance.load)
    out = instance.execute({"INPUT0": rows(2)})  # this (test) thread has no context of its own
    np.testing.assert_array_equal(out["OUTPUT0"], rows(2) * 2 + 1)
    instance_thread.run(instance.unload)


def test_device_mode_copies_device_to_device(acl_emu, tmp_path, instance_thread):
    acl_emu._emu.configure(run_mode=0)
    instance = backend(prepare(tmp_path))
    instance_thread.run(instance.load)
    assert instance._session.h2d == 3
    out = instance_thread.run(instance.execute, {"INPUT0": rows(2)})
    np.testing.assert_array_equal(out["OUTPUT0"], rows(2) * 2 + 1)
    instance_thread.run(instance.unload)


def test_acl_init_once_and_already_initialised_is_fine(acl_emu, tmp_path, instance_thread):
    assert acl_emu.init() == 0  # someone else in the process initialised first
    prepared = prepare(tmp_path)
    first, second = backend(prepared, index=0), backend(prepared, index=1)
    instance_thread.run(first.load)
    instance_thread.run(second.load)
    assert acl_emu.init() == 100002
    instance_thread.run(first.unload)
    instance_thread.run(second.unload)


def test_two_instances_on_two_devices_run_concurrently(acl_emu, tmp_path):
    """Serialised, two 1 s executions take at least 2 s of the emulator's device time; side by
    side about 1 s. The bound sits just under the serialised floor, so a slow or busy machine
    does not fail it (the old 0.35 s bound for two 0.2 s runs did)."""
    execution_s = 1.0
    prepared = prepare(tmp_path, latency_ms={"fixed": execution_s * 1000})
    threads = [InstanceThread(f"npu{d}") for d in (0, 1)]
    instances = [backend(prepared, device=d, index=d) for d in (0, 1)]
    try:
        for thread, instance in zip(threads, instances, strict=False):
            thread.run(instance.load)
        assert [i._session.device_id for i in instances] == [0, 1]
        start = time.monotonic()
        futures = [
            t.submit(i.execute, {"INPUT0": rows(2)})
            for t, i in zip(threads, instances, strict=False)
        ]
        results = [f.result() for f in futures]
        elapsed = time.monotonic() - start
        assert elapsed < 1.9 * execution_s, f"instances serialised: {elapsed:.3f} s"
        for result in results:
            np.testing.assert_array_equal(result["OUTPUT0"], rows(2) * 2 + 1)
        for thread, instance in zip(threads, instances, strict=False):
            thread.run(instance.unload)
    finally:
        for thread in threads:
            thread.close()


# -- auto-complete ----------------------------------------------------------------------------


def test_auto_complete_from_the_model_description(acl_emu, tmp_path):
    config, _, _ = prepare(tmp_path)
    assert config.max_batch_size == 8
    assert config.parameters["batch_gears"].string_value == "1,2,4,8"
    assert [(i.name, list(i.dims)) for i in config.input] == [("INPUT0", [4])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("OUTPUT0", [4]), ("OUTPUT1", [1])]
    fp32 = (
        ModelConfig.DESCRIPTOR.fields_by_name["input"]
        .message_type.fields_by_name["data_type"]
        .enum_type.values_by_name["TYPE_FP32"]
        .number
    )
    assert {t.data_type for t in list(config.input) + list(config.output)} == {fp32}
    assert "ascend_mbatch_shape_data" not in [i.name for i in config.input]
    # The probe ran on its own thread: this thread holds no context, nothing is left behind.
    assert acl_emu.rt.get_context() == (0, 107002)
    assert acl_emu._emu.stats()["device_refs"] == 0


def test_dims_reported_at_the_largest_gear(acl_emu, tmp_path, instance_thread):
    acl_emu._emu.configure(dims_show_max_gear=True)  # some CANN versions report [8, 4], not [-1, 4]
    prepared = prepare(tmp_path)
    assert [list(i.dims) for i in prepared[0].input] == [[4]]
    instance = backend(prepared)
    instance_thread.run(instance.load)
    out = instance_thread.run(instance.execute, {"INPUT0": rows(3)})
    np.testing.assert_array_equal(out["OUTPUT0"], rows(3) * 2 + 1)
    instance_thread.run(instance.unload)


def test_auto_complete_respects_the_config(acl_emu, tmp_path):
    config, _, _ = prepare(tmp_path, "max_batch_size: 4\noutput [{ name: 'OUTPUT1' }]")
    assert config.max_batch_size == 4
    assert [o.name for o in config.output] == ["OUTPUT1"]
    assert list(config.output[0].dims) == [1]
    assert [i.name for i in config.input] == ["INPUT0"]


def test_auto_complete_reads_on_the_device_from_instance_group(acl_emu, tmp_path):
    acl_emu._emu.lose_device(0)  # device 0 would fail; the config names device 1
    config, _, _ = prepare(tmp_path, "instance_group [{ kind: KIND_GPU, gpus: [1] }]")
    assert config.max_batch_size == 8


def test_config_listing_raw_atc_output_names_is_accepted(acl_emu, tmp_path, instance_thread):
    raw = omf.atc_output_name("OUTPUT0", 0)
    prepared = prepare(tmp_path, f"output [{{ name: '{raw}' }}]")
    instance = backend(prepared)
    instance_thread.run(instance.load)
    out = instance_thread.run(instance.execute, {"INPUT0": rows(1)})
    assert list(out) == [raw]
    instance_thread.run(instance.unload)


# -- every error path gives a clear error -----------------------------------------------------


def test_missing_acl_module(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "acl", None)
    config, model_dir, version_dir = prepare(tmp_path, complete=False)
    with pytest.raises(BackendError, match="install the CANN toolkit.*set_env.sh") as info:
        AscendBackend.auto_complete(config, model_dir, version_dir)
    assert not info.value.fatal
    instance = backend((config, model_dir, version_dir))
    with pytest.raises(BackendError, match=r"pyACL \(the Python module 'acl'\)"):
        instance.load()
    instance.unload()  # nothing to release, and no error
    from npu.telemetry import npu_collector

    assert list(npu_collector().collect()) == []


def test_missing_model_file(acl_emu, tmp_path, instance_thread):
    config, model_dir, version_dir = prepare(tmp_path)
    (version_dir / "model.om").unlink()
    with pytest.raises(BackendError, match=r"model file .*model\.om does not exist"):
        AscendBackend.auto_complete(config, model_dir, version_dir)
    with pytest.raises(BackendError, match=r"model file .*model\.om does not exist"):
        instance_thread.run(backend((config, model_dir, version_dir)).load)


def test_corrupt_model_file(acl_emu, tmp_path, instance_thread):
    config, model_dir, version_dir = prepare(tmp_path)
    (version_dir / "model.om").write_bytes(b"\x00IMOD not a model")
    instance = backend((config, model_dir, version_dir))
    with pytest.raises(BackendError) as info:
        instance_thread.run(instance.load)
    message = info.value.message
    assert "acl.mdl.load_from_file" in message and "145000" in message
    assert "ACL_ERROR_GE_PARAM_INVALID" in message and "not a valid om file" in message


def test_out_of_device_memory_for_io_buffers(acl_emu, tmp_path, instance_thread):
    acl_emu._emu.configure(memory_bytes=8192 + 64 + 200)  # weights fit, IO buffers do not all
    instance = backend(
        prepare(tmp_path, features=16, complete=False, weight_size=4096, work_size=4096),
    )
    with pytest.raises(BackendError) as info:
        instance_thread.run(instance.load)
    assert "acl.rt.malloc" in info.value.message and "207001" in info.value.message
    assert "out of device memory" in info.value.message and not info.value.fatal
    assert all(v == 0 for v in acl_emu._emu.stats().values())


def test_out_of_device_memory_for_weights(acl_emu, tmp_path, instance_thread):
    acl_emu._emu.configure(memory_bytes=4096)
    instance = backend(prepare(tmp_path, complete=False, weight_size=1 << 20))
    with pytest.raises(
        BackendError,
        match=r"acl\.mdl\.load_from_file.* 245000 .*out of device "
        r"memory",
    ):
        instance_thread.run(instance.load)


def test_gear_rejected_by_the_runtime(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path))
    instance_thread.run(instance.load)
    acl_emu._emu.inject("mdl.set_dynamic_batch_size", 145013)
    with pytest.raises(BackendError) as info:
        instance_thread.run(instance.execute, {"INPUT0": rows(3)})
    assert info.value.message.startswith(
        "acl.mdl.set_dynamic_batch_size(4) failed with error 145013 "
        "(ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID: batch size is not one of the compiled gears)"
    )
    assert not info.value.fatal and instance.healthy()
    instance_thread.run(instance.execute, {"INPUT0": rows(3)})
    instance_thread.run(instance.unload)


def test_batch_larger_than_the_largest_gear(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path))
    instance_thread.run(instance.load)
    with pytest.raises(InvalidArgument, match=r"batch of 9 rows does not fit .*\[1, 2, 4, 8\]"):
        instance_thread.run(instance.execute, {"INPUT0": rows(9)})
    assert instance.healthy()
    instance_thread.run(instance.unload)


def test_config_max_batch_size_above_the_largest_gear(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path, "max_batch_size: 16"))
    with pytest.raises(BackendError, match="max_batch_size 16 exceeds the model's largest gear 8"):
        instance_thread.run(instance.load)


@pytest.mark.parametrize(
    "text, error",
    [
        (
            "input [{ name: 'IMAGE' data_type: TYPE_FP32 dims: [4] }]",
            r"config input 'IMAGE' is not an input of the model \(model inputs: INPUT0\)",
        ),
        (
            "input [{ name: 'INPUT0' data_type: TYPE_INT32 dims: [4] }]",
            "input 'INPUT0': the config says TYPE_INT32, the model has TYPE_FP32",
        ),
        (
            "input [{ name: 'INPUT0' data_type: TYPE_FP32 dims: [5] }]",
            r"input 'INPUT0': the config says dims \[5\], the model has \[4\]",
        ),
        ("output [{ name: 'LOGITS' }]", "config output 'LOGITS' is not an output of the model"),
    ],
)
def test_config_that_disagrees_with_the_model(acl_emu, tmp_path, instance_thread, text, error):
    instance = backend(prepare(tmp_path, "max_batch_size: 8\n" + text))
    with pytest.raises(BackendError, match=error):
        instance_thread.run(instance.load)


def test_execute_failure_fails_only_that_batch(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path, poison={"value": -7.0, "code": 507011}))
    instance_thread.run(instance.load)
    bad = rows(2)
    bad[1, 0] = -7.0
    with pytest.raises(BackendError) as info:
        instance_thread.run(instance.execute, {"INPUT0": bad})
    assert info.value.message.startswith(
        "acl.rt.synchronize_stream_with_timeout failed with error 507011 "
        "(ACL_ERROR_RT_MODEL_EXECUTE: model execution failed): model"
    )
    assert not info.value.fatal and instance.healthy()
    out = instance_thread.run(instance.execute, {"INPUT0": rows(2)})
    np.testing.assert_array_equal(out["OUTPUT0"], rows(2) * 2 + 1)
    instance_thread.run(instance.unload)


def test_injected_execute_async_failure(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path))
    instance_thread.run(instance.load)
    acl_emu._emu.inject("mdl.execute_async", 507011)
    with pytest.raises(BackendError, match=r"acl\.mdl\.execute_async failed with error 507011"):
        instance_thread.run(instance.execute, {"INPUT0": rows(1)})
    assert instance.healthy()
    instance_thread.run(instance.execute, {"INPUT0": rows(1)})
    instance_thread.run(instance.unload)


@pytest.mark.parametrize("how", ["lose_device", "poison"])
def test_device_fault_takes_the_instance_out_of_service(acl_emu, tmp_path, instance_thread, how):
    prepared = prepare(tmp_path, poison={"value": -9.0, "code": 507010})
    instance = backend(prepared)
    instance_thread.run(instance.load)
    x = rows(2)
    if how == "lose_device":
        acl_emu._emu.lose_device(0)
    elif how == "poison":
        x[0, 0] = -9.0
    with pytest.raises(BackendError) as info:
        instance_thread.run(instance.execute, {"INPUT0": x})
    assert info.value.fatal and not instance.healthy()
    assert "507010" in info.value.message and "ACL_ERROR_RT_LOST_HEARTBEAT" in info.value.message
    with pytest.raises(BackendError, match="out of service after a device fault") as again:
        instance_thread.run(instance.execute, {"INPUT0": rows(1)})
    assert again.value.fatal
    instance_thread.run(instance.unload)  # teardown still releases everything


def test_device_fault_on_one_device_leaves_the_other_serving(acl_emu, tmp_path):
    prepared = prepare(tmp_path)
    threads = [InstanceThread(f"npu{d}") for d in (0, 1)]
    instances = [backend(prepared, device=d, index=d) for d in (0, 1)]
    try:
        for thread, instance in zip(threads, instances, strict=False):
            thread.run(instance.load)
        acl_emu._emu.lose_device(0)
        with pytest.raises(BackendError):
            threads[0].run(instances[0].execute, {"INPUT0": rows(1)})
        out = threads[1].run(instances[1].execute, {"INPUT0": rows(1)})
        np.testing.assert_array_equal(out["OUTPUT0"], rows(1) * 2 + 1)
        assert [i.healthy() for i in instances] == [False, True]
        for thread, instance in zip(threads, instances, strict=False):
            thread.run(instance.unload)
    finally:
        for thread in threads:
            thread.close()


def test_set_device_failure_on_a_broken_device(acl_emu, tmp_path, instance_thread):
    prepared = prepare(tmp_path)
    acl_emu._emu.lose_device(1)
    with pytest.raises(BackendError, match=r"acl\.rt\.set_device\(1\) failed with error 507033"):
        instance_thread.run(backend(prepared, device=1).load)


def test_invalid_device_id(acl_emu, tmp_path, instance_thread):
    # Named before set_device (whose 107001 says only "invalid device id"): tests/unit/npu/
    # test_devices.py has the whole message.
    with pytest.raises(BackendError, match=r"NPU 5 does not exist"):
        instance_thread.run(backend(prepare(tmp_path), device=5).load)


def test_teardown_failure_is_logged_not_leaked(acl_emu, tmp_path, instance_thread, caplog):
    instance = backend(prepare(tmp_path))
    instance_thread.run(instance.load)
    acl_emu._emu.inject("mdl.unload", 500002)
    instance_thread.run(instance.unload)
    assert "acl.mdl.unload failed with error 500002" in caplog.text
    # The model really stayed loaded in the emulator; the device reset reported it.
    violations = acl_emu._emu.violations()
    assert any("loaded model" in v for v in violations)
    acl_emu._emu.reset()  # this test leaked on purpose
