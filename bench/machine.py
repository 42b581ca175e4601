"""The machine description at the top of bench/RESULTS.md (CPUs, memory, versions, load), and
`portable`: report text with this machine's paths taken out."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "onnxruntime",
    "numpy",
    "uvicorn",
    "uvloop",
    "httptools",
    "fastapi",
    "orjson",
    "grpcio",
    "protobuf",
    "tritonclient",
)


def _first(path: str, key: str) -> str:
    """The value of the first `key: value` line of a /proc file."""
    try:
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key:
                return value.strip()
    except OSError:
        pass
    return "unknown"


def _command_output(command: list[str]) -> str:
    try:
        run = subprocess.run(
            command, capture_output=True, text=True, timeout=30, cwd=ROOT, check=False
        )
        return (run.stdout + run.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def machine_info(perf_analyzer: str) -> dict[str, str]:
    def cpu(key: str) -> str:
        return _first("/proc/cpuinfo", key)

    versions = []
    for name in PACKAGES:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    mem_kib = _first("/proc/meminfo", "MemTotal").split()[0]
    memory = f"{int(mem_kib) / 2**20:.1f} GiB" if mem_kib.isdigit() else "unknown"
    return {
        "nproc": f"{os.cpu_count()} (usable by this process: {len(os.sched_getaffinity(0))})",
        "CPU": f"{cpu('model name')} (family {cpu('cpu family')} model {cpu('model')}, "
        f"{cpu('cpu MHz')} MHz, cache {cpu('cache size')})",
        "memory": memory,
        "OS": f"{platform.system()} {platform.release()}",
        "Python": f"{platform.python_version()} ({sys.executable})",
        "packages": ", ".join(versions),
        "perf_analyzer": f"{_command_output([perf_analyzer, '--version'])} ({perf_analyzer})",
        "git": _command_output(["git", "describe", "--always", "--dirty"]),
    }


def portable(text: str, perf_analyzer: str = "", root: Path = ROOT) -> str:
    """`text` without this machine's paths, so reports from different machines diff cleanly:
    the perf_analyzer binary as `$PERF_ANALYZER`, paths in the checkout relative to its root
    (the root itself as `.`), and other paths in the home directory under `~`."""
    if "/" in perf_analyzer:  # a bare name found on PATH is no machine path
        text = text.replace(perf_analyzer, "$PERF_ANALYZER")
    text = _replace_prefix(text, str(root), inside="", itself=".")
    return _replace_prefix(text, str(Path.home()), inside="~/", itself="~")


def _replace_prefix(text: str, prefix: str, inside: str, itself: str) -> str:
    """Paths under `prefix` as `inside` + the rest, `prefix` alone as `itself`; a path that only
    contains or extends it (/x/srv/main, /srv/main2 for /srv/main) is left alone."""
    if prefix in ("", "/"):
        return text
    pattern = r"(?<![\w.~/-])" + re.escape(prefix) + r"(/|(?![\w.-]))"
    return re.sub(pattern, lambda m: inside if m.group(1) else itself, text)
