"""What the files of a model look like on disk, cheaply (stat) and exactly (content hashes).

A model directory splits into units: the model-level files (config.pbtxt, labels, configs/,
warmup/ ...) and one unit per version directory. A `.ready` file at the top of a unit is its
ready marker, kept apart from its contents (see ModelFiles.marked_complete). The poller
compares each unit's stat keys with the previous poll's to tell whether it is still being
written, and compares content fingerprints (size, mtime and a SHA-256 of the bytes) with what
was last loaded to tell whether it changed. A file is hashed only once its stat key stopped
changing, and each hash is cached against that key, so a poll of an unchanged repository only
calls stat.

Everything here blocks on the filesystem: run it off the event loop.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from repository import layout

# st_size, st_mtime_ns, st_ctime_ns, st_ino, st_dev: ctime moves on any write or rename, so a
# replaced file is seen even when its size and mtime were preserved (cp -p, rsync -t).
StatKey = tuple[int, int, int, int, int]
# relative path -> stat key, for the files of one unit
UnitStats = dict[str, StatKey]
# sorted (relative path, size, mtime_ns, sha256 hex) of one unit's files
Fingerprint = tuple[tuple[str, int, int, str], ...]

MODEL_LEVEL: int | None = None  # the unit id of the model-level files; versions use ints
# Written last by a deploy tool into a version directory (or into the model directory, for
# config.pbtxt and labels) to say the unit is complete. Not part of the unit's contents.
READY_MARKER = ".ready"
_CHUNK = 1 << 20


@dataclass
class ModelFiles:
    """One model directory as seen by one poll: stat keys per unit."""

    path: Path
    units: dict[int | None, UnitStats] = field(default_factory=dict)
    # The stat key of each unit's READY_MARKER, where it has one (kept out of `units`).
    markers: dict[int | None, StatKey] = field(default_factory=dict)

    @property
    def versions(self) -> list[int]:
        """Version units that hold at least one file (an empty directory is not a version yet)."""
        return sorted(v for v, files in self.units.items() if v is not None and files)

    def marked_complete(self, unit: int | None) -> bool:
        """The unit has a ready marker that changed no earlier than any of its files (ctime,
        which no copy tool can set back): whatever was written before the marker is complete.
        A marker left from an earlier deploy stops counting once a file is rewritten."""
        marker = self.markers.get(unit)
        if marker is None:
            return False
        files = self.units.get(unit) or {}
        return all(marker[2] >= key[2] for key in files.values())


def stat_key(info: os.stat_result) -> StatKey:
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)


def _walk(
    directory: Path, prefix: str, into: UnitStats, visited: set[tuple[int, int]] | None = None
) -> None:
    """Every regular file below `directory` (following symlinks, as loading does, but never
    into a directory already visited, so a symlink loop ends)."""
    visited = set() if visited is None else visited
    try:
        info = os.stat(directory)
        if (info.st_dev, info.st_ino) in visited:
            return
        visited.add((info.st_dev, info.st_ino))
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        relative = f"{prefix}{entry.name}"
        try:
            if entry.is_dir():
                _walk(Path(entry.path), relative + "/", into, visited)
            elif entry.is_file():
                into[relative] = stat_key(entry.stat())
        except OSError:  # vanished between listing and stat: it is changing anyway
            continue


def scan_model(model_dir: Path) -> ModelFiles:
    """Stat every file of one model directory, grouped into units."""
    scanned = ModelFiles(model_dir)
    versions = {path.name: number for number, path in _version_dirs(model_dir).items()}
    model_level: UnitStats = {}
    try:
        entries = list(os.scandir(model_dir))
    except OSError:
        entries = []
    for entry in entries:
        try:
            if entry.name in versions:
                unit: UnitStats = {}
                _walk(Path(entry.path), f"{entry.name}/", unit)
                number = versions[entry.name]
                marker = unit.pop(f"{entry.name}/{READY_MARKER}", None)
                if marker is not None:
                    scanned.markers[number] = marker
                scanned.units[number] = unit
            elif entry.is_dir():
                if not entry.name.startswith("."):
                    _walk(Path(entry.path), f"{entry.name}/", model_level)
            elif entry.is_file():
                if entry.name == READY_MARKER:
                    scanned.markers[MODEL_LEVEL] = stat_key(entry.stat())
                else:
                    model_level[entry.name] = stat_key(entry.stat())
        except OSError:
            continue
    scanned.units[MODEL_LEVEL] = model_level
    return scanned


def _version_dirs(model_dir: Path) -> dict[int, Path]:
    try:
        return layout.version_directories(model_dir, quiet=True)
    except OSError:
        return {}


class ContentHasher:
    """SHA-256 of files, cached by path and stat key; forgets files not asked for in a round."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, StatKey], str] = {}
        self._used: set[tuple[str, StatKey]] = set()

    def digest(self, path: Path, key: StatKey) -> str:
        cache_key = (str(path), key)
        self._used.add(cache_key)
        cached = self._cache.get(cache_key)
        if cached is not None:
            return cached
        hasher = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                hasher.update(chunk)
        value = self._cache[cache_key] = hasher.hexdigest()
        return value

    def fingerprint(self, root: Path, files: UnitStats) -> Fingerprint:
        """Content fingerprint of one unit (root is the model directory)."""
        return tuple(
            sorted(
                (relative, key[0], key[1], self.digest(root / relative, key))
                for relative, key in files.items()
            )
        )

    def end_round(self) -> None:
        """Drop hashes of files that were not looked at since the previous call."""
        self._cache = {k: v for k, v in self._cache.items() if k in self._used}
        self._used = set()
