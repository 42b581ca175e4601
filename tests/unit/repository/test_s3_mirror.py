"""repository/s3_mirror.py against moto's S3 server (in a thread, on 127.0.0.1): what the mirror
folder holds after each sync, as the layout and the poller's fingerprints read it."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repository import layout
from repository.fingerprint import scan_model
from repository.s3_client import default_client, redacted
from repository.s3_location import S3Location
from repository.s3_mirror import MirrorError, MirrorLimits, ObjectRepositories, S3Mirror
from tests.support.s3 import S3Endpoint, moto_thread

BUCKET = "models"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[S3Endpoint]:
    with moto_thread() as running:
        yield running


@pytest.fixture
def s3(endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch, request: Any) -> Iterator[Any]:
    for name, value in endpoint.env().items():
        monkeypatch.setenv(name, value)
    client = endpoint.client()
    bucket = f"b-{request.node.name[-40:].lower().replace('_', '-').strip('-')}"[:60]
    client.create_bucket(Bucket=bucket)
    client.bucket = bucket
    yield client


def location(endpoint: S3Endpoint, client: Any, prefix: str = "repo/") -> S3Location:
    return S3Location(client.bucket, prefix, endpoint.url)


def put(client: Any, key: str, body: bytes = b"x") -> None:
    client.put_object(Bucket=client.bucket, Key=f"repo/{key}", Body=body)


class FailingGets:
    """The real client, whose get_object fails for keys ending in `suffix` (a network error
    mid-version)."""

    def __init__(self, real: Any, suffix: str) -> None:
        self.real = real
        self.suffix = suffix

    def get_object(self, **kwargs: Any) -> Any:
        if kwargs["Key"].endswith(self.suffix):
            raise ConnectionResetError("connection reset by peer")
        return self.real.get_object(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_model_is_mirrored_with_its_versions_and_the_objects_times(
    endpoint: S3Endpoint, s3: Any, tmp_path: Path
) -> None:
    put(s3, "m/config.pbtxt", b"name: 'm'")
    put(s3, "m/1/model.onnx", b"one")
    put(s3, "m/2/model.onnx", b"two")
    put(s3, "top-level-file.txt")  # not a model, as on disk
    mirror = S3Mirror(location(endpoint, s3), tmp_path / "mirror")
    mirror.sync()
    model = tmp_path / "mirror" / "m"
    assert (model / "config.pbtxt").read_bytes() == b"name: 'm'"
    assert sorted(layout.version_directories(model)) == [1, 2]
    assert (model / "2" / "model.onnx").read_bytes() == b"two"
    listed = s3.head_object(Bucket=s3.bucket, Key="repo/m/1/model.onnx")["LastModified"]
    assert (model / "1" / "model.onnx").stat().st_mtime == listed.timestamp()
    unique, _ = layout.scan_repositories([tmp_path / "mirror"])
    assert sorted(unique) == ["m"]


def test_new_changed_and_removed_versions_and_models_follow_the_bucket(
    endpoint: S3Endpoint, s3: Any, tmp_path: Path
) -> None:
    put(s3, "m/1/model.onnx", b"one")
    put(s3, "gone/1/model.onnx")
    mirror = S3Mirror(location(endpoint, s3), tmp_path / "mirror")
    mirror.sync()
    put(s3, "m/1/model.onnx", b"one, again")
    put(s3, "m/3/model.onnx", b"three")
    s3.delete_object(Bucket=s3.bucket, Key="repo/gone/1/model.onnx")
    mirror.sync()
    model = tmp_path / "mirror" / "m"
    assert (model / "1" / "model.onnx").read_bytes() == b"one, again"
    assert (model / "3" / "model.onnx").read_bytes() == b"three"
    assert not (tmp_path / "mirror" / "gone").exists()
    s3.delete_object(Bucket=s3.bucket, Key="repo/m/1/model.onnx")
    mirror.sync_model("m")
    assert sorted(layout.version_directories(model)) == [3]


def test_a_version_whose_fetch_fails_keeps_the_mirrored_copy_whole(
    endpoint: S3Endpoint, s3: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    put(s3, "m/1/a.bin", b"old a")
    put(s3, "m/1/b.bin", b"old b")
    failing: list[FailingGets] = []

    def factory(where: S3Location, timeout: float) -> Any:
        failing.append(FailingGets(default_client(where, timeout), "never"))
        return failing[0]

    mirror = S3Mirror(location(endpoint, s3), tmp_path / "mirror", client_factory=factory)
    mirror.sync()
    put(s3, "m/1/a.bin", b"new a")
    put(s3, "m/1/b.bin", b"new b")
    put(s3, "m/2/a.bin", b"new version")
    put(s3, "m/2/b.bin", b"new version")
    failing[0].suffix = "b.bin"  # a.bin of each arrives, b.bin does not
    with caplog.at_level(logging.ERROR):
        mirror.sync()
    version = tmp_path / "mirror" / "m" / "1"
    assert (version / "a.bin").read_bytes() == b"old a"  # neither half of the new copy
    assert (version / "b.bin").read_bytes() == b"old b"
    assert not (tmp_path / "mirror" / "m" / "2").exists()
    assert "fetching model 'm' version 2 failed, keeping what was there" in caplog.text
    failing[0].suffix = "never"
    mirror.sync()
    assert (version / "b.bin").read_bytes() == b"new b"
    assert (tmp_path / "mirror" / "m" / "2" / "b.bin").read_bytes() == b"new version"


def test_bounds_refuse_a_large_version_and_a_long_listing(
    endpoint: S3Endpoint, s3: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    put(s3, "m/1/model.onnx", b"small")
    put(s3, "m/2/model.onnx", b"x" * 100)
    limits = MirrorLimits(max_objects=10, max_object_bytes=50)
    mirror = S3Mirror(location(endpoint, s3), tmp_path / "mirror", limits)
    with caplog.at_level(logging.ERROR):
        mirror.sync()
    assert sorted(layout.version_directories(tmp_path / "mirror" / "m")) == [1]
    assert "over --object-store-max-object-bytes 50" in caplog.text
    for n in range(10):
        put(s3, f"m/3/part{n}")
    with pytest.raises(MirrorError, match="lists more than 10 objects"):
        mirror.sync()


def test_a_ready_marker_is_mirrored_only_while_it_is_the_newest_object(
    endpoint: S3Endpoint, s3: Any, tmp_path: Path
) -> None:
    put(s3, "m/1/model.onnx", b"one")
    put(s3, "m/1/.ready", b"")
    mirror = S3Mirror(location(endpoint, s3), tmp_path / "mirror")
    mirror.sync()
    model = tmp_path / "mirror" / "m"
    assert scan_model(model).marked_complete(1)

    # The model file replaced after the marker: until a new marker, the settle time applies.
    def modified(key: str) -> Any:
        return s3.head_object(Bucket=s3.bucket, Key=f"repo/{key}")["LastModified"]

    while True:  # LastModified counts whole seconds: until the new upload is later
        put(s3, "m/1/model.onnx", b"one b")
        if modified("m/1/model.onnx") > modified("m/1/.ready"):
            break
        time.sleep(0.2)
    mirror.sync()
    assert not (model / "1" / ".ready").exists()
    assert not scan_model(model).marked_complete(1)
    put(s3, "m/1/.ready", b"")
    mirror.sync()
    assert scan_model(model).marked_complete(1)


def test_a_missing_bucket_says_so_and_no_secret_is_shown(
    endpoint: S3Endpoint, s3: Any, tmp_path: Path
) -> None:
    repositories = ObjectRepositories(
        [S3Location("no-such-bucket", "", endpoint.url)], tmp_path / "cache"
    )
    with pytest.raises(MirrorError) as failed:
        repositories.sync_all()
    assert "bucket 'no-such-bucket' does not exist" in str(failed.value)
    assert endpoint.secret not in str(failed.value)
    assert redacted(f"key {endpoint.secret} here") == "key *** here"
    repositories.close()
    assert not any((tmp_path / "cache").iterdir())


def test_an_owned_cache_folder_is_deleted_at_close(endpoint: S3Endpoint, s3: Any) -> None:
    put(s3, "m/1/model.onnx")
    repositories = ObjectRepositories([location(endpoint, s3)])
    repositories.sync_all()
    assert (repositories.roots[0] / "m" / "1" / "model.onnx").exists()
    repositories.close()
    assert not repositories.cache_dir.exists()
