"""Where the hardware tests find the user's compiled models."""

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
