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
import re
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
# Where a test.sh may name Triton's CI model store outright instead of taking $DATADIR.
CI_DATADIR = "/data/inferenceserver/${REPO_VERSION}"
# The $DATADIR repositories a suite may copy from, each made by the qa folder's own generators
# (ONNX models only): (folder, [(script, flags, subfolder)]).
GENERATED = {
    "qa_model_repository": [("gen_qa_models.py", ["--onnx"], "")],
    "qa_variable_model_repository": [("gen_qa_models.py", ["--onnx", "--variable"], "")],
    "qa_identity_model_repository": [("gen_qa_identity_models.py", ["--onnx"], "")],
    "qa_sequence_model_repository": [("gen_qa_sequence_models.py", ["--onnx"], "")],
    "qa_ensemble_model_repository": [("gen_qa_models.py", ["--ensemble"], "qa_model_repository")],
}
# Suites whose test.sh is a list of cases, one per `LOG_IDX` step, where some cases need model
# kinds ascend-serve does not serve: only the cases that need ONNX, Python or identity models run.
CASE_LISTS = {"L0_lifecycle"}
CASE_MARK = "LOG_IDX=$((LOG_IDX+1))"
OTHER_KINDS = re.compile(
    r"\b(libtorch|plan|openvino|savedmodel|graphdef|tensorflow|pytorch|tensorrt|cuda)"
)
# A case that makes its own model folders; one that does not uses the previous case's.
OWN_MODELS = re.compile(r"rm -[rf]+ models|mkdir models")
# Cases that cannot pass here for a reason we chose (README, "NVIDIA's qa suites") or for a file
# Triton's CI puts beside the suite that the repository's qa folder lacks: case -> why.
SHUTDOWN_DEVIATION = (
    "deviation: during shutdown ascend-serve keeps its listeners open until in-flight requests "
    "and live sequences finish and refuses new requests (gRPC UNAVAILABLE, HTTP 503 'Server "
    "exiting'); Triton closes its gRPC listener at once (connection refused) and serves new "
    "requests on HTTP connections already open until they close"
)
NOT_RUN = {
    "L0_lifecycle": {
        "test_shutdown_dynamic": SHUTDOWN_DEVIATION,
        "test_shutdown_ensemble": SHUTDOWN_DEVIATION,
        "test_shutdown_sequence": SHUTDOWN_DEVIATION + "; its model needs Triton's C++ `sequence` "
        "test backend",
        "test_shutdown_with_live_connection": SHUTDOWN_DEVIATION,
        "test_shutdown_while_loading": "checks the order of two C++ function names in Triton's "
        "verbose log (OnLoadFinal(), AsyncUnload())",
        "test_model_reload_fail": "needs libtriton_identity.so, a CPU-only build of Triton's "
        "identity backend that Triton's CI puts beside the suite",
    }
}
# A C++ unit test of Triton's own internals, built with Triton (L0_batcher's
# instance_queue_test): "# name_test: what it checks" up to the `set -e` that closes it.
CORE_UNIT_TEST = re.compile(r"^# (\w+_test): .*?^set -e\n", re.MULTILINE | re.DOTALL)
sys.path.insert(0, str(ROOT))
from server.core.inference_core import SERVER_VERSION  # noqa: E402  what the qa tests compare metadata with


def prepare(qa_dir: Path, suite: str, scratch: Path, only: str | None = None) -> Path:
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
    text = script.read_text().replace("/opt/tritonserver", str(scratch / "triton"))
    text = text.replace(f"DATADIR={CI_DATADIR}", f"DATADIR={scratch / 'data'}")
    text = without_core_unit_tests(text, scratch / "qa" / suite)
    if suite in CASE_LISTS:
        text, left_out = select_cases(suite, text, only)
        for name, why in left_out:
            print(f"    {suite}: not run: {name}: {why}", flush=True)
    script.write_text(text)
    return scratch / "qa" / suite


def without_core_unit_tests(script: str, suite_dir: Path) -> str:
    """test.sh without the C++ unit tests of Triton's internals that are not in the qa folder:
    they test Triton's own classes, not what a server answers."""

    def drop(match: re.Match) -> str:
        if (suite_dir / match.group(1)).exists():
            return match.group(0)
        print(
            f"    {suite_dir.name}: {match.group(1)} is a C++ unit test of Triton's own "
            f"internals, built with Triton: not run",
            flush=True,
        )
        return ""

    return CORE_UNIT_TEST.sub(drop, script)


def select_cases(
    suite: str, script: str, only: str | None = None
) -> tuple[str, list[tuple[str, str]]]:
    """test.sh without the cases that cannot run here, and (case, why) for each case left out:
    cases that copy in (or reuse) models of other kinds, the NOT_RUN ones, and with `only` the
    cases whose name does not contain it."""
    footer_at = script.rindex("\nif [ $RET -eq 0 ]")  # the verdict, after the last case
    header, cases = split_cases(script[:footer_at])
    kept, left_out = [header], []
    other = False
    for case in cases:
        if OWN_MODELS.search(case) or OTHER_KINDS.search(case):
            other = bool(OTHER_KINDS.search(case))
        name = case_name(case)
        if other:
            left_out.append((name, "needs TensorRT, PyTorch, OpenVINO, TensorFlow or CUDA"))
        elif name in NOT_RUN.get(suite, {}):
            left_out.append((name, NOT_RUN[suite][name]))
        elif only and only not in name:
            left_out.append((name, f"not named by --only {only}"))
        else:
            kept.append(case)
    return "".join(kept) + script[footer_at:], left_out


def split_cases(script: str) -> tuple[str, list[str]]:
    """The header and the cases of a test.sh, each case from its first comment to the next
    case's: a LOG_IDX step inside a loop does not start a case, the next comment does."""
    units = script.split(CASE_MARK)
    start = script.index("\n# ", script.index("LOG_IDX=0"))  # the header ends, case 0 begins
    header, cases = script[:start], [units[0][start:]]
    for unit in units[1:]:
        comment = re.search(r"^# ", unit, re.MULTILINE)
        at = comment.start() if comment else len(unit)
        cases[-1] += CASE_MARK + unit[:at]
        if comment:
            cases.append(unit[at:])
    return header, cases


def case_name(case: str) -> str:
    """The unittest a case runs, else its first comment."""
    named = re.search(r"LifeCycleTest\.(\w+)", case)
    comment = re.search(r"^# (.+)$", case, re.MULTILINE)
    return named.group(1) if named else comment.group(1) if comment else "(unnamed)"


def generate_models(scratch: Path, script_text: str) -> None:
    """The $DATADIR repositories the suite's test.sh names, made by the qa folder's generators."""
    common = scratch / "qa" / "common"
    for folder, steps in GENERATED.items():
        if folder not in script_text:
            continue
        for script, flags, subfolder in steps:
            target = scratch / "data" / folder / subfolder
            subprocess.run(
                [sys.executable, script, *flags, f"--models_dir={target}"],
                cwd=common,
                check=True,
                stdout=subprocess.DEVNULL,
            )


def run(
    qa_dir: Path,
    suite: str,
    keep: bool = False,
    extra_env: dict[str, str] | None = None,
    only: str | None = None,
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
        suite_dir = prepare(qa_dir, suite, scratch, only)
        generate_models(scratch, (suite_dir / "test.sh").read_text())
        env = dict(
            os.environ,
            TRITON_DIR=str(scratch / "triton"),
            DATADIR=str(scratch / "data"),
            TRITON_SERVER_VERSION=SERVER_VERSION,
            BACKENDS=BACKENDS,
            TEST_SYSTEM_SHARED_MEMORY="0",
            TEST_CUDA_SHARED_MEMORY="0",
            TEST_VALGRIND="0",
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            PYTHONPATH=os.pathsep.join(
                filter(None, [str(scratch / "qa" / "common"), os.environ.get("PYTHONPATH")])
            ),
        )
        env.update(extra_env or {})
        print(f"=== {suite} in {suite_dir}", flush=True)
        output = scratch / "test.sh.log"  # beside the suite: its test.sh removes its own *.log
        with open(output, "w") as log:
            code = subprocess.call(
                ["bash", "test.sh", TRITON_VERSION],
                cwd=suite_dir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        passed, failed, swallowed = summarize([output, *suite_dir.glob("*.log")])
        for line in output.read_text(errors="replace").splitlines():
            if "Failed" in line or "FAILED" in line or "No such file" in line:
                print(f"    {line.strip()}", flush=True)
        print(
            f"    unittest cases: {passed} OK, {failed} FAILED; {swallowed} exception(s) in "
            f"client threads (which the qa harness does not count)",
            flush=True,
        )
        if (swallowed or failed) and code == 0:
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
    parser.add_argument(
        "--qa-dir",
        type=Path,
        default=os.environ.get("ASCEND_QA_DIR"),
        help="the qa folder of a triton-inference-server/server checkout (default: $ASCEND_QA_DIR)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument(
        "--only",
        help="run only the cases whose name contains this (suites "
        "that are lists of cases, such as L0_lifecycle)",
    )
    parser.add_argument("suites", nargs="+")
    args = parser.parse_args(argv)
    if args.qa_dir is None:
        print("no qa folder given (--qa-dir or ASCEND_QA_DIR): nothing to run", file=sys.stderr)
        return 2
    failed = [
        suite
        for suite in args.suites
        if run(args.qa_dir.resolve(), suite, args.keep, only=args.only)
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
