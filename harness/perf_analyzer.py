"""Finds or installs NVIDIA's perf_analyzer and prints its path: what `make test` and `make bench`
run first, so that its tests run on a fresh clone and the benchmark never starts without it.

It lives in harness/ because both tests/ and bench/ need the binary. Standard library only: it
runs before anything else is known about the machine.

    python -m harness.perf_analyzer [--dir DIR] [--no-install]

Where it looks, in order (the first that answers `--version` wins):

1. `$PERF_ANALYZER`, used as given: when it does not run, exit 2 and say so (never another one).
2. `perf_analyzer` on PATH (not the wheel's Python wrapper, which drops the exit status).
3. This Python's own install (`pip install perf-analyzer`), its binary run directly: the wheel's
   `perf_analyzer` script discards the binary's exit status.
4. `DIR/perf_analyzer` in the cache folder DIR (`--dir`, `$PERF_ANALYZER_DIR` or
   `~/.cache/perf-analyzer`).

Then it installs, unless `--no-install`:

5. `pip install perf-analyzer==2.60.0` into this Python's environment where glibc is 2.38 or newer
   (the wheel's minimum; below that pip picks PyPI's empty 0.1.0 placeholder).
6. Where glibc is older, on Debian-family systems with apt-get and dpkg-deb: the same wheel's
   binary goes to DIR, with Debian trixie's loader, libc, libstdc++ and libgcc unpacked beside it
   (downloaded through a private apt configuration from the mirror the machine already uses; no
   package is installed, nothing outside DIR changes) and a wrapper `DIR/perf_analyzer` that starts
   the binary under that loader.
7. Otherwise exit 1, saying what was missing and how to give one: `PERF_ANALYZER=/path/to/it`.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "2.60.0"
MIN_GLIBC = (2, 38)
DEBIAN_SUITE = "trixie"  # the first Debian release with glibc >= 2.38 (2.41)
DEBIAN_PACKAGES = ("libc6", "libstdc++6", "libgcc-s1")
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# machine -> (Debian architecture, multiarch triplet, loader file name)
ARCHES = {
    "x86_64": ("amd64", "x86_64-linux-gnu", "ld-linux-x86-64.so.2"),
    "aarch64": ("arm64", "aarch64-linux-gnu", "ld-linux-aarch64.so.1"),
}
PY_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
GIVE_ONE = "give one: PERF_ANALYZER=/path/to/perf_analyzer"
EXIT_MISSING = 1
EXIT_GIVEN_BROKEN = 2


class Missing(Exception):
    """perf_analyzer cannot be had here; the message says why."""


@dataclass
class Finder:
    """One search: the environment it reads and the steps it took (for the failure message)."""

    env: Mapping[str, str]
    cache: Path
    python: str = sys.executable
    notes: list[str] = field(default_factory=list)

    def log(self, text: str) -> None:
        print(f"perf_analyzer: {text}", file=sys.stderr)

    def find(self) -> Path | None:
        """An installed perf_analyzer that runs, from steps 2-4; None when there is none."""
        candidates: list[tuple[str, Path]] = []
        on_path = shutil.which("perf_analyzer", path=self.env.get("PATH", os.defpath))
        if on_path:
            candidates.append(("on PATH", Path(on_path)))
        pip_binary = installed_binary(self.python)
        if pip_binary is not None:
            candidates.append((f"installed in {Path(self.python).parent.parent}", pip_binary))
        candidates.append((f"in {self.cache}", self.cache / "perf_analyzer"))
        for where, path in candidates:
            if not path.exists():
                continue
            if wheel_script(path):
                self.notes.append(
                    f"{path} ({where}) is the wheel's wrapper, which drops exit codes"
                )
                continue
            problem = broken(path)
            if problem is None:
                self.log(f"found {where}: {path}")
                return path
            self.notes.append(f"{path} ({where}) does not run: {problem}")
        return None

    def install(self) -> Path:
        """Steps 5 and 6; raises Missing with every reason when neither can be done here."""
        machine = platform.machine()
        glibc = glibc_version()
        if machine not in ARCHES:
            raise Missing(f"no perf-analyzer {VERSION} wheel for {machine} on PyPI")
        if glibc is None:
            raise Missing("this system's C library is not glibc; the perf-analyzer wheel needs it")
        if glibc >= MIN_GLIBC:
            self.log(f"installing perf-analyzer=={VERSION} with {self.python} -m pip")
            run([self.python, "-m", "pip", "install", "--quiet", f"perf-analyzer=={VERSION}"])
            binary = installed_binary(self.python)
            if binary is None:
                raise Missing(f"pip installed perf-analyzer=={VERSION} but left no binary")
            return binary
        shown = ".".join(map(str, glibc))
        self.log(
            f"glibc {shown} is older than the wheel's {'.'.join(map(str, MIN_GLIBC))}: "
            f"installing it into {self.cache} with Debian {DEBIAN_SUITE}'s libc beside it"
        )
        return install_private(self.cache, self.python, machine)


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the running glibc, or None on another C library."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        return None
    name, _, number = text.partition(" ")
    if name != "glibc":
        return None
    parts = number.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def installed_binary(python: str) -> Path | None:
    """The binary a `pip install perf-analyzer` left in `python`'s environment, if any."""
    try:
        found = subprocess.run(
            [
                python,
                "-c",
                "import importlib.util as u; s = u.find_spec('perf_analyzer'); "
                "print(s.submodule_search_locations[0] if s and s.submodule_search_locations "
                "else '')",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    binary = Path(found) / "bin" / "perf_analyzer" if found else None
    return binary if binary is not None and binary.is_file() else None


def wheel_script(path: Path) -> bool:
    """Whether `path` is the wheel's Python entry point (it exits 0 whatever the binary does)."""
    try:
        with path.open("rb") as handle:
            return b"perf_analyzer.cli" in handle.read(4096)
    except OSError:
        return False


def broken(path: Path) -> str | None:
    """None when `path --version` runs and names Perf Analyzer, else why not (one line)."""
    try:
        done = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return str(error)
    if done.returncode == 0 and "Perf Analyzer" in done.stdout + done.stderr:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return f"exit {done.returncode}: {lines[-1] if lines else 'no output'}"


def run(
    command: Sequence[str], cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> None:
    """Runs an installation step; Missing with its last output line when it fails."""
    try:
        done = subprocess.run(
            list(command),
            cwd=cwd,
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            timeout=900,
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise Missing(f"`{' '.join(command)}` could not run: {error}") from error
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if "WARNING" not in line]
        last = lines[-1].strip() if lines else "no output"
        raise Missing(f"`{' '.join(command)}` failed: {last}")


def mirror() -> str | None:
    """The Debian mirror apt already uses here (not the security one)."""
    lines: list[str] = []
    for sources in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        lines += [
            ln.split()[1] for ln in sources.read_text().splitlines() if ln.startswith("URIs:")
        ]
    listing = Path("/etc/apt/sources.list")
    if listing.exists():
        lines += [ln.split()[1] for ln in listing.read_text().splitlines() if ln.startswith("deb ")]
    for uri in lines:
        if "security" not in uri:
            return uri
    return None


def install_private(cache: Path, python: str, machine: str) -> Path:
    """Step 6: the wheel's binary under a newer Debian's loader and libraries, all in `cache`."""
    missing = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise Missing(f"glibc is older than 2.38 and {' and '.join(missing)} {verb} not here")
    if not KEYRING.exists():
        raise Missing(f"glibc is older than 2.38 and {KEYRING} is not here")
    uri = mirror()
    if uri is None:
        raise Missing("glibc is older than 2.38 and no Debian mirror is set in /etc/apt")
    debian_arch, triplet, loader = ARCHES[machine]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="install-") as scratch:
        work = Path(scratch)
        wheels = work / "wheel"
        run(
            [python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
            + ["--platform", f"manylinux_2_38_{machine}", "--python-version", PY_VERSION]
            + ["-d", str(wheels), f"perf-analyzer=={VERSION}"]
        )
        wheel = next(wheels.glob("perf_analyzer-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            member = next(n for n in archive.namelist() if n.endswith("/bin/perf_analyzer"))
            binary = cache / "perf_analyzer.bin"
            binary.write_bytes(archive.read(member))
        binary.chmod(0o755)

        apt = work / "apt"
        for sub in ("sources", "lists/partial", "archives/partial", "debs"):
            (apt / sub).mkdir(parents=True, exist_ok=True)
        (apt / "sources" / f"{DEBIAN_SUITE}.sources").write_text(
            f"Types: deb\nURIs: {uri}\nSuites: {DEBIAN_SUITE}\nComponents: main\n"
            f"Signed-By: {KEYRING}\n"
        )
        (apt / "apt.conf").write_text(
            f'Dir::Etc::SourceList "/dev/null";\nDir::Etc::SourceParts "{apt}/sources";\n'
            'Dir::Etc::Preferences "/dev/null";\nDir::Etc::PreferencesParts "/dev/null";\n'
            f'Dir::State::Lists "{apt}/lists";\nDir::Cache::Archives "{apt}/archives";\n'
            f'APT::Architecture "{debian_arch}";\n'
        )
        apt_env = {**os.environ, "APT_CONFIG": str(apt / "apt.conf")}
        run(["apt-get", "-q", "update"], env=apt_env)
        run(["apt-get", "-q", "download", *DEBIAN_PACKAGES], cwd=apt / "debs", env=apt_env)
        libs = cache / "libs"
        shutil.rmtree(libs, ignore_errors=True)
        for deb in sorted((apt / "debs").glob("*.deb")):
            run(["dpkg-deb", "-x", str(deb), str(libs)])
    lib = libs / "usr" / "lib" / triplet
    wrapper = cache / "perf_analyzer"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# perf_analyzer under Debian's newer loader and libc (harness/perf_analyzer.py wrote it)\n"
        f'exec "{lib / loader}" --library-path "{lib}:/lib/{triplet}:/usr/lib/{triplet}" '
        f'"{binary}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def default_cache(env: Mapping[str, str]) -> Path:
    """$PERF_ANALYZER_DIR, else perf-analyzer under the user's cache folder."""
    if env.get("PERF_ANALYZER_DIR"):
        return Path(env["PERF_ANALYZER_DIR"])
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return Path(base) / "perf-analyzer"


def locate(env: Mapping[str, str], cache: Path, install: bool, python: str) -> Path:
    """The path of a perf_analyzer that runs; exits with a message when there is none."""
    finder = Finder(env=env, cache=cache, python=python)
    given = env.get("PERF_ANALYZER")
    if given:
        problem = broken(Path(given))
        if problem is not None:
            finder.log(f"PERF_ANALYZER={given} does not run ({problem}): fix or unset it")
            raise SystemExit(EXIT_GIVEN_BROKEN)
        return Path(given)
    found = finder.find()
    if found is not None:
        return found
    if not install:
        finder.log(
            f"none installed ({'; '.join(finder.notes) or 'looked on PATH and in the cache'})"
        )
        raise SystemExit(EXIT_MISSING)
    try:
        installed = finder.install()
    except Missing as error:
        for note in finder.notes:
            finder.log(f"passed over: {note}")
        finder.log(f"cannot install it here: {error}; {GIVE_ONE}")
        raise SystemExit(EXIT_MISSING) from None
    problem = broken(installed)
    if problem is not None:
        finder.log(f"installed {installed} but it does not run ({problem}); {GIVE_ONE}")
        raise SystemExit(EXIT_MISSING)
    finder.log(f"installed {installed}")
    return installed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir", type=Path, help="the cache folder (default ~/.cache/perf-analyzer)"
    )
    parser.add_argument("--no-install", action="store_true", help="only look, install nothing")
    args = parser.parse_args(argv)
    env = os.environ
    cache = args.dir or default_cache(env)
    print(locate(env, cache, install=not args.no_install, python=sys.executable))
    return 0


if __name__ == "__main__":
    sys.exit(main())
