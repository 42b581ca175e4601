"""The only place that imports pyACL (`acl`, shipped with Huawei CANN, not on PyPI).

Imported on first use, so a server without CANN starts and serves its other models; only a
model that asks for the Ascend backend fails, with a message that says what to install.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from backends.base import BackendError

MISSING = ("the Ascend backend needs pyACL (the Python module 'acl'), which could not be "
           "imported: install the CANN toolkit on this machine and source its environment "
           "before starting the server, e.g. `source /usr/local/Ascend/ascend-toolkit/set_env.sh` "
           "({reason})")


def load() -> ModuleType:
    """The `acl` module, or a BackendError that tells the operator how to get it."""
    try:
        return importlib.import_module("acl")
    except ImportError as exc:
        raise BackendError(MISSING.format(reason=exc)) from None
