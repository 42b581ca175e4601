"""The only place that imports pyACL (`acl`, shipped with Huawei CANN, not on PyPI).

Imported on first use, so a server without CANN starts and serves its other models; only a
model that asks for the Ascend backend fails, with a message that says why from the real
import error: CANN missing, its `set_env.sh` not sourced, a library it needs not found, or a
Python version the installed CANN does not support.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

from backends.base import BackendError

# CANN 8.x lists Python 3.7 to 3.11 for pyACL (the range this diagnosis assumes).
SUPPORTED_PYTHON = ((3, 7), (3, 11))
# Where the toolkit installs by default (root, then a user install).
TOOLKIT_DIRS = ("/usr/local/Ascend/ascend-toolkit", "~/Ascend/ascend-toolkit")
ENV_MARKERS = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")

PREFIX = "the Ascend backend needs pyACL (the Python module 'acl'), which could not be imported: "


def diagnose(
    error: str, environ: Mapping[str, str], version: tuple[int, int], installed: str | None
) -> str:
    """Why `import acl` failed, and what to do, from the error text, the environment, the
    Python version and the toolkit directory found on disk (None when there is none)."""
    low, high = SUPPORTED_PYTHON
    env_home = next((environ[k] for k in ENV_MARKERS if environ.get(k)), "")
    python = f"{version[0]}.{version[1]}"
    if not low <= version <= high and (env_home or installed):
        return (
            PREFIX + f"this server runs Python {python}, and CANN 8.x supports Python "
            f"{low[0]}.{low[1]} to {high[0]}.{high[1]} only: run the server with a "
            f"supported Python ({error})"
        )
    if "cannot open shared object" in error or "undefined symbol" in error:
        where = env_home or installed or "the CANN toolkit"
        return (
            PREFIX + f"a library it needs did not load ({error}): source {where}/set_env.sh "
            "of the same CANN version in the shell that starts the server, so "
            "LD_LIBRARY_PATH holds its lib64 directories"
        )
    if not env_home and installed:
        return (
            PREFIX + f"CANN is installed at {installed} but its environment is not set: "
            f"run `source {installed}/set_env.sh` before starting the server ({error})"
        )
    if env_home:
        return (
            PREFIX + f"the CANN environment points at {env_home} but Python finds no 'acl' "
            f"there: check that {env_home}/python/site-packages is on PYTHONPATH (set_env.sh "
            f"of that version sets it) and that the toolkit is complete ({error})"
        )
    return (
        PREFIX + "CANN does not appear to be installed on this machine (no ASCEND_TOOLKIT_HOME"
        f" or ASCEND_HOME_PATH, no {TOOLKIT_DIRS[0]}): install the CANN toolkit and source "
        f"its environment before starting the server, e.g. `source {TOOLKIT_DIRS[0]}/"
        f"set_env.sh` ({error})"
    )


def _installed(dirs: Sequence[str] = TOOLKIT_DIRS) -> str | None:
    for path in dirs:
        expanded = Path(os.path.expanduser(path))
        if (expanded / "set_env.sh").is_file():
            return str(expanded)
    return None


def load() -> ModuleType:
    """The `acl` module, or a BackendError that tells the operator how to get it."""
    try:
        return importlib.import_module("acl")
    except ImportError as exc:
        raise BackendError(
            diagnose(str(exc), os.environ, sys.version_info[:2], _installed())
        ) from None
