"""Backend name -> Backend class, resolved lazily so an optional runtime that is missing
(pyACL on a machine without CANN) only fails the models that use it."""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from backends.base import Backend

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig

# backend name -> "module:Class"
_BACKENDS: dict[str, str] = {
    "onnxruntime": "backends.onnxruntime:OnnxRuntimeBackend",
    "ascend": "npu.executor.client:AscendExecutorBackend",
    "python": "backends.python.backend:PythonBackend",
    "identity": "backends.identity:IdentityBackend",
}
# other backends' names for the same thing -> backend name: Ascend's Triton GE backend
# (hicann/triton-inference-server-ge-backend) names its NPU models `npu_ge`
_ALIASES: dict[str, str] = {"npu_ge": "ascend"}
# platform -> backend name
_PLATFORMS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "ascend_om": "ascend",
}
# default model file -> backend name, for configs that name neither backend nor platform
_FILE_HINTS: dict[str, str] = {
    "model.onnx": "onnxruntime",
    "model.om": "ascend",
    "model.py": "python",
}


class UnknownBackend(Exception):
    pass


def backend_name_for(config: ModelConfig) -> str:
    """The backend a config selects, from `backend` first and then `platform`."""
    if config.backend:
        if config.backend in _ALIASES:
            return _ALIASES[config.backend]
        if config.backend not in _BACKENDS:
            raise UnknownBackend(f"unknown backend '{config.backend}'")
        return config.backend
    if config.platform:
        if config.platform not in _PLATFORMS:
            raise UnknownBackend(f"unknown platform '{config.platform}'")
        return _PLATFORMS[config.platform]
    raise UnknownBackend("must specify 'platform' or 'backend'")


def guess_backend_from_files(names: list[str]) -> str | None:
    for filename, backend in _FILE_HINTS.items():
        if filename in names:
            return backend
    return None


def backend_class(name: str) -> type[Backend]:
    module_name, _, class_name = _BACKENDS[name].partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, class_name)


def end_child_processes() -> int:
    """At the server's exit deadline: every backend class imported so far kills the processes
    it started that still run (Python model workers). Returns how many were killed."""
    killed = 0
    for target in sorted(set(_BACKENDS.values())):
        module_name, _, class_name = target.partition(":")
        module = sys.modules.get(module_name)  # never imported: it started nothing
        backend = getattr(module, class_name, None) if module is not None else None
        if backend is not None:
            killed += backend.end_child_processes()
    return killed


def register(name: str, target: str, platforms: tuple[str, ...] = ()) -> None:
    """Add a backend ("module:Class"); tests use it for named fake models."""
    _BACKENDS[name] = target
    for platform in platforms:
        _PLATFORMS[platform] = name
