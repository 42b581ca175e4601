"""The set-up a new user meets first: `make test` and `make bench` get perf_analyzer from
harness/perf_analyzer.py, keep one the user gave, never wait on a shell; and a run in which tests
skip for a missing tool ends by naming them and the command that enables them.

The make targets run for real against a fake venv: its `python` hands `-m harness.perf_analyzer`
to this Python (with --no-install: nothing is installed here) and only reports the rest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import tools

ROOT = Path(__file__).resolve().parents[2]


def fake_perf_analyzer(folder: Path, works: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "perf_analyzer"
    body = 'echo "Perf Analyzer Version 0.0.0"' if works else "exit 1"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def make(target: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`make TARGET` with a fake, fully stamped venv, a Triton venv in place and an empty cache."""
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        python.parent.mkdir(parents=True)
        python.write_text(
            "#!/bin/sh\n"
            'case "$1 $2" in\n'
            f'  "-m harness.perf_analyzer") exec {sys.executable} "$@" --no-install ;;\n'
            '  "-m bench.run"|"-m pytest") echo "ran $2 with PERF_ANALYZER=[$PERF_ANALYZER]" ;;\n'
            "esac\n"
        )
        python.chmod(0o755)
        for stamp in (".installed", ".installed-examples", ".installed-dev", ".installed-test"):
            (venv / stamp).touch()
        triton = tmp_path / "triton" / "lib" / "python3.11" / "site-packages" / "pytriton"
        (triton / "tritonserver").mkdir(parents=True)
    return subprocess.run(
        ["make", "-s", target, f"VENV={venv}", f"PY={python}"]
        + [f"TRITON_VENV={tmp_path / 'triton'}", f"MODELS={tmp_path / 'models'}"],
        cwd=ROOT,
        env={
            "PATH": f"{Path(shutil.which('make') or '/usr/bin/make').parent}:/usr/bin:/bin",
            "HOME": str(tmp_path / "home"),
            "PERF_ANALYZER_DIR": str(tmp_path / "cache"),
            **env,
        },
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("target", ["bench", "test"])
def test_a_given_perf_analyzer_is_used_as_given(tmp_path: Path, target: str) -> None:
    given = fake_perf_analyzer(tmp_path / "mine")
    fake_perf_analyzer(tmp_path / "cache")  # found otherwise, not used now
    done = make(target, tmp_path, PERF_ANALYZER=str(given))
    assert done.returncode == 0, done.stdout + done.stderr
    module = "bench.run" if target == "bench" else "pytest"
    assert f"ran {module} with PERF_ANALYZER=[{given}]" in done.stdout


@pytest.mark.parametrize("target", ["bench", "test"])
def test_one_in_the_cache_is_found(tmp_path: Path, target: str) -> None:
    cached = fake_perf_analyzer(tmp_path / "cache")
    done = make(target, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"with PERF_ANALYZER=[{cached}]" in done.stdout


def test_make_bench_without_perf_analyzer_stops_and_says_why(tmp_path: Path) -> None:
    done = make("bench", tmp_path)
    assert done.returncode != 0
    assert "ran bench.run" not in done.stdout
    assert "perf_analyzer: none installed" in done.stderr
    assert "make bench needs perf_analyzer" in done.stderr
    assert "give one: PERF_ANALYZER=/path/to/perf_analyzer make bench" in done.stderr


def test_make_test_without_perf_analyzer_runs_the_tests_and_says_so(tmp_path: Path) -> None:
    done = make("test", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "perf_analyzer: none, its tests will skip (listed at the end)" in done.stdout
    assert "ran pytest with PERF_ANALYZER=[]" in done.stdout


@pytest.mark.parametrize("target", ["bench", "test"])
def test_a_given_perf_analyzer_that_does_not_run_stops_the_target(
    tmp_path: Path, target: str
) -> None:
    fake_perf_analyzer(tmp_path / "cache")  # not taken instead of the given one
    given = fake_perf_analyzer(tmp_path / "mine", works=False)
    done = make(target, tmp_path, PERF_ANALYZER=str(given))
    assert done.returncode != 0
    assert "ran " not in done.stdout
    assert f"PERF_ANALYZER={given} does not run" in done.stderr


def test_the_run_ends_by_listing_tests_skipped_for_perf_analyzer(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PERF_ANALYZER"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
        + ["tests/e2e/grpc/test_perf_analyzer.py", "tests/e2e/scheduling/test_sequence_batcher.py"]
        + ["-k", "perf_analyzer"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout
    tail = done.stdout[done.stdout.index("skipped: a tool is missing") :]
    assert "4 tests skipped because perf_analyzer is missing:" in tail
    assert "tests/e2e/grpc/test_perf_analyzer.py::test_perf_analyzer_grpc[streaming]" in tail
    assert "test_sequence_batcher.py::test_perf_analyzer_sequence_mode[grpc]" in tail
    assert "enable them: PERF_ANALYZER=/path/to/perf_analyzer make test" in tail


class Report:
    def __init__(self, nodeid: str, reason: str) -> None:
        self.nodeid = nodeid
        self.longrepr = ("file.py", 1, f"Skipped: {reason}")


def test_the_summary_names_only_skips_for_a_missing_tool() -> None:
    reports = [
        Report("a.py::one", tools.reason("perf_analyzer", "PERF_ANALYZER is not set")),
        Report("b.py::two", "needs Linux CPU affinity and two CPUs"),
        Report("c.py::three", tools.reason("curl", "curl is not on PATH")),
    ]
    lines = tools.summary(reports)  # type: ignore[arg-type]
    assert lines[:3] == [
        "1 test skipped because perf_analyzer is missing:",
        "  a.py::one",
        "enable them: PERF_ANALYZER=/path/to/perf_analyzer make test",
    ]
    assert "  c.py::three" in lines and not any("b.py" in line for line in lines)
    assert tools.summary([Report("b.py::two", "other")]) == []  # type: ignore[list-item]
