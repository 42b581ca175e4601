"""Where models and versions live on disk, and which versions a version policy selects."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from protocol.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

DUPLICATE_REASON = "model appears in two or more repositories"


@dataclass(frozen=True)
class ModelLocation:
    name: str
    path: Path


def distinct_repositories(repositories: list[Path]) -> list[Path]:
    """The repositories, each directory once: the same path given twice (or two spellings of
    it) is one repository, not two holding every model twice."""
    seen: set[Path] = set()
    distinct = []
    for repository in repositories:
        key = repository.resolve()
        if key not in seen:
            seen.add(key)
            distinct.append(repository)
    return distinct


def missing_repositories(repositories: list[Path]) -> list[Path]:
    return [repository for repository in repositories if not repository.is_dir()]


def scan_repositories(
    repositories: list[Path], *, quiet: bool = False
) -> tuple[dict[str, ModelLocation], dict[str, list[Path]]]:
    """Model directories by name across every repository, and the names found more than once."""
    found: dict[str, list[Path]] = {}
    for repository in distinct_repositories(repositories):
        if not repository.is_dir():
            if not quiet:
                log.error("model repository '%s' does not exist", repository)
            continue
        for entry in sorted(repository.iterdir()):
            if entry.is_dir() and not entry.name.startswith("."):
                found.setdefault(entry.name, []).append(entry)
    unique = {
        name: ModelLocation(name, paths[0]) for name, paths in found.items() if len(paths) == 1
    }
    duplicates = {name: paths for name, paths in found.items() if len(paths) > 1}
    return unique, duplicates


# Model-level subdirectories that are not versions and deserve no warning.
_KNOWN_SUBDIRS = ("configs", "warmup")


def version_number(name: str) -> int | None:
    """The version a directory name stands for: a positive integer without leading zeros."""
    if not (name.isascii() and name.isdigit()) or (len(name) > 1 and name.startswith("0")):
        return None
    return int(name) or None


def version_directories(model_dir: Path, *, quiet: bool = False) -> dict[int, Path]:
    """Positive integer subdirectories; others (leading zeros, non-numbers) are ignored, with a
    warning unless `quiet` (the poller looks every few seconds and would repeat it forever)."""
    versions: dict[int, Path] = {}
    for entry in model_dir.iterdir():
        if not entry.is_dir():
            continue
        name = entry.name
        number = version_number(name)
        if number is None:
            if not quiet and not name.startswith(".") and name not in _KNOWN_SUBDIRS:
                log.warning(
                    "ignoring '%s' in model '%s': not a version directory", name, model_dir.name
                )
            continue
        versions[number] = entry
    return dict(sorted(versions.items()))


def select_versions(config: ModelConfig, available: dict[int, Path]) -> list[int]:
    """The versions the config's version policy serves, ascending."""
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    numbers = sorted(available)
    if choice == "all":
        return numbers
    if choice == "specific":
        wanted = sorted(set(policy.specific.versions))
        missing = [v for v in wanted if v not in available]
        for version in missing:
            log.error(
                "model '%s': version %d named by the version policy does not exist",
                config.name,
                version,
            )
        return [v for v in wanted if v in available]
    count = policy.latest.num_versions if choice == "latest" else 1
    return numbers[-max(count, 1) :] if numbers else []
