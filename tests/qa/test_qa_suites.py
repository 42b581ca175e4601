"""NVIDIA's qa suites through tests/qa/run_qa.py, when a qa folder is given ($ASCEND_QA_DIR);
skipped otherwise (make test fetches nothing). The suites take minutes each."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.qa import run_qa

QA_DIR = os.environ.get("ASCEND_QA_DIR")
SUITES = os.environ.get("ASCEND_QA_SUITES", "L0_model_queue L0_batcher L0_lifecycle").split()


@pytest.mark.skipif(
    not QA_DIR,
    reason="set ASCEND_QA_DIR to a triton-inference-server/server "
    "checkout's qa folder to run NVIDIA's qa suites",
)
@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("suite", SUITES)
def test_nvidia_qa_suite(suite: str) -> None:
    assert run_qa.run(Path(QA_DIR).resolve(), suite) == 0  # type: ignore[arg-type]


def test_the_tritonserver_shim_drops_flags_we_do_not_have(tmp_path: Path) -> None:
    """The shim execs the server with Triton's command line minus unknown flags: checked by
    pointing it at a Python that prints its arguments."""
    import subprocess

    printer = tmp_path / "python"
    printer.write_text('#!/bin/sh\necho "$@"\n')
    printer.chmod(0o755)
    shim = Path(run_qa.SHIM)
    result = subprocess.run(
        [
            sys.executable,
            str(shim),
            "--model-repository=/m",
            "--backend-directory=/b",
            "--allow-client-shm",
            "true",
            "--strict-readiness=false",
            "--http-port",
            "9",
        ],
        env=dict(os.environ, ASCEND_QA_PYTHON=str(printer)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Triton's defaults where ours differ: the metadata name, readiness with no model, file
    # overrides.
    assert result.stdout.split() == [
        "-m",
        "server",
        "--allow-model-load-file-override=true",
        "--ready-with-no-models=true",
        "--id=triton",
        "--model-repository=/m",
        "--strict-readiness=false",
        "--http-port",
        "9",
    ]
    assert "--backend-directory=/b --allow-client-shm true" in result.stderr
    given = subprocess.run(
        [sys.executable, str(shim), "--id=mine", "--model-repository=/m"],
        env=dict(os.environ, ASCEND_QA_PYTHON=str(printer)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "--id=mine" in given.stdout and "--id=triton" not in given.stdout


def test_a_case_list_keeps_only_the_cases_our_backends_can_serve() -> None:
    """L0_lifecycle-style test.sh: a case that copies in models of another kind goes, and so
    does the next case when it reuses those models; a case that makes its own folders stays;
    NOT_RUN cases and, with `only`, unnamed cases go."""
    mark = run_qa.CASE_MARK
    script = mark.join(
        [
            "header\nLOG_IDX=0\n\n# LifeCycleTest.test_first\nrm -fr models\n"
            "cp -r $DATADIR/qa_model_repository/onnx_x models/.\n",
            "\n# LifeCycleTest.test_torch\nrm -fr models\ncp -r $DATADIR/libtorch_x models/.\n",
            "\n# LifeCycleTest.test_reuses_torch_models\npython t.py\n",
            "\n# LifeCycleTest.test_python\nrm -fr models\ncp -r ../python_models/add models/.\n",
            "\n# LifeCycleTest.test_reuses_python_models\npython t.py\n",
            "\n# LifeCycleTest.test_shutdown_dynamic\nrm -fr models\nmkdir models\n"
            "\nif [ $RET -eq 0 ]; then\n  echo passed\nfi\nexit $RET\n",
        ]
    )
    kept, left_out = run_qa.select_cases("L0_lifecycle", script)
    assert [name for name, _ in left_out] == [
        "test_torch",
        "test_reuses_torch_models",
        "test_shutdown_dynamic",
    ]
    assert "deviation" in left_out[2][1]
    assert kept.startswith("header\nLOG_IDX=0\n") and kept.endswith("fi\nexit $RET\n")
    assert all(f"test_{n}" in kept for n in ("first", "python", "reuses_python_models"))
    assert "libtorch" not in kept and kept.count(mark) == 3  # each case ends with its step
    kept, left_out = run_qa.select_cases("L0_lifecycle", script, only="python")
    assert "test_first" not in kept and "test_reuses_python_models" in kept
    assert kept.count(mark) == 2 and kept.endswith("exit $RET\n")
