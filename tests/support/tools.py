"""Programs from outside Python that some tests run, and how those tests skip when one is missing:
with a reason that tests/conftest.py recognises, so that the end of the run lists them and the one
command that enables them instead of a quiet "skipped" in a green run."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass

import pytest

PREFIX = "missing tool "


@dataclass(frozen=True)
class Tool:
    name: str
    enable: str  # the one command that enables its tests
    hint: str = ""  # a line more, when the command needs explaining


TOOLS = {
    "perf_analyzer": Tool(
        "perf_analyzer",
        "PERF_ANALYZER=/path/to/perf_analyzer make test",
        "make test finds or installs one where it can; .venv/bin/python -m harness.perf_analyzer "
        "says why it cannot here",
    ),
    "curl": Tool("curl", "apt-get install curl && make test", "or your system's package manager"),
}

PERF_ANALYZER = os.environ.get("PERF_ANALYZER") or None


def reason(tool: str, detail: str) -> str:
    """The skip reason for a test that needs `tool` (one of TOOLS)."""
    assert tool in TOOLS, tool
    return f"{PREFIX}{tool}: {detail}"


needs_perf_analyzer = pytest.mark.skipif(
    PERF_ANALYZER is None, reason=reason("perf_analyzer", "PERF_ANALYZER is not set")
)
needs_curl = pytest.mark.skipif(
    shutil.which("curl") is None, reason=reason("curl", "curl is not on PATH")
)


def perf_analyzer() -> str:
    """$PERF_ANALYZER, or skip the calling test as one that needs it."""
    if PERF_ANALYZER is None:
        pytest.skip(reason("perf_analyzer", "PERF_ANALYZER is not set"))
    return PERF_ANALYZER


def skipped_for_tools(reports: Iterable[pytest.TestReport]) -> dict[str, list[str]]:
    """Tool name -> node ids of the tests in `reports` skipped because it was missing."""
    missing: dict[str, list[str]] = {}
    for report in reports:
        longrepr = report.longrepr
        if not isinstance(longrepr, tuple) or len(longrepr) != 3:
            continue
        text = str(longrepr[2]).removeprefix("Skipped: ")
        if not text.startswith(PREFIX):
            continue
        tool = text[len(PREFIX) :].split(":", 1)[0]
        if tool in TOOLS:
            missing.setdefault(tool, []).append(report.nodeid)
    return missing


def summary(reports: Iterable[pytest.TestReport]) -> list[str]:
    """What the end of the run says about tests skipped for a missing tool; [] when none were."""
    lines: list[str] = []
    for tool, nodeids in skipped_for_tools(reports).items():
        info = TOOLS[tool]
        tests = "test" if len(nodeids) == 1 else "tests"
        lines.append(f"{len(nodeids)} {tests} skipped because {tool} is missing:")
        lines += [f"  {nodeid}" for nodeid in nodeids]
        lines.append(f"enable them: {info.enable}")
        if info.hint:
            lines.append(f"  ({info.hint})")
    return lines
