"""Test harness for the Ascend backend: a prepared model directory, instances, one thread per
instance (as the scheduler's pool gives them), and distinct input rows."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format

from backends.base import InstanceSpec
from npu.backend import AscendBackend
from protocol.proto.model_config_pb2 import ModelConfig
from tests.support import om_fixtures as omf


class InstanceThread:
    """One dedicated thread, as the scheduler's pool gives each instance."""

    def __init__(self, name: str = "instance") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._pool.submit(fn, *args).result()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def prepare(
    tmp_path: Path, text: str = "", om=omf.scale_model, complete: bool = True, **om_kwargs
) -> tuple[ModelConfig, Path, Path]:
    model_dir = tmp_path / "m"
    version_dir = model_dir / "1"
    om(version_dir / "model.om", **om_kwargs)
    config = text_format.Parse('name: "m"\nbackend: "ascend"\n' + text, ModelConfig())
    if complete:
        AscendBackend.auto_complete(config, model_dir, version_dir)
    return config, model_dir, version_dir


def backend(
    prepared: tuple[ModelConfig, Path, Path], device: int = 0, index: int = 0
) -> AscendBackend:
    config, model_dir, version_dir = prepared
    return AscendBackend(
        config, model_dir, version_dir, InstanceSpec(f"m_{index}", "KIND_GPU", device, index)
    )


def rows(n: int, features: int = 4) -> np.ndarray:
    return np.arange(n * features, dtype=np.float32).reshape(n, features) + 1
