"""`make image` and `make image-run` (deploy/docker/build-image.sh, run-image.sh): the scripts
agree with the Dockerfile, and, where an image has been built on this machine, the built image's
config is the Dockerfile's and its entrypoint serves the example repository from its own root
filesystem. Building takes minutes and root, so `make test` does not build; the checks of a
built image skip, saying so, where none is there."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from examples.build_repository import build_repository
from tests.deploy.entrypoint import ROOT
from tests.deploy.test_image import DEFAULTS, exec_form, final_stage, instructions, tool

BUILD = ROOT / "deploy" / "docker" / "build-image.sh"
RUN = ROOT / "deploy" / "docker" / "run-image.sh"
IMAGE_DIR = Path(os.environ.get("IMAGE_DIR", ROOT / ".image"))
TAG = "ascend-serve:0.1.0"


def script_value(script: Path, name: str) -> str:
    """A plain `name=value` assignment in the script."""
    match = re.search(rf"^{name}=(\S+)$", script.read_text(), re.M)
    assert match, f"{name}= not in {script.name}"
    return match[1]


def oci_config(layout: Path, tag: str) -> dict[str, Any]:
    """The image config of `tag` in an OCI image layout (index -> manifest -> config)."""

    def blob(digest: str) -> dict[str, Any]:
        algorithm, value = digest.split(":")
        return json.loads((layout / "blobs" / algorithm / value).read_text())

    index = json.loads((layout / "index.json").read_text())
    (manifest,) = [
        m
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag
    ]
    return blob(blob(manifest["digest"])["config"]["digest"])


def built_layout() -> Path:
    layout = IMAGE_DIR / "oci"
    if not (layout / "index.json").exists():
        pytest.skip(f"no image built on this machine ({layout}): `make image` builds one")
    return layout


@pytest.mark.parametrize("script", [BUILD, RUN], ids=lambda p: p.name)
def test_shellcheck_finds_nothing_in_the_image_scripts(script: Path):
    result = subprocess.run([tool("shellcheck"), str(script)], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, "")


def test_make_image_builds_this_dockerfile_on_a_base_with_the_default_bases_python():
    text = BUILD.read_text()
    assert "--file Dockerfile ." in text  # the repository's Dockerfile, not a copy
    assert '--build-arg BASE_IMAGE="$base"' in text  # the Dockerfile's own argument
    (default,) = [args for op, args in instructions() if op == "ARG" and "BASE_IMAGE=" in args]
    python = re.fullmatch(r"BASE_IMAGE=python:(\d+\.\d+)-slim", default)
    assert python, default
    # The venv built in the first stage runs on the same Python as with the default base.
    assert script_value(BUILD, "python_version") == python[1]
    assert script_value(BUILD, "tag") == "${IMAGE_TAG:-" + TAG + "}"
    makefile = (ROOT / "Makefile").read_text()
    assert "image:\n\tbash deploy/docker/build-image.sh\n" in makefile
    assert "image-run: models\n\tbash deploy/docker/run-image.sh\n" in makefile


def test_image_outputs_are_ignored_by_git_and_left_out_of_the_build_context():
    out = script_value(BUILD, "out")
    assert out == "${IMAGE_DIR:-.image}"
    assert "/.image/" in (ROOT / ".gitignore").read_text().splitlines()
    # buildah reads the context: without this, the image store would be sent into itself.
    assert ".image" in (ROOT / ".dockerignore").read_text().splitlines()


def test_the_built_image_is_the_dockerfiles():
    config = oci_config(built_layout(), TAG)
    stage = final_stage()
    (user,) = [args for op, args in stage if op == "USER"]
    (workdir,) = [args for op, args in stage if op == "WORKDIR"]
    image = config["config"]
    assert image["Entrypoint"] == exec_form(stage, "ENTRYPOINT")
    assert image["Cmd"] == exec_form(stage, "CMD")
    assert (image["User"], image["WorkingDir"]) == (user, workdir)
    assert sorted(image["ExposedPorts"]) == [
        f"{port}/tcp" for port in (DEFAULTS.http_port, DEFAULTS.grpc_port, DEFAULTS.metrics_port)
    ]
    assert "ASCEND_SERVE_VARIANT=cpu" in image["Env"]
    assert config["os"] == "linux"


def test_the_docker_archive_keeps_the_healthcheck():
    built_layout()
    archive = IMAGE_DIR / f"{TAG.replace(':', '-')}.tar"
    with tarfile.open(archive) as tar:
        (manifest,) = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        # What `docker load` lists as ascend-serve:0.1.0, the name `docker run` takes.
        assert f"docker.io/library/{TAG}" in manifest["RepoTags"]
        config = json.load(tar.extractfile(manifest["Config"]))  # type: ignore[arg-type]
    check = config["config"]["Healthcheck"]["Test"]
    assert check[0] == "CMD" and check[1:3] == ["python3", "-c"]
    assert f"http://127.0.0.1:{DEFAULTS.http_port}/v2/health/ready" in check[3]


@pytest.mark.slow
def test_make_image_run_serves_the_example_repository_from_the_image(tmp_path):
    built_layout()
    tools = ("umoci", "unshare", "chroot", "curl", "jq")
    missing = [name for name in tools if not shutil.which(name)]
    if missing:
        pytest.skip(f"run-image.sh needs {', '.join(missing)}")
    if os.geteuid() != 0:
        pytest.skip("run-image.sh needs root (mount and pid namespaces, chroot)")
    models = tmp_path / "models"
    build_repository(models)  # readable to the image's uid 1000 (examples/common.py)
    result = subprocess.run(
        ["bash", str(RUN)],
        env={**os.environ, "MODEL_REPOSITORY": str(models), "IMAGE_DIR": str(IMAGE_DIR)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "as 1000:1000 in /models: ascend-serve-entrypoint --model-repository /models" in out
    assert ", uid 1000, root " + str(IMAGE_DIR / "bundle" / "rootfs") in out
    assert "HTTP/1.1 200 OK" in out
    assert '"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]' in out
    assert '"model_name":"pipeline"' in out
    assert 'nv_inference_count{model="simple",version="1"} 1' in out
    assert out.rstrip().endswith("run-image: ok")
