"""harness/perf_analyzer.py finds perf_analyzer in the documented order, keeps a given one, and says
why when there is none. Fake binaries (shell scripts) stand in; no test installs anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness import perf_analyzer as finder

ROOT = Path(__file__).resolve().parents[3]


def fake(folder: Path, works: bool = True, name: str = "perf_analyzer") -> Path:
    """A perf_analyzer stand-in: `--version` answers like the real one, or fails."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    body = (
        'echo "Perf Analyzer Version 0.0.0 (commit fake)"'
        if works
        else "echo 'version GLIBC_2.38 not found' >&2; exit 1"
    )
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def wheel_script(folder: Path) -> Path:
    """What `pip install perf-analyzer` puts in bin/: Python that exits 0 whatever happens."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "perf_analyzer"
    path.write_text(
        '#!/bin/sh\n# from perf_analyzer.cli import main\necho "Perf Analyzer Version 0.0.0"\n'
    )
    path.chmod(0o755)
    return path


@pytest.fixture
def no_install(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fails any install and the pip probe of this Python: unit tests install nothing."""
    calls: list[str] = []

    def refuse(self: finder.Finder) -> Path:
        calls.append("install")
        raise finder.Missing("installing is off in this test")

    monkeypatch.setattr(finder.Finder, "install", refuse)
    monkeypatch.setattr(finder, "installed_binary", lambda python: None)
    return calls


def locate(env: dict[str, str], cache: Path, install: bool = True) -> Path:
    return finder.locate(env, cache, install=install, python=sys.executable)


def test_a_given_perf_analyzer_is_kept_over_one_on_path(tmp_path: Path, no_install) -> None:
    given = fake(tmp_path / "mine")
    fake(tmp_path / "bin")
    env = {"PERF_ANALYZER": str(given), "PATH": str(tmp_path / "bin")}
    assert locate(env, tmp_path / "cache") == given
    assert no_install == []


def test_a_given_perf_analyzer_that_does_not_run_stops_with_exit_2(
    tmp_path: Path, no_install, capsys: pytest.CaptureFixture[str]
) -> None:
    fake(tmp_path / "bin")  # a working one elsewhere is not taken instead
    mine = fake(tmp_path / "mine", works=False)
    env = {"PERF_ANALYZER": str(mine), "PATH": str(tmp_path / "bin")}
    with pytest.raises(SystemExit) as stopped:
        locate(env, tmp_path / "cache")
    assert stopped.value.code == finder.EXIT_GIVEN_BROKEN
    err = capsys.readouterr().err
    assert f"PERF_ANALYZER={mine} does not run" in err
    assert "GLIBC_2.38" in err and "fix or unset it" in err
    assert no_install == []


def test_one_on_path_is_found(tmp_path: Path, no_install) -> None:
    on_path = fake(tmp_path / "bin")
    path = f"{tmp_path / 'empty'}:{tmp_path / 'bin'}"
    assert locate({"PATH": path}, tmp_path / "cache") == on_path


def test_a_broken_one_on_path_gives_way_to_the_cache(tmp_path: Path, no_install) -> None:
    fake(tmp_path / "bin", works=False)
    cached = fake(tmp_path / "cache")
    assert locate({"PATH": str(tmp_path / "bin")}, tmp_path / "cache") == cached


def test_the_wheels_python_wrapper_is_not_taken(tmp_path: Path, no_install) -> None:
    wheel_script(tmp_path / "venv" / "bin")
    cached = fake(tmp_path / "cache")
    assert locate({"PATH": str(tmp_path / "venv" / "bin")}, tmp_path / "cache") == cached


def test_this_pythons_pip_installed_binary_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = fake(tmp_path / "site-packages" / "perf_analyzer" / "bin")
    monkeypatch.setattr(finder, "installed_binary", lambda python: binary)
    assert locate({"PATH": str(tmp_path / "empty")}, tmp_path / "cache", install=False) == binary


def test_none_and_no_install_exits_1_saying_what_was_tried(
    tmp_path: Path, no_install, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = fake(tmp_path / "cache", works=False)
    with pytest.raises(SystemExit) as stopped:
        locate({"PATH": str(tmp_path / "empty")}, tmp_path / "cache", install=False)
    assert stopped.value.code == finder.EXIT_MISSING
    assert f"{broken} (in {tmp_path / 'cache'}) does not run" in capsys.readouterr().err
    assert no_install == []


def test_none_and_no_way_to_install_exits_1_saying_how_to_give_one(
    tmp_path: Path, no_install, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = fake(tmp_path / "cache", works=False)
    with pytest.raises(SystemExit) as stopped:
        locate({"PATH": str(tmp_path / "empty")}, tmp_path / "cache")
    assert stopped.value.code == finder.EXIT_MISSING
    err = capsys.readouterr().err
    assert f"passed over: {broken} (in {tmp_path / 'cache'}) does not run" in err
    assert "cannot install it here: installing is off in this test" in err
    assert "give one: PERF_ANALYZER=/path/to/perf_analyzer" in err
    assert no_install == ["install"]


@pytest.mark.parametrize(
    ("machine", "glibc", "expected"),
    [
        ("x86_64", (2, 39), "pip"),
        ("aarch64", (2, 38), "pip"),
        ("x86_64", (2, 36), "private"),
        ("aarch64", (2, 31), "private"),
        ("x86_64", None, "not glibc"),
        ("riscv64", (2, 40), "no perf-analyzer 2.60.0 wheel for riscv64"),
    ],
)
def test_install_picks_pip_where_glibc_allows_else_the_private_loader(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    machine: str,
    glibc: tuple[int, int] | None,
    expected: str,
) -> None:
    commands: list[list[str]] = []
    monkeypatch.setattr(finder.platform, "machine", lambda: machine)
    monkeypatch.setattr(finder, "glibc_version", lambda: glibc)
    monkeypatch.setattr(finder, "run", lambda command, **kw: commands.append(list(command)))
    monkeypatch.setattr(finder, "installed_binary", lambda python: tmp_path / "pip-binary")
    monkeypatch.setattr(
        finder, "install_private", lambda cache, python, machine: tmp_path / "private"
    )
    one = finder.Finder(env={}, cache=tmp_path / "cache", python="/venv/bin/python")
    if expected == "pip":
        assert one.install() == tmp_path / "pip-binary"
        assert commands == [
            ["/venv/bin/python", "-m", "pip", "install", "--quiet", "perf-analyzer==2.60.0"]
        ]
    elif expected == "private":
        assert one.install() == tmp_path / "private" and commands == []
    else:
        with pytest.raises(finder.Missing, match=expected):
            one.install()


def test_the_private_loader_needs_apt_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(finder.shutil, "which", lambda name, **kw: None)
    with pytest.raises(finder.Missing, match="apt-get and dpkg-deb are not here"):
        finder.install_private(tmp_path, sys.executable, "x86_64")


@pytest.mark.parametrize(
    ("text", "version"),
    [("glibc 2.36", (2, 36)), ("glibc 2.41", (2, 41)), ("musl 1.2", None), ("", None)],
)
def test_glibc_version(monkeypatch: pytest.MonkeyPatch, text: str, version) -> None:
    monkeypatch.setattr(finder.os, "confstr", lambda name: text)
    assert finder.glibc_version() == version


def test_the_cache_folder_follows_the_environment() -> None:
    assert finder.default_cache({"PERF_ANALYZER_DIR": "/x"}) == Path("/x")
    assert finder.default_cache({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path("/c/perf-analyzer")
    assert finder.default_cache({"HOME": "/h"}) == Path("/h/.cache/perf-analyzer")


def test_the_command_prints_only_the_path(tmp_path: Path) -> None:
    given = fake(tmp_path / "mine")
    done = subprocess.run(
        [sys.executable, "-m", "harness.perf_analyzer", "--no-install"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PERF_ANALYZER": str(given), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{given}\n"
