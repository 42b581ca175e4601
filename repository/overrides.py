"""Private model directories built from a load request's `file:<version>/<path>` contents.

The bytes come from the network, so every path is checked before anything is written: relative,
no `..`, `.` or empty components, no NUL or backslash, and it must stay inside the fresh
directory even after resolving. Writing never follows a symlink (O_NOFOLLOW on the file, lstat
on every parent), so nothing lands outside the directory whatever is already in it.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)

PREFIX = "ascend-serve-override-"


class OverrideError(Exception):
    """A file override the server refuses; nothing was written."""


def checked_path(key: str) -> PurePosixPath:
    """The relative path named by an override key (`1/model.onnx`), or OverrideError."""
    if not key or "\x00" in key or "\\" in key:
        raise OverrideError(f"invalid file override path '{key!r}'")
    path = PurePosixPath(key)
    if path.is_absolute() or key.startswith("/"):
        raise OverrideError(f"file override path '{key}' must be relative to the model directory")
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise OverrideError(
            f"file override path '{key}' escapes or is not a plain path inside the model directory"
        )
    return path


def _make_parents(root: Path, relative: PurePosixPath) -> Path:
    """Create the parent directories of `relative` under `root`, refusing symlinks."""
    current = root
    for part in relative.parts[:-1]:
        current = current / part
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            info = os.lstat(current)
            if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
                raise OverrideError(
                    f"file override path '{relative}' goes through '{part}', "
                    f"which is not a directory"
                ) from None
    return current


def write_files(root: Path, files: Mapping[str, bytes]) -> None:
    """Write every override under `root` (which must exist). Checks all paths first."""
    checked = {key: checked_path(key) for key in files}
    real_root = root.resolve(strict=True)
    for key, relative in checked.items():
        target = real_root.joinpath(*relative.parts)
        if real_root not in target.resolve(strict=False).parents:
            raise OverrideError(f"file override path '{key}' escapes the model directory")
    for key, relative in checked.items():
        parent = _make_parents(real_root, relative)
        target = parent / relative.name
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(target, flags, 0o600)
        except FileExistsError:
            raise OverrideError(
                f"file override path '{key}' is given twice or collides with a directory"
            ) from None
        with os.fdopen(fd, "wb") as handle:
            handle.write(files[key])


def create_override_directory(files: Mapping[str, bytes]) -> Path:
    """A fresh private directory (0700) holding exactly `files`; removed again on any failure.

    Blocking: call it off the event loop."""
    root = Path(tempfile.mkdtemp(prefix=PREFIX))
    try:
        write_files(root, files)
    except BaseException:
        remove_override_directory(root)
        raise
    return root


def remove_override_directory(root: Path) -> None:
    """Delete a directory made by create_override_directory (never anything else)."""
    if not root.name.startswith(PREFIX):
        log.error("refusing to remove '%s': not an override directory", root)
        return
    shutil.rmtree(root, ignore_errors=True)
