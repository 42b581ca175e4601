"""File overrides from load requests: only plain relative paths, written only inside the private
directory, never through a symlink."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from repository.overrides import (
    OverrideError,
    checked_path,
    create_override_directory,
    remove_override_directory,
    write_files,
)

ESCAPES = [
    "../x",
    "1/../../x",
    "1/../x",
    "/etc/x",
    "//x",
    "1//model.onnx",
    "./1/model.onnx",
    "1/./model.onnx",
    "..",
    "",
    "1/model.onnx\x00.txt",
    "..\\x",
    "1/",
]


@pytest.mark.parametrize("key", ESCAPES)
def test_paths_that_are_not_plain_and_relative_are_refused(key: str) -> None:
    with pytest.raises(OverrideError):
        checked_path(key)


def test_plain_paths_are_accepted() -> None:
    assert str(checked_path("1/model.onnx")) == "1/model.onnx"
    assert str(checked_path("2/sub/dir/weights.bin")) == "2/sub/dir/weights.bin"
    assert str(checked_path("labels.txt")) == "labels.txt"


def test_files_land_in_a_private_directory_that_is_removed_again() -> None:
    root = create_override_directory({"1/model.onnx": b"abc", "labels.txt": b"a\nb\n"})
    try:
        assert (root / "1" / "model.onnx").read_bytes() == b"abc"
        assert (root / "labels.txt").read_bytes() == b"a\nb\n"
        assert root.stat().st_mode & 0o777 == 0o700
    finally:
        remove_override_directory(root)
    assert not root.exists()


def test_one_bad_path_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with pytest.raises(OverrideError):
        create_override_directory({"1/model.onnx": b"ok", "1/../../escaped": b"bad"})
    assert list(tmp_path.iterdir()) == []  # the half-made directory is gone too


def test_a_symlinked_parent_is_never_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "1")
    with pytest.raises(OverrideError):
        write_files(root, {"1/model.onnx": b"payload"})
    assert list(outside.iterdir()) == []


def test_a_symlinked_file_is_never_written_through(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "1").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"original")
    os.symlink(victim, root / "1" / "model.onnx")
    with pytest.raises(OverrideError):
        write_files(root, {"1/model.onnx": b"payload"})
    assert victim.read_bytes() == b"original"


def test_only_override_directories_are_ever_removed(tmp_path: Path) -> None:
    keep = tmp_path / "precious"
    keep.mkdir()
    remove_override_directory(keep)
    assert keep.exists()
