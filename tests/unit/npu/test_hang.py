"""A hung NPU (issue 29 item 5): an execution that never finishes must not hold its instance
forever. The emulator's hang poison makes an execution never end; the instance waits with
synchronize_stream_with_timeout, answers UNAVAILABLE, and stays out of service without
touching the stuck stream again. Also: an AI Core exception whose rebuild fails."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from backends.base import BackendError
from npu import deadline, device, teardown
from npu.errors import ExecutionHung
from protocol.errors import Unavailable
from tests.support.npu_harness import backend, prepare, rows

HANG = -3.0  # an input holding this never finishes on the device
TIMEOUT = 'parameters { key: "execution_timeout_ms" value { string_value: "300" } }\n'


def hung_rows(n: int) -> np.ndarray:
    x = rows(n)
    x[0, 0] = HANG
    return x


def test_a_hung_execution_answers_unavailable_and_leaves_service(
    acl_emu, tmp_path, instance_thread, caplog
):
    instance = backend(prepare(tmp_path, TIMEOUT, poison={"value": HANG, "hang": True}))
    instance_thread.run(instance.load)
    np.testing.assert_array_equal(
        instance_thread.run(instance.execute, {"INPUT0": rows(2)})["OUTPUT0"], rows(2) * 2 + 1
    )
    before = deadline.timeout_counts().get(("m", 0), 0)
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="npu.backend"):
        with pytest.raises(ExecutionHung) as info:
            instance_thread.run(instance.execute, {"INPUT0": hung_rows(2)})
    assert time.monotonic() - started < 30  # about the 300 ms timeout, not forever
    assert isinstance(info.value, Unavailable)  # 503 / UNAVAILABLE to the client
    message = str(info.value)
    assert "did not finish within 300 ms (parameter execution_timeout_ms)" in message
    assert "507046" in message and "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT" in message
    assert "taken out of service: an execution did not finish within 300 ms" in caplog.text
    assert acl_emu._emu.hung() == 1
    assert not instance.healthy()
    assert deadline.timeout_counts()[("m", 0)] == before + 1
    # No more work reaches the stuck stream.
    with pytest.raises(BackendError, match="out of service after a device fault") as again:
        instance_thread.run(instance.execute, {"INPUT0": rows(1)})
    assert again.value.fatal
    # Unloading leaves the stuck stream and the busy model alone (destroying either would wait
    # for the execution on hardware), and the exit teardown skips them and acl.finalize.
    instance_thread.run(instance.unload)
    assert teardown.shutdown(wait_s=1) is False
    assert acl_emu._emu.violations() == []
    acl_emu._emu.release_hangs()
    acl_emu._emu.reset()  # the process ends: the driver reclaims what was left


def test_a_hung_device_fails_its_other_instances_too(acl_emu, tmp_path, instance_thread):
    """The hung execution keeps the device: another instance there times out as well, while an
    instance on another NPU keeps serving."""
    prepared = prepare(tmp_path, TIMEOUT, poison={"value": HANG, "hang": True})
    first, second, elsewhere = backend(prepared), backend(prepared, index=1), None
    elsewhere = backend(prepared, device=1, index=2)
    from tests.support.npu_harness import InstanceThread

    threads = [instance_thread, InstanceThread("second"), InstanceThread("elsewhere")]
    try:
        for thread, instance in zip(threads, (first, second, elsewhere), strict=True):
            thread.run(instance.load)
        with pytest.raises(ExecutionHung):
            threads[0].run(first.execute, {"INPUT0": hung_rows(1)})
        with pytest.raises(ExecutionHung, match="did not finish within 300 ms"):
            threads[1].run(second.execute, {"INPUT0": rows(1)})
        assert not first.healthy() and not second.healthy() and elsewhere.healthy()
        out = threads[2].run(elsewhere.execute, {"INPUT0": rows(3)})
        np.testing.assert_array_equal(out["OUTPUT0"], rows(3) * 2 + 1)
        for thread, instance in zip(threads, (first, second, elsewhere), strict=True):
            thread.run(instance.unload)
        assert acl_emu._emu.violations() == []
        assert [s.device_id for s in device.open_sessions()] == [0, 0]  # left to the driver
    finally:
        for thread in threads[1:]:
            thread.close()
    acl_emu._emu.release_hangs()
    acl_emu._emu.reset()


def test_the_derived_timeout_follows_the_slowest_execution():
    watch = deadline.ExecutionDeadline()
    assert watch.timeout_ms() == deadline.FIRST_TIMEOUT_MS
    watch.observe(0.010)
    assert watch.timeout_ms() == deadline.TIMEOUT_FLOOR_MS  # 20 x 10 ms is under the floor
    watch.observe(2.0)
    watch.observe(0.5)  # a faster one does not lower it
    assert watch.timeout_ms() == int(deadline.TIMEOUT_FACTOR * 2000)
    assert "derived" in watch.describe() and "2000.0 ms" in watch.describe()
    assert deadline.ExecutionDeadline(1500).timeout_ms() == 1500


def test_an_unreadable_timeout_refuses_the_instance(acl_emu, tmp_path):
    text = 'parameters { key: "execution_timeout_ms" value { string_value: "soon" } }\n'
    instance = backend(prepare(tmp_path, text))
    with pytest.raises(BackendError, match="'execution_timeout_ms' must be a whole number"):
        instance.load()
    assert acl_emu._emu.stats()["models"] == 0  # refused before anything was loaded


def test_an_older_binding_waits_without_a_timeout_and_says_so_once(
    acl_emu, tmp_path, instance_thread, caplog, monkeypatch
):
    monkeypatch.setattr(device, "_warned_no_timeout", False)
    acl_emu._emu.reset(sync_with_timeout=False)
    instance = backend(prepare(tmp_path))
    instance_thread.run(instance.load)
    with caplog.at_level(logging.WARNING, logger="npu.device"):
        for n in (1, 2):
            out = instance_thread.run(instance.execute, {"INPUT0": rows(n)})
            np.testing.assert_array_equal(out["OUTPUT0"], rows(n) * 2 + 1)
    warnings = [r for r in caplog.records if "synchronize_stream_with_timeout" in r.message]
    assert len(warnings) == 1 and "without a timeout" in warnings[0].message
    instance_thread.run(instance.unload)


def test_an_ai_core_exception_whose_rebuild_fails_leaves_service(
    acl_emu, tmp_path, instance_thread
):
    """Recovery after 507015 recreates the stream and model; when that fails too (here the new
    stream cannot be made), the instance is out of service and says both reasons."""
    instance = backend(prepare(tmp_path, poison={"value": -5.0, "code": 507015}))
    instance_thread.run(instance.load)
    acl_emu._emu.inject("rt.create_stream", 207001)  # the rebuild's new stream
    x = rows(2)
    x[1, 0] = -5.0
    with pytest.raises(BackendError) as info:
        instance_thread.run(instance.execute, {"INPUT0": x})
    message = info.value.message
    assert info.value.fatal and not instance.healthy()
    assert "507015" in message and "ACL_ERROR_RT_AICORE_EXCEPTION" in message
    with pytest.raises(BackendError, match="recreating the instance failed: .*207001"):
        instance_thread.run(instance.execute, {"INPUT0": rows(1)})
    instance_thread.run(instance.unload)


@pytest.mark.parametrize("value", ["-1", "2147483648", "1.5", "inf"])
def test_an_out_of_range_timeout_refuses_the_config(tmp_path, value):
    from repository.config import ConfigError, normalize, parse_config_text

    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    text = (
        'backend: "ascend"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f'parameters {{ key: "execution_timeout_ms" value {{ string_value: "{value}" }} }}\n'
    )
    config = parse_config_text(text, model_dir / "config.pbtxt")
    with pytest.raises(ConfigError, match="parameter 'execution_timeout_ms'.*must be"):
        normalize(config, "m", model_dir, [], auto_complete=False)
