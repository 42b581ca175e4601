"""Fixtures shared by every test directory: the example repository and a running server."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from harness.serverproc import ServerProcess, running_server  # noqa: E402  (needs sys.path above)


@pytest.fixture(scope="session")
def example_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example model repository, built fresh for this test session."""
    from examples.build_repository import build_repository

    return build_repository(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def example_server(
    example_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server over the example repository, shared by read-mostly e2e tests."""
    with running_server(
        [example_repository], ["--exit-timeout-secs", "10"], log_dir=tmp_path_factory.mktemp("logs")
    ) as server:
        yield server
