"""The Ascend backend's life around the model: the ordered teardown at exit (with an execution
still in flight), error names and the `import acl` diagnosis, and the hardware behaviours the
emulator reproduces (memcpy kind, wrong SoC, AI Core exceptions, slow loads)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from backends.base import BackendError
from npu import acl as npu_acl
from npu import device, errors, teardown
from tests.support import om_fixtures as omf
from tests.support.npu_harness import backend, prepare, rows


# -- 5. teardown ------------------------------------------------------------------------------
def _execute_in_background(instance_thread, instance, x):
    """Start one execution on the instance's thread; return once it waits on the device."""
    future = instance_thread.submit(instance.execute, {"INPUT0": x})
    for _ in range(200):
        if instance._session is not None and not instance._session.lock.acquire(blocking=False):
            return future
        instance._session.lock.release()
        threading.Event().wait(0.01)
    raise AssertionError("the execution never started")


def test_exit_waits_for_the_execution_then_releases_and_finalizes(
    acl_emu, tmp_path, instance_thread
):
    instance = backend(prepare(tmp_path, latency_ms={"fixed": 400}))
    instance_thread.run(instance.load)
    future = _execute_in_background(instance_thread, instance, rows(2))
    assert teardown.shutdown(wait_s=30) is True  # instances never unloaded: exit does it
    np.testing.assert_array_equal(future.result()["OUTPUT0"], rows(2) * 2 + 1)
    assert acl_emu._emu.violations() == []  # finalize did not run under the waiting thread
    assert acl_emu._emu.stats()["models"] == 0 and acl_emu._emu.stats()["device_refs"] == 0
    assert device.open_sessions() == []
    with pytest.raises(BackendError, match="shutting down"):
        instance_thread.run(instance.execute, {"INPUT0": rows(1)})
    instance_thread.run(instance.unload)  # the instance's own unload after exit: a no-op


def test_exit_skips_finalize_while_an_execution_outlives_the_wait(
    acl_emu, tmp_path, instance_thread
):
    instance = backend(prepare(tmp_path, latency_ms={"fixed": 600}))
    instance_thread.run(instance.load)
    future = _execute_in_background(instance_thread, instance, rows(1))
    assert teardown.shutdown(wait_s=0.05) is False
    assert acl_emu._emu.violations() == []
    future.result()  # the execution still finishes normally
    with pytest.raises(BackendError, match="shutting down"):
        instance_thread.run(instance.execute, {"INPUT0": rows(1)})
    instance_thread.run(instance.unload)


def test_exit_wait_is_a_setting(monkeypatch):
    assert teardown.exit_wait_s() == teardown.DEFAULT_EXIT_WAIT_S
    monkeypatch.setenv(teardown.EXIT_WAIT_ENV, "1.5")
    assert teardown.exit_wait_s() == 1.5


# -- 6. errors --------------------------------------------------------------------------------
def test_device_oom_has_the_header_spelling():
    assert errors.describe(207018) == "ACL_ERROR_RT_DEVICE_OOM: device out of memory"


@pytest.mark.parametrize(
    "error, environ, version, installed, expected",
    [
        (
            "No module named 'acl'",
            {},
            (3, 11),
            None,
            "CANN does not appear to be installed.*install the CANN toolkit",
        ),
        (
            "No module named 'acl'",
            {},
            (3, 10),
            "/usr/local/Ascend/ascend-toolkit",
            r"installed at /usr/local/Ascend/ascend-toolkit but its environment is not set: run "
            r"`source /usr/local/Ascend/ascend-toolkit/set_env.sh`",
        ),
        (
            "No module named 'acl'",
            {"ASCEND_TOOLKIT_HOME": "/opt/cann"},
            (3, 12),
            None,
            r"Python 3\.12, and CANN 8\.x supports Python 3\.7 to 3\.11 only",
        ),
        (
            "libascendcl.so: cannot open shared object file",
            {"ASCEND_HOME_PATH": "/opt/cann"},
            (3, 9),
            None,
            r"a library it needs did not load.*source /opt/cann/set_env.sh",
        ),
        (
            "No module named 'acl'",
            {"ASCEND_TOOLKIT_HOME": "/opt/cann"},
            (3, 9),
            None,
            r"points at /opt/cann but Python finds no 'acl'.*PYTHONPATH",
        ),
    ],
)
def test_import_failure_says_why(error, environ, version, installed, expected):
    message = npu_acl.diagnose(error, environ, version, installed)
    assert message.startswith(npu_acl.PREFIX)
    assert pytest.importorskip("re").search(expected, message), message
    if "not appear" not in expected:
        assert "install the CANN toolkit" not in message


# -- 7. what hardware does ---------------------------------------------------------------------
@pytest.mark.parametrize("reserved", [True, False])
def test_memcpy_kinds_work_with_and_without_reserved_kind(
    acl_emu, tmp_path, instance_thread, reserved
):
    acl_emu._emu.configure(memcpy_kind_reserved=reserved)
    instance = backend(prepare(tmp_path))
    instance_thread.run(instance.load)
    out = instance_thread.run(instance.execute, {"INPUT0": rows(3)})
    np.testing.assert_array_equal(out["OUTPUT0"], rows(3) * 2 + 1)
    instance_thread.run(instance.unload)


def test_an_om_for_another_soc_is_refused_at_load(acl_emu, tmp_path, instance_thread):
    prepared = prepare(
        tmp_path,
        om=omf.with_fields(omf.scale_model, soc="Ascend910B1"),
        complete=False,
        text="max_batch_size: 8",
    )
    with pytest.raises(
        BackendError,
        match=r"load_from_file.* failed with error 545001 .*compiled "
        r"for Ascend910B1.*--soc_version=Ascend310P3",
    ):
        instance_thread.run(backend(prepared).load)


def test_an_ai_core_exception_rebuilds_the_instance(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path, poison={"value": -5.0, "code": 507015}))
    instance_thread.run(instance.load)
    first_model = instance._model.model_id
    x = rows(2)
    x[1, 0] = -5.0
    with pytest.raises(BackendError, match="507015 .*ACL_ERROR_RT_AICORE_EXCEPTION") as info:
        instance_thread.run(instance.execute, {"INPUT0": x})
    assert not info.value.fatal and instance.healthy()
    out = instance_thread.run(instance.execute, {"INPUT0": rows(2)})  # a new stream and copy
    np.testing.assert_array_equal(out["OUTPUT0"], rows(2) * 2 + 1)
    assert instance._model.model_id != first_model
    instance_thread.run(instance.unload)


def test_a_broken_stream_fails_every_later_execution(acl_emu, tmp_path):
    """What the rebuild above is for: the emulator keeps a stream broken after 507015."""
    acl = acl_emu
    from npu.device import DeviceSession
    from npu.om_model import OmModel

    session = DeviceSession.open(acl, 0)
    model = OmModel.load(
        session, omf.scale_model(tmp_path / "m.om", poison={"value": -5.0, "code": 507015})
    )
    bad = rows(1)
    bad[0, 0] = -5.0
    for x in (bad, rows(1)):
        with pytest.raises(BackendError, match="507015"):
            model.run([x], 1)
    assert model.close() == [] and session.close() == []


def test_a_slow_load_completes(acl_emu, tmp_path, instance_thread):
    instance = backend(prepare(tmp_path, om=omf.with_fields(omf.scale_model, load_ms=300)))
    instance_thread.run(instance.load)
    assert instance_thread.run(instance.execute, {"INPUT0": rows(1)})["OUTPUT1"][0, 0] == 10
    instance_thread.run(instance.unload)
