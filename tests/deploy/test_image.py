"""The Dockerfile and the image's entrypoint, without a docker daemon: hadolint and shellcheck
clean, the image's command line accepted by the server's own CLI with its defaults, nothing the
build copies left out by .dockerignore, and the entrypoint run directly."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server.cli import build_parser
from tests.deploy.entrypoint import (
    ENTRYPOINT,
    ROOT,
    console_script,
    entrypoint_env,
    fake_cann,
    run_entrypoint,
)

DOCKERFILE = ROOT / "Dockerfile"
DEFAULTS = build_parser().parse_args(["--model-repository", "/models"])


def tool(name: str) -> str:
    """A linter installed by the test extra (its wheel carries the binary)."""
    path = shutil.which(name) or str(Path(sys.executable).parent / name)
    assert Path(path).exists(), f"{name} not installed: pip install -e '.[test]'"
    return path


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def final_stage() -> list[tuple[str, str]]:
    found = instructions()
    last_from = max(i for i, (op, _) in enumerate(found) if op == "FROM")
    return found[last_from:]


def exec_form(stage: list[tuple[str, str]], op: str) -> list[str]:
    (value,) = [args for name, args in stage if name == op]
    return json.loads(value)


def test_hadolint_finds_nothing():
    result = subprocess.run(
        [tool("hadolint"), "--no-color", str(DOCKERFILE)], capture_output=True, text=True
    )
    assert (result.returncode, result.stdout) == (0, "")


def test_shellcheck_finds_nothing_in_the_entrypoint():
    result = subprocess.run([tool("shellcheck"), str(ENTRYPOINT)], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, "")


def test_multi_stage_on_one_base_image_argument():
    froms = [args for op, args in instructions() if op == "FROM"]
    assert froms == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]
    assert ("ARG", "BASE_IMAGE=python:3.11-slim") in instructions()
    stage = final_stage()
    assert ("ARG", "VARIANT=cpu") in stage
    assert any(op == "COPY" and args.startswith("--from=build ") for op, args in stage)
    assert not any(op == "RUN" and "pip install" in args for op, args in stage)
    (env,) = [args for op, args in stage if op == "ENV"]
    assert "ASCEND_SERVE_VARIANT=${VARIANT}" in env  # what the entrypoint reads


def test_runs_as_a_numeric_non_root_user():
    (user,) = [args for op, args in final_stage() if op == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # runAsNonRoot can only verify a numeric user
    assert int(uid) == 1000  # the chart's runAsUser


def test_command_line_parses_with_the_servers_cli_and_ports_are_its_defaults():
    stage = final_stage()
    assert exec_form(stage, "ENTRYPOINT") == ["ascend-serve-entrypoint"]
    assert (
        "COPY",
        f"{ENTRYPOINT.relative_to(ROOT)} /usr/local/bin/ascend-serve-entrypoint",
    ) in stage
    args = build_parser().parse_args(exec_form(stage, "CMD"))
    assert [str(p) for p in args.model_repositories] == ["/models"]
    (exposed,) = [args for op, args in stage if op == "EXPOSE"]
    assert [int(p) for p in exposed.split()] == [
        DEFAULTS.http_port,
        DEFAULTS.grpc_port,
        DEFAULTS.metrics_port,
    ]
    (check,) = [args for op, args in stage if op == "HEALTHCHECK"]
    assert f"http://127.0.0.1:{DEFAULTS.http_port}/v2/health/ready" in check


def test_build_copies_every_package_pyproject_installs():
    text = (ROOT / "pyproject.toml").read_text()
    packages = json.loads(re.search(r"^include = (\[.*\])$", text, re.M)[1])
    modules = json.loads(re.search(r"^py-modules = (\[.*\])$", text, re.M)[1])
    copied = {
        src.rstrip("/")
        for op, args in instructions()
        if op == "COPY" and "--from" not in args
        for src in args.split()[:-1]
    }
    wanted = {
        p.name
        for p in ROOT.iterdir()
        if p.is_dir()
        and (p / "__init__.py").exists()
        and any(fnmatch.fnmatch(p.name, pattern) for pattern in packages)
    }
    assert wanted and wanted <= copied
    assert {f"{m}.py" for m in modules} <= copied
    assert {"pyproject.toml", "README.md"} <= copied  # the build reads both


def test_dockerignore_keeps_everything_the_build_copies():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        result = False
        for pattern in patterns:
            negate = pattern.startswith("!")
            pattern = pattern.lstrip("!")
            parts = Path(path).parts
            if any(fnmatch.fnmatch("/".join(parts[:n]), pattern) for n in range(1, len(parts) + 1)):
                result = not negate
        return result

    sources = [
        src
        for op, args in instructions()
        if op == "COPY" and "--from" not in args
        for src in args.split()[:-1]
    ]
    assert "deploy/docker/entrypoint.sh" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source), f"{source} is copied but .dockerignore leaves it out"
    assert ignored("tests/deploy/crds") and ignored(".git") and ignored("bench/run.py")


def test_entrypoint_runs_the_console_script(tmp_path):
    console_script(tmp_path)
    result = run_entrypoint(["--help"], entrypoint_env(tmp_path, "cpu"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: ascend-serve ")
    assert "--model-repository" in result.stdout


def test_entrypoint_runs_another_command_when_given_one(tmp_path):
    result = run_entrypoint(
        ["sh", "-c", "echo $ASCEND_SERVE_VARIANT"], entrypoint_env(tmp_path, "cpu")
    )
    assert (result.returncode, result.stdout) == (0, "cpu\n")


def test_ascend_entrypoint_sources_set_env(tmp_path):
    set_env = fake_cann(tmp_path / "Ascend")
    result = run_entrypoint(
        ["sh", "-c", 'echo "$ASCEND_TOOLKIT_HOME"'], entrypoint_env(tmp_path, "ascend", set_env)
    )
    assert (result.returncode, result.stdout) == (0, f"{set_env.parent}\n")


def test_ascend_entrypoint_without_cann_says_so(tmp_path):
    missing = tmp_path / "nowhere" / "set_env.sh"
    console_script(tmp_path)
    result = run_entrypoint(
        ["--model-repository", "/models"], entrypoint_env(tmp_path, "ascend", missing)
    )
    assert result.returncode == 1
    assert result.stderr == (
        f"ascend-serve: CANN environment script {missing} not found; build "
        "on a CANN base image or set ASCEND_SET_ENV\n"
    )


def test_the_ascend_image_start_serves_npu_models_with_the_charts_probes(entrypoint_server):
    """Started as entrypoint.sh with the chart's args: the NPU model loaded (so set_env.sh was
    sourced before the server), and the chart's probe targets answer."""
    base = entrypoint_server.base
    assert httpx.get(f"{base}/v2/models/npu_scale/ready").status_code == 200
    assert httpx.get(f"{base}/v2/health/live").status_code == 200
    assert httpx.get(f"{base}/v2/health/ready").status_code == 200
    with grpc.insecure_channel(entrypoint_server.grpc_url) as channel:
        status = (
            health_pb2_grpc.HealthStub(channel)
            .Check(health_pb2.HealthCheckRequest(), timeout=5)
            .status
        )
    assert status == health_pb2.HealthCheckResponse.SERVING
    # bash and the console script exec'd: the server itself holds the pid (PID 1 in a
    # container), so SIGTERM reaches it and starts the drain.
    command = Path(f"/proc/{entrypoint_server.pid}/cmdline").read_bytes().split(b"\0")
    assert any(b"from server.cli import main" in part for part in command)
