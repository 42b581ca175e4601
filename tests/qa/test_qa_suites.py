"""NVIDIA's qa suites through tests/qa/run_qa.py, when a qa folder is given ($ASCEND_QA_DIR);
skipped otherwise (make test fetches nothing). The suites take minutes each."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run_qa  # noqa: E402

QA_DIR = os.environ.get("ASCEND_QA_DIR")
SUITES = os.environ.get("ASCEND_QA_SUITES", "L0_model_queue").split()


@pytest.mark.skipif(not QA_DIR, reason="set ASCEND_QA_DIR to a triton-inference-server/server "
                                       "checkout's qa folder to run NVIDIA's qa suites")
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("suite", SUITES)
def test_nvidia_qa_suite(suite: str) -> None:
    assert run_qa.run(Path(QA_DIR).resolve(), suite) == 0  # type: ignore[arg-type]


def test_the_tritonserver_shim_drops_flags_we_do_not_have(tmp_path: Path) -> None:
    """The shim execs the server with Triton's command line minus unknown flags: checked by
    pointing it at a Python that prints its arguments."""
    import subprocess

    printer = tmp_path / "python"
    printer.write_text("#!/bin/sh\necho \"$@\"\n")
    printer.chmod(0o755)
    shim = Path(run_qa.SHIM)
    result = subprocess.run(
        [sys.executable, str(shim), "--model-repository=/m", "--backend-directory=/b",
         "--allow-client-shm", "true", "--strict-readiness=false", "--http-port", "9"],
        env=dict(os.environ, ASCEND_QA_PYTHON=str(printer)), capture_output=True, text=True,
        timeout=60)
    assert result.stdout.split() == ["-m", "server", "--model-repository=/m",
                                     "--strict-readiness=false", "--http-port", "9"]
    assert "--backend-directory=/b --allow-client-shm true" in result.stderr
