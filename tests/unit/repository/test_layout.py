"""Version directories and version policies."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format

from protocol.proto.model_config_pb2 import ModelConfig
from repository.layout import (
    DUPLICATE_REASON,
    scan_repositories,
    select_versions,
    version_directories,
)


def _model(tmp_path: Path, versions: list[str]) -> Path:
    model_dir = tmp_path / "m"
    for version in versions:
        (model_dir / version).mkdir(parents=True)
    return model_dir


def _config(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig())


def test_only_positive_integer_directories_are_versions(tmp_path: Path) -> None:
    model_dir = _model(tmp_path, ["1", "3", "07", "0", "abc", "12"])
    assert list(version_directories(model_dir)) == [1, 3, 12]


def test_policies(tmp_path: Path) -> None:
    available = version_directories(_model(tmp_path, ["1", "2", "3", "10"]))
    assert select_versions(_config(""), available) == [10]
    assert select_versions(_config("version_policy { latest { num_versions: 2 } }"), available) == [
        3,
        10,
    ]
    assert select_versions(_config("version_policy { all { } }"), available) == [1, 2, 3, 10]
    assert select_versions(
        _config("version_policy: { specific { versions: [1, 3, 7] }}"), available
    ) == [1, 3]


def test_a_model_in_two_repositories_is_reported(tmp_path: Path) -> None:
    for repo in ("a", "b"):
        (tmp_path / repo / "dup" / "1").mkdir(parents=True)
    (tmp_path / "a" / "solo" / "1").mkdir(parents=True)
    unique, duplicates = scan_repositories([tmp_path / "a", tmp_path / "b"])
    assert list(unique) == ["solo"]
    assert list(duplicates) == ["dup"]
    assert DUPLICATE_REASON == "model appears in two or more repositories"


def test_symlinked_model_and_version_directories_are_followed(tmp_path: Path) -> None:
    """README, Limits and security: a symlink in the repository serves what it points to."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "real_model" / "1").mkdir(parents=True)
    (elsewhere / "v2").mkdir()
    repository = tmp_path / "repo"
    repository.mkdir()
    (repository / "linked").symlink_to(elsewhere / "real_model")
    (elsewhere / "real_model" / "2").symlink_to(elsewhere / "v2")
    models, duplicates = scan_repositories([repository])
    assert list(models) == ["linked"] and not duplicates
    assert sorted(version_directories(models["linked"].path)) == [1, 2]
