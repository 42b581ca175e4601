"""Fixtures shared by every test directory: the example repository and a running server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from harness.serverproc import ServerProcess, running_server
from tests.support import tools


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
    with serving_examples(example_repository, tmp_path_factory) as server:
        yield server


def serving_examples(
    example_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> AbstractContextManager[ServerProcess]:
    """A fresh server over the example repository (fixtures that need one of their own call it)."""
    return running_server(
        [example_repository], ["--exit-timeout-secs", "10"], log_dir=tmp_path_factory.mktemp("logs")
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """At the end of the run: the tests skipped because a program was missing, and the command
    that enables them (a green run with quiet skips looks like a full one)."""
    lines = tools.summary(terminalreporter.stats.get("skipped", []))
    if lines:
        terminalreporter.section("skipped: a tool is missing", sep="=", yellow=True, bold=True)
        for line in lines:
            terminalreporter.write_line(line)
