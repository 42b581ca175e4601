"""The `ascend` backend: one instance = one device session + one loaded copy of the `.om`.

load, execute and unload all run on the instance's own thread (the pool guarantees it), which
is also the thread pyACL binds the instance's context to. A batch is copied into buffers made
at load, run with execute_async + synchronize_stream (which lets other instances' threads run
meanwhile), and copied back with the padding rows dropped.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Mapping, Optional

import numpy as np

from backends.base import Backend, BackendError, InstanceSpec
from npu import acl as npu_acl
from npu import config as npu_config
from npu.device import DeviceSession
from npu.om_model import OmModel, describe_file

if TYPE_CHECKING:  # pragma: no cover
    from protocol.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)


class AscendBackend(Backend):
    backend_name: ClassVar[str] = "ascend"
    platforms: ClassVar[tuple[str, ...]] = ("ascend_om",)
    default_model_filename: ClassVar[str] = "model.om"

    def __init__(self, config: "ModelConfig", model_dir: Path, version_dir: Path,
                 instance: InstanceSpec) -> None:
        super().__init__(config, model_dir, version_dir, instance)
        self.batch_gears: tuple[int, ...] = ()  # the compiled gears, ascending (after load)
        self._session: Optional[DeviceSession] = None
        self._model: Optional[OmModel] = None
        self._binding: Optional[npu_config.Binding] = None
        self._fault: Optional[str] = None

    @classmethod
    def auto_complete(cls, config: "ModelConfig", model_dir: Path, version_dir: Path) -> None:
        filename = config.default_model_filename or cls.default_model_filename
        info = describe_file(version_dir / filename, npu_config.probe_device(config))
        npu_config.complete(config, info)

    def load(self) -> None:
        acl = npu_acl.load()
        path = self.model_path()
        if not path.is_file():
            raise BackendError(f"model file {path} does not exist")
        self._session = DeviceSession.open(acl, self.instance.device_id)
        try:
            self._model = OmModel.load(self._session, path)
            self._binding = npu_config.bind(self.config, self._model.info)
        except BaseException:
            self._release()
            raise
        self.batch_gears = self._model.info.gears

    def execute(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._fault is not None:
            raise BackendError(f"instance {self.instance.name} is out of service after a device "
                               f"fault: {self._fault}", fatal=True)
        if self._model is None or self._binding is None:
            raise BackendError(f"instance {self.instance.name} has no model loaded")
        arrays, rows = self._arrays(inputs)
        try:
            results = self._model.run(arrays, rows)
        except BackendError as exc:
            if exc.fatal:
                self._fault = exc.message
                log.error("instance %s on NPU %s taken out of service: %s", self.instance.name,
                          self.instance.device_id, exc.message)
            raise
        return {name: results[tensor.index] for name, tensor in self._binding.outputs}

    def _arrays(self, inputs: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], Optional[int]]:
        """The inputs in model order, contiguous, in the model's dtypes, with the batch size."""
        assert self._binding is not None
        batched = self._binding.batched
        arrays: list[np.ndarray] = []
        rows: Optional[int] = None
        for name, tensor in self._binding.inputs:
            if name not in inputs:
                raise BackendError(f"missing input '{name}'")
            array = np.ascontiguousarray(inputs[name], dtype=tensor.acl_type.numpy)
            if batched:
                count = array.shape[0] if array.ndim else 0
                if rows is None:
                    rows = count
                elif count != rows:
                    raise BackendError(f"input '{name}' has {count} rows, other inputs {rows}")
                expected, shape = count * tensor.row_bytes, [count, *tensor.row_dims]
            else:
                expected, shape = tensor.static_bytes, list(tensor.dims)
            if array.nbytes != expected:
                raise BackendError(f"input '{name}' has shape {list(array.shape)}, the model "
                                   f"takes {shape}")
            arrays.append(array)
        return arrays, rows

    def unload(self) -> None:
        self._release()

    def _release(self) -> None:
        problems: list[str] = []
        if self._model is not None:
            problems += self._model.close()
            self._model = None
        if self._session is not None:
            problems += self._session.close()
            self._session = None
        self._binding = None
        for problem in problems:
            log.warning("unloading instance %s on NPU %s: %s", self.instance.name,
                        self.instance.device_id, problem)

    def healthy(self) -> bool:
        return self._fault is None
