"""Tests that need an Ascend device: collected everywhere, run only where the real pyACL imports.

Point them at your own compiled models (any may be left out; its tests then skip, saying so):
  ASCEND_SERVE_OM_STATIC   a static-shape .om
  ASCEND_SERVE_OM_DYNAMIC  an .om compiled with --dynamic_batch_size
  ASCEND_SERVE_OM_AIPP     an .om compiled with static AIPP (--insert_op_conf, aipp_mode: static)
  ASCEND_SERVE_OM_DYNAMIC_AIPP         an .om compiled with aipp_mode: dynamic, and
  ASCEND_SERVE_OM_DYNAMIC_AIPP_CONFIG  a file with its aipp_* config parameters (docs/npu.md)
  ASCEND_SERVE_OM_IMAGE_SIZE      an .om compiled with --dynamic_image_size
  ASCEND_SERVE_OM_YUV_IMAGE_SIZE  the same with static AIPP from YUV420SP_U8 (src size 0)
  ASCEND_SERVE_OM_DIMS     an .om compiled with --dynamic_dims; best over two inputs whose
                           --input_shape lists them out of model order (e.g. "mask:1,-1;ids:1,-1")
  ASCEND_SERVE_OM_DIMS_INPUT_SHAPE  that --input_shape, where the gears fit several orders
  ASCEND_SERVE_OM_<KIND>_CONFIG   optional: text added to that kind's config.pbtxt
  ASCEND_SERVE_NPU_DEVICE  the device id to use (default 0)
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

EMULATOR = Path(__file__).resolve().parents[1] / "emulator"


def _real_acl() -> str:
    """'' when the real pyACL is importable, else why not (checked before any test puts the
    emulator on the import path)."""
    spec = importlib.util.find_spec("acl")
    if spec is None:
        return "pyACL (`import acl`) is not available: no Ascend CANN environment on this machine"
    if spec.origin and Path(spec.origin).resolve().is_relative_to(EMULATOR):
        return "`import acl` finds the test emulator, not the real pyACL"
    return ""


REASON = _real_acl()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not REASON:
        return
    skip = pytest.mark.skip(reason=f"Ascend hardware test: {REASON}")
    here = Path(__file__).resolve().parent
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(here):
            item.add_marker(skip)


@pytest.fixture
def device_id() -> int:
    return int(os.environ.get("ASCEND_SERVE_NPU_DEVICE", "0"))
