"""Run one of NVIDIA's qa suites (qa/L0_*) against ascend-serve, unchanged.

    .venv/bin/python tests/qa/run_qa.py --qa-dir /path/to/server/qa L0_model_queue [...]
    make qa QA_DIR=/path/to/server/qa QA_SUITES="L0_model_queue L0_batcher"

The suite's own test.sh runs in a scratch copy of the qa folder (it writes logs and models next
to itself). Its `tritonserver` is tests/qa/tritonserver, which starts this server with the same
flags; `backend: "identity"` models run on backends/identity.py, Triton's identity backend's
stand-in. Nothing is fetched: bring a checkout of the triton-inference-server/server repository's
qa folder. The exit status is the suite's. Needs bash, jq and the Python packages the qa tests
import (tritonclient, numpy, ml_dtypes: the `qa` extra).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIM = Path(__file__).resolve().parent / "tritonserver"
# What every suite shares, copied beside it (test.sh refers to ../common and ../custom_models).
SHARED = ("common", "custom_models", "python_models")
# The backends these suites may use here: ONNX Runtime and Python (no TensorRT or PyTorch).
BACKENDS = "onnx python"
TRITON_VERSION = "2.51.0"  # the release the suites were checked against (REPO_VERSION)
sys.path.insert(0, str(ROOT))
from server.core import SERVER_VERSION  # noqa: E402  what the qa tests compare metadata with


def prepare(qa_dir: Path, suite: str, scratch: Path) -> Path:
    """A copy of the suite and what it shares, and a TRITON_DIR whose bin/tritonserver is us."""
    for name in (*SHARED, suite):
        source = qa_dir / name
        if source.is_dir():
            shutil.copytree(source, scratch / "qa" / name, symlinks=True)
    bin_dir = scratch / "triton" / "bin"
    bin_dir.mkdir(parents=True)
    (scratch / "triton" / "backends").mkdir()
    server = bin_dir / "tritonserver"
    server.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SHIM}" "$@"\n')
    server.chmod(0o755)
    # Some suites name Triton's install path outright instead of $TRITON_DIR: point it here
    # (the path only; nothing else in test.sh changes).
    script = scratch / "qa" / suite / "test.sh"
    script.write_text(script.read_text().replace("/opt/tritonserver", str(scratch / "triton")))
    return scratch / "qa" / suite


def generate_models(scratch: Path) -> None:
    """The ONNX models the suites read from $DATADIR, made by the qa folder's own generator."""
    common = scratch / "qa" / "common"
    for script, extra, folder in (
            ("gen_qa_models.py", [], "qa_model_repository"),
            ("gen_qa_models.py", ["--variable"], "qa_variable_model_repository"),
            ("gen_qa_identity_models.py", [], "qa_identity_model_repository")):
        subprocess.run([sys.executable, script, "--onnx", *extra,
                        f"--models_dir={scratch / 'data' / folder}"], cwd=common, check=True,
                       stdout=subprocess.DEVNULL)


def run(qa_dir: Path, suite: str, keep: bool = False, extra_env: dict[str, str] | None = None
        ) -> int:
    if not (qa_dir / suite / "test.sh").is_file():
        print(f"no {suite}/test.sh under {qa_dir}", file=sys.stderr)
        return 2
    missing = [tool for tool in ("bash", "jq") if shutil.which(tool) is None]
    if missing:
        print(f"{suite}: needs {', '.join(missing)} on PATH", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix=f"qa-{suite}-"))
    try:
        suite_dir = prepare(qa_dir, suite, scratch)
        if "qa_model_repository" in (suite_dir / "test.sh").read_text():
            generate_models(scratch)
        env = dict(os.environ, TRITON_DIR=str(scratch / "triton"),
                   DATADIR=str(scratch / "data"), TRITON_SERVER_VERSION=SERVER_VERSION,
                   BACKENDS=BACKENDS, TEST_SYSTEM_SHARED_MEMORY="0",
                   TEST_CUDA_SHARED_MEMORY="0", TEST_VALGRIND="0",
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   PYTHONPATH=os.pathsep.join(
                       filter(None, [str(scratch / "qa" / "common"),
                                     os.environ.get("PYTHONPATH")])))
        env.update(extra_env or {})
        print(f"=== {suite} in {suite_dir}", flush=True)
        output = scratch / "test.sh.log"  # beside the suite: its test.sh removes its own *.log
        with open(output, "w") as log:
            code = subprocess.call(["bash", "test.sh", TRITON_VERSION], cwd=suite_dir, env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
        passed, failed, swallowed = summarize([output, *suite_dir.glob("*.log")])
        for line in output.read_text(errors="replace").splitlines():
            if "Failed" in line or "FAILED" in line or "No such file" in line:
                print(f"    {line.strip()}", flush=True)
        print(f"    unittest cases: {passed} OK, {failed} FAILED; {swallowed} exception(s) in "
              f"client threads (which the qa harness does not count)", flush=True)
        if swallowed and code == 0:
            code = 1
        print(f"=== {suite}: {'PASSED' if code == 0 else f'FAILED (exit {code})'}", flush=True)
        if code != 0 or keep:
            print(f"    logs kept in {suite_dir} (test.sh's output: {output})", flush=True)
            keep = True
        return code
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


def summarize(logs: list[Path]) -> tuple[int, int, int]:
    """OK and FAILED unittest runs in the suite's logs, and exceptions raised in client threads
    (qa helpers such as infer_zero assert inside threads, where a failure does not fail the
    unittest case: counted here so that it is not missed)."""
    passed = failed = swallowed = 0
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            passed += line == "OK" or line.startswith("OK (")
            failed += line.startswith("FAILED (")
            swallowed += line.startswith("Exception in thread")
    return passed, failed, swallowed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--qa-dir", type=Path, default=os.environ.get("ASCEND_QA_DIR"),
                        help="the qa folder of a triton-inference-server/server checkout "
                             "(default: $ASCEND_QA_DIR)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("suites", nargs="+")
    args = parser.parse_args(argv)
    if args.qa_dir is None:
        print("no qa folder given (--qa-dir or ASCEND_QA_DIR): nothing to run", file=sys.stderr)
        return 2
    failed = [suite for suite in args.suites if run(args.qa_dir.resolve(), suite, args.keep)]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
