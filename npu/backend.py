"""The `ascend` backend: one instance = one device session + one loaded copy of the `.om`.

load, execute and unload all run on the instance's own thread (the pool guarantees it), which
is also the thread pyACL binds the instance's context to. A batch is copied into buffers made
at load, run with execute_async + synchronize_stream (which lets other instances' threads run
meanwhile), and copied back with the padding rows dropped.

A batch of requests to a model with static side inputs (im_info [1, 3] beside a dynamic-batch
image) carries one side row per request row; consecutive rows whose side rows are equal run as
one execution, so requests for same-sized images share a gear. An AI Core exception leaves the
instance's stream broken: the instance rebuilds its session and model copy and serves on.

An execution that does not finish within the instance's timeout (npu/deadline.py) is a hung
device, or a stream stuck on it: the batch answers UNAVAILABLE and the instance is out of
service for good. It cannot be rebuilt in place: the execution is still on its stream, and
destroying that stream (or unloading the model it runs) waits for it. So the instance leaves
its stream, model copy and device memory as they are, and the driver reclaims them when the
executor process ends (the model's unload, or the server's exit).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from backends.base import Backend, BackendError, InstanceSpec
from npu import acl as npu_acl
from npu import aipp as npu_aipp
from npu import config as npu_config
from npu import deadline as npu_deadline
from npu.device import DeviceSession
from npu.errors import AclError, ExecutionHung, is_stream_fault, is_sync_timeout
from npu.om_model import Allocate, OmModel, describe_file, missing_model
from protocol.errors import InvalidArgument

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)


class AscendBackend(Backend):
    backend_name: ClassVar[str] = "ascend"
    platforms: ClassVar[tuple[str, ...]] = ("ascend_om",)
    default_model_filename: ClassVar[str] = "model.om"

    def __init__(
        self, config: ModelConfig, model_dir: Path, version_dir: Path, instance: InstanceSpec
    ) -> None:
        super().__init__(config, model_dir, version_dir, instance)
        self.batch_gears: tuple[int, ...] = ()  # the compiled gears, ascending (after load)
        self._session: DeviceSession | None = None
        self._model: OmModel | None = None
        self._binding: npu_config.Binding | None = None
        self._fault: str | None = None
        self._side: list[int] = []  # positions of side inputs (no batch axis) among the inputs
        self._deadline = npu_deadline.ExecutionDeadline()  # its timeout is read at load
        self._abandoned = False  # an execution hung: leave its resources to the driver
        # Where each output's bytes go (the NPU executor sets its shared memory); np.empty if None.
        self.allocate_output: Allocate | None = None

    @classmethod
    def place_instances(cls, config: ModelConfig) -> None:
        npu_config.place(config)

    @classmethod
    def auto_complete(cls, config: ModelConfig, model_dir: Path, version_dir: Path) -> None:
        filename = config.default_model_filename or cls.default_model_filename
        info = describe_file(
            version_dir / filename,
            npu_config.probe_device(config),
            npu_config.input_shape(config),
        )
        info = npu_aipp.describe_with(info, npu_aipp.settings_from_config(config))
        npu_config.complete(config, info)

    def load(self) -> None:
        self._deadline.fixed_ms = npu_deadline.configured_ms(self.config)
        acl = npu_acl.load()
        path = self.model_path()
        if not path.is_file():
            raise BackendError(missing_model(path))
        self._open(acl, path)
        assert self._model is not None
        self.batch_gears = self._model.info.gears

    def _open(self, acl, path: Path) -> None:
        self._session = DeviceSession.open(acl, self.instance.device_id)
        self._session.deadline = self._deadline  # what it has seen survives a rebuild
        try:
            self._model = OmModel.load(
                self._session,
                path,
                npu_aipp.settings_from_config(self.config),
                npu_config.input_shape(self.config),
            )
            self._binding = npu_config.bind(self.config, self._model.info)
            self._side = [i for i, (_, t) in enumerate(self._binding.inputs) if not t.batched]
        except BaseException:
            self._release()
            raise

    def execute(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._fault is not None:
            raise BackendError(
                f"instance {self.instance.name} is out of service after a device "
                f"fault: {self._fault}",
                fatal=True,
            )
        if self._model is None or self._binding is None:
            raise BackendError(f"instance {self.instance.name} has no model loaded")
        arrays, rows = self._arrays(inputs)
        timeout = self._deadline.describe()
        try:
            results = self._run(arrays, rows)
        except AclError as exc:
            if is_sync_timeout(exc.code):
                raise self._hung(exc, timeout) from None
            if is_stream_fault(exc.code):
                self._rebuild(exc)
            elif exc.fatal:
                self._out_of_service(exc.message)
            raise
        return {name: results[tensor.index] for name, tensor in self._binding.outputs}

    def _out_of_service(self, reason: str) -> None:
        self._fault = reason
        log.error(
            "instance %s on NPU %s taken out of service: %s",
            self.instance.name,
            self.instance.device_id,
            reason,
        )

    def _hung(self, exc: AclError, timeout: str) -> ExecutionHung:
        """The execution did not finish within `timeout`: out of service, its stream and
        model copy abandoned (see the module's docstring); the error for this batch."""
        reason = (
            f"an execution did not finish within {timeout}; the NPU or its stream is hung "
            f"({exc.message})"
        )
        self._abandoned = True
        if self._session is not None:
            self._session.abandoned = True
        self._out_of_service(reason)
        npu_deadline.record_timeout(self.config.name, self.instance.device_id)
        return ExecutionHung(
            f"instance {self.instance.name} on NPU {self.instance.device_id} is out of "
            f"service: {reason}"
        )

    def _rebuild(self, exc: AclError) -> None:
        """The stream is broken (AI Core exception or timeout): release this copy and load a
        fresh one on a new stream. The failed batch still fails; later ones run."""
        log.error(
            "instance %s on NPU %s: %s; recreating its stream and model",
            self.instance.name,
            self.instance.device_id,
            exc.message,
        )
        self._release()
        try:
            self._open(npu_acl.load(), self.model_path())
        except BackendError as again:
            self._out_of_service(f"{exc.message}; recreating the instance failed: {again.message}")
            exc.fatal = True

    def _run(self, arrays: list[np.ndarray], rows: int | None) -> list[np.ndarray]:
        """Run the batch; with side inputs, once per run of rows whose side rows agree."""
        assert self._model is not None and self._binding is not None
        side = self._side
        allocate = self.allocate_output
        if not (self._binding.batching and side) or rows is None:
            return self._model.run(arrays, rows, allocate)
        starts = [0] + [
            r
            for r in range(1, rows)
            if any(not np.array_equal(arrays[i][r], arrays[i][r - 1]) for i in side)
        ]
        if len(starts) == 1:
            return self._model.run(
                [a[:1] if i in side else a for i, a in enumerate(arrays)], rows, allocate
            )
        parts = []
        for start, end in zip(starts, starts[1:] + [rows], strict=False):
            parts.append(
                self._model.run(
                    [
                        a[start : start + 1] if i in side else a[start:end]
                        for i, a in enumerate(arrays)
                    ],
                    end - start,
                )
            )
        joined = []
        for outs in zip(*parts, strict=False):
            shape = (sum(o.shape[0] for o in outs), *outs[0].shape[1:])
            out = (allocate or np.empty)(shape, outs[0].dtype)
            joined.append(np.concatenate(outs, out=out))
        return joined

    def _arrays(self, inputs: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], int | None]:
        """The inputs in model order, contiguous, in the model's dtypes, with the row count."""
        assert self._binding is not None
        binding = self._binding
        arrays: list[np.ndarray] = []
        rows: int | None = None
        for name, tensor in binding.inputs:
            if name not in inputs:
                raise BackendError(f"missing input '{name}'")
            array = np.ascontiguousarray(inputs[name], dtype=tensor.acl_type.numpy)
            on_rows = binding.batching or (binding.rows and tensor.batched)
            if on_rows:
                count = array.shape[0] if array.ndim else 0
                if rows is None:
                    rows = count
                elif count != rows:
                    raise InvalidArgument(f"input '{name}' has {count} rows, other inputs {rows}")
                ok = npu_config.fits(array.shape[1:], tensor.row_dims)
                shape = ["n", *tensor.row_dims]
            else:
                ok, shape = npu_config.fits(array.shape, tensor.dims), list(tensor.dims)
            if not ok:
                raise InvalidArgument(
                    f"input '{name}' has shape {list(array.shape)}, the model takes {shape}"
                )
            arrays.append(array)
        return arrays, rows

    def output_bytes(self) -> int:
        """The most bytes one execution's outputs take (at the largest gear), 64-byte aligned
        each: what the NPU executor's output slabs are sized by."""
        if self._model is None:
            return 0
        return sum((t.size + 63) // 64 * 64 for t in self._model.info.outputs)

    def unload(self) -> None:
        if self._abandoned:
            log.warning(
                "instance %s on NPU %s: an execution never finished, so its stream, model "
                "copy and device memory are left to the driver (freed when this process ends)",
                self.instance.name,
                self.instance.device_id,
            )
            self._model = self._session = self._binding = None
            return
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
            log.warning(
                "unloading instance %s on NPU %s: %s",
                self.instance.name,
                self.instance.device_id,
                problem,
            )

    def healthy(self) -> bool:
        return self._fault is None
