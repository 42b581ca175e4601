"""On an Atlas box: what the hung-NPU handling (npu/deadline.py, docs/npu.md "A hung NPU")
stands on, which the emulator can only assume. A real device cannot be made to hang on
purpose, so this gives a real execution a timeout shorter than it takes:

- the binding has `acl.rt.synchronize_stream_with_timeout` (else the fallback without a
  timeout is in use: skipped, saying so);
- a timeout shorter than the execution returns 507046 (ACL_ERROR_RT_STREAM_SYNC_TIMEOUT), and
  the instance answers UNAVAILABLE and leaves service;
- once the work has finished, the stream synchronises and everything releases normally (so a
  stream that only ran late, unlike a hung one, would not need its process to end).
"""

from __future__ import annotations

import time

import pytest

from backends.base import InstanceSpec
from npu import acl as npu_acl
from npu.backend import AscendBackend
from npu.errors import ExecutionHung
from tests.npu.hardware.test_hardware import _model_dir, _zeros


def test_a_timeout_shorter_than_the_execution_returns_507046(tmp_path, device_id):
    acl = npu_acl.load()
    if getattr(acl.rt, "synchronize_stream_with_timeout", None) is None:
        pytest.skip(
            "this pyACL has no acl.rt.synchronize_stream_with_timeout: executions wait "
            "without a timeout (a hung NPU holds its instances)"
        )
    config, model_dir, version_dir = _model_dir(tmp_path, "dynamic", device_id)
    instance = AscendBackend(
        config, model_dir, version_dir, InstanceSpec("m_0", "KIND_GPU", device_id, 0)
    )
    instance.load()
    largest = max(instance._model.info.batch_sizes)
    inputs = {e.name: _zeros(config, [largest, *e.dims], e.name) for e in config.input}
    for _ in range(3):
        instance.execute(inputs)
    slowest_ms = (instance._deadline.slowest_s or 0.0) * 1000.0
    if slowest_ms < 5.0:
        instance.unload()
        pytest.skip(f"the largest gear runs in {slowest_ms:.2f} ms: too fast to time out at 1 ms")
    instance._deadline.fixed_ms = 1
    with pytest.raises(ExecutionHung, match="507046"):
        instance.execute(inputs)
    assert not instance.healthy()
    session = instance._session
    assert session is not None and session.abandoned
    time.sleep(10 * slowest_ms / 1000.0 + 1.0)  # the execution itself finishes meanwhile
    assert acl.rt.synchronize_stream(session.stream) == 0
    # Not hung after all: release what the instance left, which must now succeed.
    instance._abandoned = session.abandoned = False
    instance.unload()
