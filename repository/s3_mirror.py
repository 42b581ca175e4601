"""Model repositories in S3: each one mirrored into a local folder that is served as from disk.

The rest of the server (layout, fingerprints, the poller, the manager) sees only the mirror, so
poll and explicit modes work on it unchanged. A sync lists the bucket prefix (at most
`max_objects` keys) and compares each unit, a version directory or a model's model-level files
(config.pbtxt, labels, configs/ ...), by the key, ETag, size and LastModified of its objects
with what the mirror holds. A changed unit is fetched whole into a staging folder beside the
mirror (objects already mirrored are hard-linked, not fetched again) and only then renamed
into place, so the mirror never shows a half-downloaded version; a fetch that fails (an object
changed meanwhile, past a bound, the network) leaves what was there and is tried at the next
sync. Each file gets its object's LastModified as mtime, so an unchanged object fingerprints the
same however often it is fetched.

A `.ready` object in a unit is mirrored only while it is at least as new as every other object
there: the poller then loads that unit at once (repository/fingerprint.py), as it does a local
deploy that writes `.ready` last. Without one, an upload in progress is judged by the poller's
settle time like a copy in progress on disk.

The client, its credentials and its errors are repository/s3_client.py's.

Everything here blocks on the network and the disk: run it off the event loop.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Any

from repository import layout
from repository.fingerprint import READY_MARKER
from repository.s3_client import ClientFactory, default_client, describe
from repository.s3_location import S3Location

log = logging.getLogger(__name__)

# Unit ids as in repository/fingerprint.py: None for the model-level files, else the version.
Unit = int | None
_CHUNK = 1 << 20
_STAGING = ".staging"
_MAX_WARNED = 1000


@dataclass(frozen=True)
class MirrorLimits:
    """Bounds on what one sync may list and fetch (each a --object-store-* flag)."""

    max_objects: int = 100_000
    max_object_bytes: int = 8 << 30
    max_version_bytes: int = 32 << 30  # all objects of one version (or model-level files)
    timeout_secs: float = 30.0  # connecting and each read


class MirrorError(Exception):
    """The repository cannot be listed at all (no bucket, no access, too many objects)."""


@dataclass(frozen=True)
class RemoteFile:
    key: str
    relative: str  # path inside the model directory: "config.pbtxt", "1/model.onnx"
    etag: str
    size: int
    modified: float  # LastModified, seconds since the epoch


# relative path -> object, for one unit of one model
UnitFiles = dict[str, RemoteFile]
# model -> unit -> its objects
Listing = dict[str, dict[Unit, UnitFiles]]


def signature(files: UnitFiles) -> frozenset[tuple[str, str, int, float]]:
    return frozenset((f.relative, f.etag, f.size, f.modified) for f in files.values())


def materialized(unit: Unit, files: UnitFiles) -> list[RemoteFile]:
    """The objects to write, in order: a fresh ready marker last, a stale one not at all."""
    marker_name = _marker_name(unit)
    marker = files.get(marker_name)
    others = sorted((f for f in files.values() if f.relative != marker_name), key=_by_name)
    if marker is not None and all(marker.modified >= f.modified for f in others):
        others.append(marker)
    return others


def _by_name(item: RemoteFile) -> str:
    return item.relative


def _touch_marker(unit: Unit, files: UnitFiles, model_dir: Path) -> None:
    """Give a written ready marker the newest ctime of its unit (utime sets ctime to now), as
    the poller requires of a marker written last (repository/fingerprint.py)."""
    order = materialized(unit, files)
    if order and order[-1].relative == _marker_name(unit):
        os.utime(model_dir / order[-1].relative, (order[-1].modified, order[-1].modified))


def _marker_name(unit: Unit) -> str:
    return READY_MARKER if unit is None else f"{unit}/{READY_MARKER}"


class S3Mirror:
    """One S3 repository and its local mirror folder `root` (owned: emptied at start)."""

    def __init__(
        self,
        location: S3Location,
        root: Path,
        limits: MirrorLimits = MirrorLimits(),
        client_factory: ClientFactory = default_client,
    ) -> None:
        self.location = location
        self.root = root
        self.limits = limits
        self._client_factory = client_factory
        self._client: Any | None = None
        self._lock = threading.Lock()
        # What the mirror holds: model -> unit -> the objects it was made from.
        self._held: dict[str, dict[Unit, UnitFiles]] = {}
        self._warned: set[str] = set()
        # Units whose fetch failed, with what was listed then: the same failure is logged once.
        self._failed: dict[tuple[str, Unit], frozenset[tuple[str, str, int, float]]] = {}
        self._prepared = False

    def prepare(self) -> None:
        """Empty (or create) the mirror folder, once, before the first sync: nothing from an
        earlier run is served."""
        if self._prepared:
            return
        if self.root.exists():
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True)
        self._prepared = True

    # ----- listing --------------------------------------------------------------------------
    def _s3(self) -> Any:
        if self._client is None:
            self._client = self._client_factory(self.location, self.limits.timeout_secs)
        return self._client

    def list(self, model: str | None = None) -> Listing:
        """The objects under the prefix (or under one model's folder), grouped by model and
        unit. Raises MirrorError when the prefix cannot be listed."""
        prefix = self.location.prefix + (f"{model}/" if model else "")
        listing: Listing = {}
        count = 0
        try:
            pages = (
                self._s3()
                .get_paginator("list_objects_v2")
                .paginate(
                    Bucket=self.location.bucket, Prefix=prefix, PaginationConfig={"PageSize": 1000}
                )
            )
            for page in pages:
                for item in page.get("Contents", ()):
                    count += 1
                    if count > self.limits.max_objects:
                        raise MirrorError(
                            f"'{self.location}' lists more than {self.limits.max_objects} "
                            "objects (--object-store-max-objects)"
                        )
                    self._add(listing, item)
        except MirrorError:
            raise
        except Exception as exc:
            reason = describe(exc, self.location)
            raise MirrorError(f"cannot list '{self.location}': {reason}") from None
        return listing

    def _add(self, listing: Listing, item: dict[str, Any]) -> None:
        key = str(item["Key"])
        if key.endswith("/"):
            return  # a folder placeholder some tools create
        parts = key[len(self.location.prefix) :].split("/")
        if len(parts) < 2:
            return  # a file at the top of the repository, as on disk: not a model
        bad = any(
            p in ("", ".", "..") or "\x00" in p or len(p.encode()) > 255 for p in parts
        ) or any(p.startswith(".") for p in parts[:-1])
        if bad:
            if key not in self._warned and len(self._warned) < _MAX_WARNED:
                self._warned.add(key)
                log.warning(
                    "'%s': skipping object '%s': not a usable file path", self.location, key
                )
            return
        unit = layout.version_number(parts[1]) if len(parts) > 2 else None
        relative = "/".join(parts[1:])
        modified = item["LastModified"]
        stamp = modified.timestamp() if hasattr(modified, "timestamp") else float(modified)
        entry = RemoteFile(key, relative, str(item.get("ETag", "")), int(item["Size"]), stamp)
        listing.setdefault(parts[0], {}).setdefault(unit, {})[relative] = entry

    # ----- syncing --------------------------------------------------------------------------
    def sync(self) -> None:
        """Bring the whole mirror up to date. Raises MirrorError when the listing fails (the
        mirror then stays as it was)."""
        with self._lock:
            self.prepare()
            listing = self.list()
            for name in sorted(set(self._held) - set(listing)):
                self._remove_model(name)
            for name in sorted(listing):
                self._sync_model(name, listing[name])

    def sync_model(self, name: str) -> None:
        """Bring one model's folder up to date (an explicit-mode load of it)."""
        with self._lock:
            self.prepare()
            remote = self.list(name).get(name)
            if remote is None:
                if name in self._held:
                    self._remove_model(name)
                return
            self._sync_model(name, remote)

    def close(self) -> None:
        with self._lock:
            if self._prepared:  # never delete what this mirror did not make
                shutil.rmtree(self.root, ignore_errors=True)
            self._held.clear()

    def _remove_model(self, name: str) -> None:
        log.info("'%s': model '%s' is gone from the bucket", self.location, name)
        self._discard(self.root / name)
        self._held.pop(name, None)

    def _sync_model(self, name: str, remote: dict[Unit, UnitFiles]) -> None:
        held = self._held.get(name)
        model_dir = self.root / name
        if held is None or not model_dir.is_dir():
            self._fetch_model(name, remote)
            return
        for unit in sorted(u for u in held if u is not None and u not in remote):
            log.info(
                "'%s': model '%s' version %d is gone from the bucket", self.location, name, unit
            )
            self._discard(model_dir / str(unit))
            del held[unit]
        model_level = remote.get(None, {})
        if signature(model_level) != signature(held.get(None, {})):
            self._update_model_level(name, model_dir, model_level, held)
        for unit in sorted(u for u in remote if u is not None):
            files = remote[unit]
            if unit in held and signature(files) == signature(held[unit]):
                continue
            stage = self._staging()
            try:
                if not self._fetch_unit(name, unit, files, stage, held.get(unit, {})):
                    continue
                target = model_dir / str(unit)
                self._discard(target)
                os.rename(stage / str(unit), target)
            finally:
                shutil.rmtree(stage, ignore_errors=True)
            # After the old copy went: unlinking its names moved the ctime of linked files.
            _touch_marker(unit, files, model_dir)
            held[unit] = files
            log.info("'%s': fetched model '%s' version %d", self.location, name, unit)

    def _fetch_model(self, name: str, remote: dict[Unit, UnitFiles]) -> None:
        """A model new to the mirror: fetched into staging, then renamed into place whole."""
        stage = self._staging()
        try:
            if not self._fetch_unit(name, None, remote.get(None, {}), stage, {}):
                return
            held: dict[Unit, UnitFiles] = {None: remote.get(None, {})}
            for unit in sorted(u for u in remote if u is not None):
                if self._fetch_unit(name, unit, remote[unit], stage, {}):
                    held[unit] = remote[unit]
            target = self.root / name
            if target.exists():
                self._discard(target)
            os.rename(stage, target)
            self._held[name] = held
            versions = sorted(u for u in held if u is not None)
            log.info("'%s': fetched model '%s' (versions %s)", self.location, name, versions)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _update_model_level(
        self, name: str, model_dir: Path, files: UnitFiles, held: dict[Unit, UnitFiles]
    ) -> None:
        """config.pbtxt, labels and the like: staged whole, then each renamed into place (the
        ready marker last), and the ones gone from the bucket removed."""
        stage = self._staging()
        try:
            previous = held.get(None, {})
            if not self._fetch_unit(name, None, files, stage, previous):
                return
            written = {f.relative for f in materialized(None, files)}
            for relative in sorted(set(previous) - written):
                (model_dir / relative).unlink(missing_ok=True)
            for item in materialized(None, files):
                target = model_dir / item.relative
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(stage / item.relative, target)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        _touch_marker(None, files, model_dir)  # after the staged links went (see above)
        held[None] = files
        log.info("'%s': fetched the model-level files of '%s'", self.location, name)

    def _fetch_unit(
        self, name: str, unit: Unit, files: UnitFiles, dest: Path, previous: UnitFiles
    ) -> bool:
        """Write one unit's objects under `dest` (a stand-in for the model folder); objects
        the mirror already holds unchanged are linked from it. False (logged) on failure."""
        what = f"model '{name}' " + ("model-level files" if unit is None else f"version {unit}")
        listed = signature(files)
        again = self._failed.get((name, unit)) == listed
        total = sum(f.size for f in files.values())
        try:
            for item in files.values():
                if item.size > self.limits.max_object_bytes:
                    raise MirrorError(
                        f"object '{item.key}' is {item.size} bytes, over "
                        f"--object-store-max-object-bytes {self.limits.max_object_bytes}"
                    )
            if total > self.limits.max_version_bytes:
                raise MirrorError(
                    f"{total} bytes in all, over --object-store-max-version-bytes "
                    f"{self.limits.max_version_bytes}"
                )
            dest.mkdir(parents=True, exist_ok=True)
            if unit is not None:
                (dest / str(unit)).mkdir(exist_ok=True)  # a version of only a stale marker
            for item in materialized(unit, files):
                target = dest / item.relative
                target.parent.mkdir(parents=True, exist_ok=True)
                held = previous.get(item.relative)
                if held == item and self._link(self.root / name / item.relative, target):
                    continue
                self._download(item, target)
            _touch_marker(unit, files, dest)
        except Exception as exc:
            reason = str(exc) if isinstance(exc, MirrorError) else describe(exc, self.location)
            if unit is not None:  # nothing of it may be renamed into place
                shutil.rmtree(dest / str(unit), ignore_errors=True)
            self._failed[(name, unit)] = listed
            log.log(
                logging.DEBUG if again else logging.ERROR,
                "'%s': fetching %s failed, keeping what was there: %s",
                self.location,
                what,
                reason,
            )
            return False
        self._failed.pop((name, unit), None)
        return True

    @staticmethod
    def _link(source: Path, target: Path) -> bool:
        try:
            os.link(source, target)
        except OSError:
            return False
        return True

    def _download(self, item: RemoteFile, target: Path) -> None:
        """One object, as listed (If-Match: a newer upload meanwhile fails it), size-checked."""
        reply = self._s3().get_object(Bucket=self.location.bucket, Key=item.key, IfMatch=item.etag)
        body = reply["Body"]
        written = 0
        try:
            with open(target, "wb") as handle:
                while chunk := body.read(_CHUNK):
                    written += len(chunk)
                    if written > item.size:
                        raise MirrorError(f"object '{item.key}' is longer than listed")
                    handle.write(chunk)
        finally:
            body.close()
        if written != item.size:
            raise MirrorError(f"object '{item.key}' ended after {written} of {item.size} bytes")
        os.utime(target, (item.modified, item.modified))

    def _staging(self) -> Path:
        return self.root / _STAGING / uuid.uuid4().hex

    def _discard(self, path: Path) -> None:
        """Take `path` out of the mirror in one rename, then delete it."""
        if not path.exists():
            return
        trash = self.root / _STAGING / f"gone-{uuid.uuid4().hex}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)


class ObjectRepositories:
    """Every S3 repository of the server, mirrored under one cache folder.

    `cache_dir` None: a temporary folder of this process (0700), deleted by `close()`. Given:
    each repository gets a subfolder named after its URL, emptied at start and deleted at
    close. Nothing is written before `sync_all()`, whose disk errors are OSErrors."""

    def __init__(
        self,
        locations: list[S3Location],
        cache_dir: Path | None = None,
        limits: MirrorLimits = MirrorLimits(),
        client_factory: ClientFactory = default_client,
    ) -> None:
        self._owned = cache_dir is None
        self._created = False  # the owned folder, once made
        self.cache_dir = cache_dir or Path(tempfile.gettempdir()) / (
            f"ascend-serve-repositories-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        self.mirrors = [
            S3Mirror(
                location,
                self.cache_dir / f"s3-{sha256(str(location).encode()).hexdigest()[:16]}",
                limits,
                client_factory,
            )
            for location in locations
        ]

    @property
    def roots(self) -> list[Path]:
        return [mirror.root for mirror in self.mirrors]

    def sync_all(self) -> None:
        """Startup: every repository mirrored. Raises MirrorError naming the first that fails
        (every mirror folder exists by then, empty where its sync did not run)."""
        if self._owned and not self._created:
            self.cache_dir.mkdir(mode=0o700)
            self._created = True
        for mirror in self.mirrors:
            mirror.prepare()
        for mirror in self.mirrors:
            mirror.sync()

    def refresh(self) -> None:
        """Before each poll: failures are logged, and the mirror stays as it was."""
        for mirror in self.mirrors:
            try:
                mirror.sync()
            except (MirrorError, OSError) as exc:  # OSError: the cache folder's disk
                log.error("%s; serving what was fetched before", exc)

    def refresh_model(self, name: str) -> None:
        """Before an explicit load of `name`: that model's folder in every repository."""
        for mirror in self.mirrors:
            try:
                mirror.sync_model(name)
            except (MirrorError, OSError) as exc:
                log.error("%s; loading what was fetched before", exc)

    def close(self) -> None:
        for mirror in self.mirrors:
            mirror.close()
        if self._created:
            shutil.rmtree(self.cache_dir, ignore_errors=True)
