"""Where the hardware tests find the user's compiled models, and the config text some need."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def om_path(kind: str) -> Path:
    variable = f"ASCEND_SERVE_OM_{kind.upper()}"
    value = os.environ.get(variable)
    if not value:
        pytest.skip(f"set {variable} to a {kind} .om file to run this test")
    path = Path(value)
    if not path.is_file():
        pytest.fail(f"{variable}={value} is not a file")
    return path


def config_text(kind: str) -> str:
    """Text added to the model's config.pbtxt: ASCEND_SERVE_OM_<KIND>_CONFIG names a file (a
    dynamic-AIPP model needs its aipp_* parameters there)."""
    variable = f"ASCEND_SERVE_OM_{kind.upper()}_CONFIG"
    value = os.environ.get(variable)
    if not value:
        if kind == "dynamic_aipp":
            pytest.skip(f"set {variable} to a file with the model's aipp_* parameters")
        return ""
    path = Path(value)
    if not path.is_file():
        pytest.fail(f"{variable}={value} is not a file")
    return path.read_text()
