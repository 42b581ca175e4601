"""Run the image's entrypoint script (deploy/docker/entrypoint.sh) directly, as the container
would, with the `ascend-serve` console script on PATH and, for the Ascend variant, a stand-in
CANN `set_env.sh` that puts the pyACL emulator on PYTHONPATH (what the real one does for pyACL).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path

from tests.support.om_fixtures import EMULATOR_PATH

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "docker" / "entrypoint.sh"


def console_script(bin_dir: Path) -> Path:
    """`ascend-serve` in bin_dir, calling the function pyproject's [project.scripts] names."""
    (script,) = entry_points(group="console_scripts", name="ascend-serve")
    module, function = script.value.split(":")
    path = bin_dir / "ascend-serve"
    path.write_text(
        f"#!/bin/sh\nexec '{sys.executable}' -c 'import sys; from {module} import "
        f'{function}; sys.exit({function}())\' "$@"\n'
    )
    path.chmod(0o755)
    return path


def fake_cann(root: Path) -> Path:
    """<root>/ascend-toolkit/set_env.sh: exports what the real one does, pointing pyACL's path
    at the emulator."""
    script = root / "ascend-toolkit" / "set_env.sh"
    script.parent.mkdir(parents=True)
    script.write_text(
        f'export ASCEND_TOOLKIT_HOME="{script.parent}"\n'
        f'export PYTHONPATH="{EMULATOR_PATH}:$PYTHONPATH"\n'
        'export LD_LIBRARY_PATH="$ASCEND_TOOLKIT_HOME/lib64:$LD_LIBRARY_PATH"\n'
    )
    return script


def entrypoint_env(
    bin_dir: Path, variant: str, set_env: Path | None = None, extra: Mapping[str, str] = ()
) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "ASCEND_SET_ENV", "LD_LIBRARY_PATH")
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
        PYTHONPATH=str(ROOT),
        ASCEND_SERVE_VARIANT=variant,
        **dict(extra),
    )
    if set_env is not None:
        env["ASCEND_SET_ENV"] = str(set_env)
    return env


def run_entrypoint(
    args: Sequence[str], env: Mapping[str, str], timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ENTRYPOINT), *args],
        env=dict(env),
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_entrypoint(
    args: Sequence[str], env: Mapping[str, str], log_path: Path
) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            ["bash", str(ENTRYPOINT), *args],
            env=dict(env),
            cwd=str(ROOT),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
