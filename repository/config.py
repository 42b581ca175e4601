"""config.pbtxt -> the ModelConfig protobuf, normalised and auto-completed as Triton does it.

Parsing uses protobuf's text format into a message that is field-for-field Triton's, so any
existing Triton config loads unchanged. The same message serves the HTTP `/config` JSON
(protocol/config_json.py) and the gRPC ModelConfig RPC.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import text_format

from backends import registry
from backends.base import BackendError
from protocol.proto.model_config_pb2 import DataType, ModelConfig, ModelInstanceGroup
from repository import bounds as config_bounds
from repository.bounds import DEFAULT_BOUNDS, BoundExceeded, ModelBounds
from scheduler.sequence.config import DEFAULT_IDLE_US, SequenceConfigError, read_settings


class ConfigError(Exception):
    """A config that cannot be used; the message names the model and the field."""


def parse_config_text(text: str, path: Path) -> ModelConfig:
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        where = f"{path}:{line}:{column}" if line else str(path)
        detail = str(exc)
        # ParseError's text begins with "line:col : "; keep only the explanation.
        if " : " in detail:
            detail = detail.split(" : ", 1)[1]
        raise ConfigError(f"failed to parse {where}: {detail}") from None
    return config


def read_config(model_dir: Path, config_name: str | None = None) -> ModelConfig:
    """Read `config.pbtxt` (or `configs/<config_name>.pbtxt`); a missing file is an empty config."""
    path = model_dir / "config.pbtxt"
    if config_name:
        custom = model_dir / "configs" / f"{config_name}.pbtxt"
        if custom.is_file():
            path = custom
    if not path.is_file():
        return ModelConfig()
    return parse_config_text(path.read_text(encoding="utf-8"), path)


def _resolve_backend(config: ModelConfig, name: str, version_dirs: list[Path]) -> str:
    try:
        return registry.backend_name_for(config)
    except registry.UnknownBackend as exc:
        if config.backend or config.platform:
            raise ConfigError(f"model '{name}': {exc}") from None
    files: list[str] = []
    for version_dir in version_dirs:
        files.extend(p.name for p in version_dir.iterdir())
    guessed = registry.guess_backend_from_files(files)
    if guessed is None:
        raise ConfigError(
            f"model '{name}': must specify 'platform' or 'backend' "
            f"(no known model file found to infer it from)"
        )
    return guessed


def normalize(
    config: ModelConfig,
    name: str,
    model_dir: Path,
    version_dirs: list[Path],
    *,
    auto_complete: bool = True,
    bounds: ModelBounds = DEFAULT_BOUNDS,
) -> ModelConfig:
    """Fill defaults and auto-complete in place, check the numbers against `bounds`
    (repository/bounds.py), then validate. Returns the same message."""
    if config.name and config.name != name:
        raise ConfigError(
            f"model '{name}': the config's name '{config.name}' must match the "
            f"model directory name '{name}'"
        )
    config.name = name
    if config.platform == "ensemble":
        normalize_common(config, name)
        return config
    backend_name = _resolve_backend(config, name, version_dirs)
    backend_cls = registry_backend_class(backend_name, name)
    config.backend = backend_name
    if not config.platform and backend_cls.platforms:
        config.platform = backend_cls.platforms[0]
    if not config.default_model_filename:
        config.default_model_filename = backend_cls.default_model_filename
    try:
        backend_cls.place_instances(config)
    except BackendError as exc:
        raise ConfigError(f"model '{name}': {exc.message}") from None
    if auto_complete and version_dirs:
        try:
            backend_cls.auto_complete(config, model_dir, version_dirs[-1])
        except BackendError as exc:
            raise ConfigError(f"model '{name}': auto-complete failed: {exc.message}") from None
    normalize_common(config, name)
    _fill_instance_groups(config, name, backend_name)
    # Before validate: reading the sequence settings already allocates their initial states.
    try:
        config_bounds.check(config, bounds, backend_cls.parameter_bounds)
    except BoundExceeded as exc:
        raise ConfigError(f"model '{name}': {exc}") from None
    validate(config)
    return config


def registry_backend_class(backend_name: str, model_name: str) -> Any:
    try:
        return registry.backend_class(backend_name)
    except ImportError as exc:
        raise ConfigError(
            f"model '{model_name}': backend '{backend_name}' is not available: {exc}"
        ) from None


def normalize_common(config: ModelConfig, name: str) -> None:
    """Triton's defaults every config gets, whichever backend it names (in place)."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.HasField("sequence_batching"):  # Triton's defaults, shown in /config too
        sequence = config.sequence_batching
        if not sequence.max_sequence_idle_microseconds:
            sequence.max_sequence_idle_microseconds = DEFAULT_IDLE_US
        if (
            sequence.HasField("oldest")
            and not len(sequence.oldest.preferred_batch_size)
            and config.max_batch_size > 0
        ):
            sequence.oldest.preferred_batch_size.append(config.max_batch_size)
    optimization = config.optimization
    optimization.input_pinned_memory.enable = True
    optimization.output_pinned_memory.enable = True


def _fill_instance_groups(config: ModelConfig, name: str, backend_name: str) -> None:
    if not len(config.instance_group):
        config.instance_group.add()
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = name if len(config.instance_group) == 1 else f"{name}_{index}"
        if group.kind == ModelInstanceGroup.KIND_AUTO:
            # An NPU runtime's natural device is the accelerator; everything else runs on CPU.
            group.kind = (
                ModelInstanceGroup.KIND_GPU
                if backend_name == "ascend"
                else ModelInstanceGroup.KIND_CPU
            )
        if group.kind == ModelInstanceGroup.KIND_GPU and not len(group.gpus):
            group.gpus.append(0)
        if group.count < 1:
            # Triton: 2 CPU instances for ONNX Runtime, 1 for everything else. An NPU gets 2
            # too: while the device runs one instance's batch, the other's is gathered and
            # copied (each has its own stream and buffers), so the device never waits for
            # the host.
            two = (group.kind == ModelInstanceGroup.KIND_CPU and backend_name == "onnxruntime") or (
                group.kind == ModelInstanceGroup.KIND_GPU and backend_name == "ascend"
            )
            group.count = 2 if two else 1


def _plain_relative(path: str) -> bool:
    """A path that stays inside the directory it is joined to (no absolute part, no `..`)."""
    return (
        bool(path)
        and "\x00" not in path
        and "\\" not in path
        and not path.startswith("/")
        and all(part not in ("", ".", "..") for part in path.split("/"))
    )


def _check_file_names(config: ModelConfig) -> None:
    """File names a config points at must stay inside the model directory: a config can come
    from the network (a load request's `config`), and must not make the server read elsewhere."""
    name = config.name
    named = [("default_model_filename", config.default_model_filename)]
    named += [
        (f"output '{t.name}' label_filename", t.label_filename)
        for t in config.output
        if t.label_filename
    ]
    named += [
        (f"model_warmup '{w.name}' input '{key}' input_data_file", item.input_data_file)
        for w in config.model_warmup
        for key, item in w.inputs.items()
        if item.WhichOneof("input_data_type") == "input_data_file"
    ]
    for field_name, value in named:
        if value and not _plain_relative(value):
            raise ConfigError(
                f"model '{name}': {field_name} '{value}' must be a relative path "
                f"inside the model directory"
            )


def validate(config: ModelConfig) -> None:
    """Reject configs the server cannot serve, naming the model and the offending field."""
    name = config.name
    _check_file_names(config)
    if config.max_batch_size < 0:
        raise ConfigError(
            f"model '{name}': max_batch_size must be >= 0, got {config.max_batch_size}"
        )
    # No input or no output at all is valid, as in Triton (a Python model may take or return
    # nothing; a backend whose model file has tensors checks the config against them).
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for tensor in tensors:
            if not tensor.name:
                raise ConfigError(f"model '{name}': an {kind} has no name")
            if tensor.name in seen:
                raise ConfigError(f"model '{name}': {kind} '{tensor.name}' is declared twice")
            seen.add(tensor.name)
            if tensor.data_type == DataType.TYPE_INVALID:
                raise ConfigError(f"model '{name}': {kind} '{tensor.name}' must specify data_type")
            if not len(tensor.dims) and not (
                len(tensor.reshape.shape) if tensor.HasField("reshape") else 0
            ):
                if config.max_batch_size == 0:
                    raise ConfigError(f"model '{name}': {kind} '{tensor.name}' must specify dims")
            for dim in tensor.dims:
                if dim == 0 or dim < -1:
                    raise ConfigError(
                        f"model '{name}': {kind} '{tensor.name}' has invalid dims "
                        f"{list(tensor.dims)}: each must be -1 or positive"
                    )
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        if config.max_batch_size == 0:
            raise ConfigError(f"model '{name}': dynamic_batching needs max_batch_size > 0")
        for size in batching.preferred_batch_size:
            if size < 1 or size > config.max_batch_size:
                raise ConfigError(
                    f"model '{name}': dynamic_batching preferred_batch_size {size} "
                    f"must be between 1 and max_batch_size {config.max_batch_size}"
                )
        if batching.priority_levels and not (
            1 <= batching.default_priority_level <= batching.priority_levels
        ):
            raise ConfigError(
                f"model '{name}': dynamic_batching default_priority_level must be "
                f"between 1 and priority_levels {batching.priority_levels}"
            )
        for level in batching.priority_queue_policy:
            if not 1 <= level <= batching.priority_levels:
                raise ConfigError(
                    f"model '{name}': priority_queue_policy level {level} is outside "
                    f"1..priority_levels {batching.priority_levels}"
                )
        if batching.preserve_ordering and batching.priority_levels > 1:
            raise ConfigError(
                f"model '{name}': preserve_ordering cannot be combined with more "
                f"than one priority level"
            )
    if config.response_cache.enable:
        _check_cacheable(config)
    if config.HasField("sequence_batching"):
        try:
            read_settings(config)
        except SequenceConfigError as exc:
            raise ConfigError(str(exc)) from None


def _check_cacheable(config: ModelConfig) -> None:
    """Refuse `response_cache` where Triton does: a decoupled model answers any number of
    times, and a sequence model's answer depends on the state of earlier requests."""
    name = config.name
    if config.model_transaction_policy.decoupled:
        raise ConfigError(
            f"model '{name}': response cache does not currently support model '{name}' with "
            "'decoupled' transaction policy; disable response_cache"
        )
    if config.HasField("sequence_batching"):
        raise ConfigError(
            f"model '{name}': response cache does not currently support model '{name}' with "
            "the sequence batching scheduler; disable response_cache"
        )
