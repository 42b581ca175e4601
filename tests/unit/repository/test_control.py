"""Model control flags, config file names that must stay inside the model directory, and
strict readiness over the registry's states."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from examples.build_repository import simple_config
from protocol.proto.model_config_pb2 import ModelConfig
from repository.config import ConfigError, validate
from repository.manager import ManagerSettings, ModelManager, plausible_name
from repository.registry import ModelRegistry, ModelState, VersionRecord
from server.cli import settings_from_args
from server.core.inference_core import InferenceCore
from server.core.inference_path import InferencePath
from server.settings import ServerSettings


def test_control_flags_parse_with_triton_names(tmp_path: Path) -> None:
    settings = settings_from_args(
        [
            "--model-repository",
            str(tmp_path / "a"),
            "--model-repository",
            str(tmp_path / "b"),
            "--model-control-mode",
            "explicit",
            "--load-model",
            "simple",
            "--load-model",
            "other",
            "--repository-poll-secs",
            "0.5",
        ]
    )
    assert settings.model_control_mode == "explicit"
    assert settings.load_models == ["simple", "other"]
    assert settings.repository_poll_secs == 0.5
    assert [p.name for p in settings.model_repositories] == ["a", "b"]
    defaults = settings_from_args(["--model-repository", str(tmp_path)])
    assert (defaults.model_control_mode, defaults.repository_poll_secs, defaults.load_models) == (
        "none",
        15.0,
        [],
    )


def test_the_settle_time_flag(tmp_path: Path) -> None:
    assert settings_from_args(["--model-repository", str(tmp_path)]).repository_settle_secs == 10.0
    for value in ("0", "2.5"):
        settings = settings_from_args(
            ["--model-repository", str(tmp_path), "--repository-settle-secs", value]
        )
        assert settings.repository_settle_secs == float(value)


@pytest.mark.parametrize(
    "argv",
    [
        ["--model-control-mode", "sometimes"],
        ["--repository-poll-secs", "0"],
        ["--repository-poll-secs", "soon"],
        ["--repository-settle-secs", "-1"],
        ["--repository-settle-secs", "nan"],
    ],
)
def test_bad_control_flags_are_refused(tmp_path: Path, argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        settings_from_args(["--model-repository", str(tmp_path), *argv])


def _config(extra: str) -> ModelConfig:
    return text_format.Parse(simple_config("m", 8) + extra, ModelConfig())


@pytest.mark.parametrize(
    "extra",
    [
        'default_model_filename: "../../elsewhere.onnx"',
        'default_model_filename: "/etc/passwd"',
        'output [ { name: "EXTRA" data_type: TYPE_INT32 dims: [1] label_filename: "../secret" } ]',
        'model_warmup [ { name: "w" batch_size: 1 inputs [ { key: "INPUT0" value: '
        '{ data_type: TYPE_INT32 dims: [16] input_data_file: "../../secret" } } ] } ]',
    ],
)
def test_config_file_names_must_stay_in_the_model_directory(extra: str) -> None:
    with pytest.raises(ConfigError, match="must be a relative path inside the model directory"):
        validate(_config(extra))


def test_plain_file_names_are_fine() -> None:
    validate(_config('default_model_filename: "sub/model.onnx"'))


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "a/b", "a\\b", "a\x00b", "", "x" * 256])
def test_names_that_cannot_be_model_directories(name: str) -> None:
    assert not plausible_name(name)


def _core(strict: bool = True) -> tuple[InferenceCore, ModelRegistry]:
    registry = ModelRegistry()
    settings = ServerSettings(strict_readiness=strict)
    core = InferenceCore(
        settings, registry, ModelManager(ManagerSettings([]), registry), InferencePath(registry)
    )
    core.started = True
    return core, registry


class _Healthy:
    def __init__(self, ok: bool = True) -> None:
        self.ok = ok

    def healthy(self) -> bool:
        return self.ok


def _serving(ok: bool = True) -> VersionRecord:
    return VersionRecord(1, ModelState.READY, scheduler=_Healthy(ok))  # type: ignore[arg-type]


def test_strict_readiness_is_never_ready_without_a_serving_model() -> None:
    core, registry = _core()
    assert not core.ready()
    registry.record("m").versions[1] = VersionRecord(1, ModelState.LOADING)
    assert not core.ready()


def test_non_strict_readiness_is_ready_once_live_as_triton() -> None:
    core, registry = _core(strict=False)
    assert core.ready()  # explicit mode starts empty and loads later (issue #20 item 1)
    registry.record("broken").versions[1] = VersionRecord(1, ModelState.UNAVAILABLE, "x")
    assert core.ready()
    core.repository_failure = "model repository '/nope' does not exist"
    assert not core.live() and not core.ready()


def test_strict_readiness_follows_what_each_model_is_meant_to_do() -> None:
    core, registry = _core()
    registry.record("a").versions[1] = _serving()
    assert core.ready()
    registry.record("loading").versions[1] = VersionRecord(1, ModelState.LOADING)
    assert core.ready()  # a first load in progress does not flip readiness (Triton #7014)
    registry.record("never_loaded")
    assert core.ready()
    unloaded = registry.record("unloaded")
    unloaded.state, unloaded.reason = ModelState.UNAVAILABLE, "unloaded"
    unloaded.versions[1] = VersionRecord(1, ModelState.UNAVAILABLE, "unloaded")
    assert core.ready()
    swapped = registry.record("swapped")  # a new version serves, the old one was retired
    swapped.versions[1] = VersionRecord(1, ModelState.UNAVAILABLE, "unloaded")
    swapped.versions[2] = _serving()
    assert core.ready()
    kept = registry.record("kept")  # a failed new version while the old one serves
    kept.versions[1] = _serving()
    kept.versions[2] = VersionRecord(2, ModelState.UNAVAILABLE, "corrupt")
    assert not core.ready()  # a version the policy wants is unavailable (issue #13 item 9)
    del registry.models["kept"]
    assert core.ready()
    broken = registry.record("broken")
    broken.versions[1] = VersionRecord(1, ModelState.UNAVAILABLE, "corrupt")
    assert not core.ready()
    core_loose, registry_loose = _core(strict=False)
    registry_loose.models = registry.models
    assert core_loose.ready()
    del registry.models["broken"]
    registry.record("sick").versions[1] = _serving(ok=False)
    assert not core.ready()


def test_load_api_flags_parse(tmp_path: Path) -> None:
    defaults = settings_from_args(["--model-repository", str(tmp_path)])
    assert defaults.allow_model_load_file_override is False and defaults.overload_status == 503
    settings = settings_from_args(
        [
            "--model-repository",
            str(tmp_path),
            "--allow-model-load-file-override",
            "--overload-status=429",
        ]
    )
    assert settings.allow_model_load_file_override is True and settings.overload_status == 429
    with pytest.raises(SystemExit):
        settings_from_args(["--model-repository", str(tmp_path), "--overload-status", "500"])


@pytest.mark.parametrize("allowed", [False, True])
def test_file_overrides_need_the_flag_config_overrides_do_not(allowed: bool) -> None:
    import asyncio

    from protocol.errors import InvalidArgument, PermissionDenied

    registry = ModelRegistry()
    settings = ServerSettings(model_control_mode="explicit", allow_model_load_file_override=allowed)
    core = InferenceCore(
        settings, registry, ModelManager(ManagerSettings([]), registry), InferencePath(registry)
    )
    config = '{"backend": "python"}'
    files = {"1/model.py": b"import os\nos.system('touch /tmp/pwned')\n"}
    with pytest.raises(InvalidArgument if allowed else PermissionDenied) as info:
        asyncio.run(core.load_model("m", config, files))
    if not allowed:
        assert (info.value.http_status(), info.value.grpc_status_name()) == (
            403,
            "PERMISSION_DENIED",
        )
        assert "--allow-model-load-file-override" in info.value.message
        assert info.value.message.startswith("load failed for model 'm'")
    else:  # allowed through to the load (which fails: the config lists no inputs)
        assert info.value.message.startswith("load failed for model 'm'")
        assert "allow-model-load-file-override" not in info.value.message
    with pytest.raises(InvalidArgument, match="failed to poll from model repository"):
        asyncio.run(core.load_model("m", config))  # a config override alone is always allowed
