"""What a load request reloads of a model that is already loaded, as Triton decides it.

Triton reloads only what changed on disk since the model was loaded: a version whose files are
unchanged keeps serving (it is not rebuilt) unless a model-level file other than the config
changed (a shared dependency such as a helper module), and a request that changes nothing
leaves the model as it is, including a config an earlier request supplied. A config change
that only moves the version policy adds and removes versions without rebuilding the others
(qa's L0_lifecycle test_load_new_model_version and test_config_override check this). The
poller (POLL mode) keeps versions by the same rule, with its own content fingerprints.

"Changed" is judged by stat keys (size, mtime, ctime, inode), as Triton judges by
modification times: touching a file counts, and no file is read. Blocking (stat): run it off
the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from protocol.proto.model_config_pb2 import ModelConfig
from repository.fingerprint import MODEL_LEVEL, UnitStats, scan_model


@dataclass(frozen=True)
class LoadedFiles:
    """A model directory's files as one load saw them."""

    path: Path
    config: tuple  # the config files' stat keys (config.pbtxt, configs/*)
    model: tuple  # every other model-level file's
    versions: dict[int, tuple]


def _frozen(files: UnitStats) -> tuple:
    return tuple(sorted(files.items()))


def snapshot(model_dir: Path) -> LoadedFiles:
    scanned = scan_model(model_dir)
    model_level = scanned.units.get(MODEL_LEVEL, {})
    config = {k: v for k, v in model_level.items() if is_config_file(k)}
    others = {k: v for k, v in model_level.items() if not is_config_file(k)}
    return LoadedFiles(
        model_dir,
        _frozen(config),
        _frozen(others),
        {
            v: _frozen(files) for v, files in scanned.units.items() if v is not None
        },  # None: MODEL_LEVEL
    )


def is_config_file(relative: str) -> bool:
    """A model-level file that holds a config (the config decides itself what it changes)."""
    return relative == "config.pbtxt" or relative.startswith("configs/")


def unchanged_versions(before: LoadedFiles | None, now: LoadedFiles) -> set[int]:
    """Versions whose files, and the model-level files they may use, did not change."""
    if before is None or before.path != now.path or before.model != now.model:
        return set()
    return {v for v, files in now.versions.items() if before.versions.get(v) == files}


def same_but_versions(serving: ModelConfig, wanted: ModelConfig) -> bool:
    """The configs differ at most in the version policy (which adds or removes versions but
    does not change how one runs)."""
    if serving == wanted:
        return True
    left, right = ModelConfig(), ModelConfig()
    left.CopyFrom(serving)
    right.CopyFrom(wanted)
    left.ClearField("version_policy")
    right.ClearField("version_policy")
    return left == right
