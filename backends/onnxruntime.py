"""ONNX Runtime: one InferenceSession per instance, on the CPU (or CUDA where available).

ONNX Runtime releases the GIL while it runs, so instance threads really do run in parallel.
Thread counts come from the config `parameters` (intra_op_thread_count, inter_op_thread_count),
as Triton's onnxruntime backend reads them; parameters named like ONNX Runtime's own session
config keys (`session.*`, e.g. `session.intra_op.allow_spinning`) are passed to it as they are.

Defaults suit a server rather than a benchmark of ONNX Runtime alone (bench/FINDINGS.md
section 9): the intra-op pool gets the CPUs the event loop does not need, shared between the
model's instances, and its threads do not spin while waiting for work (ONNX Runtime's own
default, a pool as wide as the machine that spins, took CPU from the frontends and the client).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.base import Backend, BackendError, ParameterBound
from protocol.errors import InvalidArgument

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

# ONNX tensor element type names (as onnxruntime reports them) -> model config data types.
_ORT_TO_CONFIG = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING",
    "tensor(bfloat16)": "TYPE_BF16",
}
DEFAULT_MAX_BATCH_SIZE = 4


def _import_ort() -> Any:
    import onnxruntime  # imported here so servers without ONNX models never pay for it

    return onnxruntime


SPINNING_KEY = "session.intra_op.allow_spinning"


def default_intra_op_threads(config: ModelConfig) -> int:
    """The CPUs this process may use, less one for the event loop, shared between the
    model's instances; at least one."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    instances = sum(max(1, group.count) for group in config.instance_group) or 1
    return max(1, (cpus - 1) // instances)


def session_options(config: ModelConfig) -> Any:
    """The ORT session options a model's config asks for (bench/offline.py runs with the same)."""
    ort = _import_ort()
    options = ort.SessionOptions()
    params = config.parameters
    if "intra_op_thread_count" in params:
        options.intra_op_num_threads = int(params["intra_op_thread_count"].string_value)
    else:
        options.intra_op_num_threads = default_intra_op_threads(config)
    if "inter_op_thread_count" in params:
        options.inter_op_num_threads = int(params["inter_op_thread_count"].string_value)
    entries = {
        key: value.string_value for key, value in params.items() if key.startswith("session.")
    }
    entries.setdefault(SPINNING_KEY, "0")
    for key, value in entries.items():
        try:
            options.add_session_config_entry(key, value)
        except Exception as exc:
            raise BackendError(f"invalid ONNX Runtime session option '{key}': {exc}") from exc
    return options


def _dim_value(dim: Any) -> int:
    return dim if isinstance(dim, int) and dim >= 0 else -1


def _to_ort_strings(name: str, array: np.ndarray) -> np.ndarray:
    """ONNX string tensors hold UTF-8 text; our BYTES elements are Python bytes."""
    try:
        flat = [
            item.decode("utf-8") if isinstance(item, (bytes, bytearray)) else str(item)
            for item in array.reshape(-1)
        ]
    except UnicodeDecodeError as exc:
        raise InvalidArgument(
            f"input '{name}': a BYTES element is not valid UTF-8 ({exc.reason} "
            f"at byte {exc.start}); this ONNX model takes text strings"
        ) from None
    return np.array(flat, dtype=object).reshape(array.shape)


def _from_ort_strings(array: np.ndarray) -> np.ndarray:
    flat = [
        item.encode("utf-8") if isinstance(item, str) else bytes(item) for item in array.reshape(-1)
    ]
    result = np.empty(len(flat), dtype=object)
    result[:] = flat
    return result.reshape(array.shape)


class OnnxRuntimeBackend(Backend):
    backend_name = "onnxruntime"
    platforms = ("onnxruntime_onnx",)
    default_model_filename = "model.onnx"
    # Threads ONNX Runtime starts per session (0: its own choice).
    parameter_bounds = {
        "intra_op_thread_count": ParameterBound(0, 1024, integer=True),
        "inter_op_thread_count": ParameterBound(0, 1024, integer=True),
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._session: Any = None
        self._output_names: list[str] = []

    def model_path(self) -> Path:
        path = super().model_path()
        # Triton also accepts a directory holding model.onnx (external weights).
        if path.is_dir():
            path = path / "model.onnx"
        return path

    @classmethod
    def auto_complete(cls, config: ModelConfig, model_dir: Path, version_dir: Path) -> None:
        """Fill inputs, outputs and max_batch_size from the ONNX file, as Triton does."""
        from protocol.proto.model_config_pb2 import DataType

        filename = config.default_model_filename or cls.default_model_filename
        path = version_dir / filename
        if path.is_dir():
            path = path / "model.onnx"
        ort = _import_ort()
        try:
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise BackendError(f"unable to load ONNX model '{path}': {exc}") from exc
        model_inputs = session.get_inputs()
        model_outputs = session.get_outputs()
        everything = list(model_inputs) + list(model_outputs)
        had_io = bool(len(config.input) or len(config.output))
        can_batch = bool(everything) and all(
            len(t.shape) > 0 and _dim_value(t.shape[0]) == -1 for t in everything
        )
        if not had_io and config.max_batch_size == 0 and can_batch:
            config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
            if not config.HasField("dynamic_batching") and not config.HasField("sequence_batching"):
                config.dynamic_batching.preferred_batch_size.append(DEFAULT_MAX_BATCH_SIZE)
        skip = 1 if config.max_batch_size > 0 else 0

        # A sequence model's control and state inputs are fed by the batcher, not declared.
        batcher_fed = (
            {c.name for c in config.sequence_batching.control_input}
            | {s.input_name for s in config.sequence_batching.state}
            | {s.output_name for s in config.sequence_batching.state}
        )

        def fill(target: Any, tensors: list[Any]) -> None:
            existing = {t.name: t for t in target}
            for tensor in tensors:
                if tensor.name in batcher_fed:
                    continue
                entry = existing.get(tensor.name)
                if entry is None:
                    if had_io and existing:
                        continue  # a partial config lists what it wants; keep it as written
                    entry = target.add()
                    entry.name = tensor.name
                if entry.data_type == DataType.TYPE_INVALID:
                    entry.data_type = DataType.Value(
                        _ORT_TO_CONFIG.get(tensor.type, "TYPE_INVALID")
                    )
                if len(entry.dims) == 0:
                    entry.dims.extend(_dim_value(d) for d in tensor.shape[skip:])

        fill(config.input, list(model_inputs))
        fill(config.output, list(model_outputs))

    def load(self) -> None:
        ort = _import_ort()
        path = self.model_path()
        if not path.exists():
            raise BackendError(f"unable to find model file '{path}'")
        providers: list[str | tuple[str, dict[str, int]]] = ["CPUExecutionProvider"]
        if self.instance.kind == "KIND_GPU":
            if "CUDAExecutionProvider" in ort.get_available_providers():
                providers = [
                    ("CUDAExecutionProvider", {"device_id": self.instance.device_id}),
                    "CPUExecutionProvider",
                ]
            else:
                log.warning(
                    "instance %s asks for KIND_GPU but ONNX Runtime has no CUDA provider "
                    "here; running on the CPU",
                    self.instance.name,
                )
        try:
            self._session = ort.InferenceSession(
                str(path), sess_options=session_options(self.config), providers=providers
            )
        except Exception as exc:
            raise BackendError(f"unable to load ONNX model '{path}': {exc}") from exc
        self._check_config_matches_model()
        self._output_names = [o.name for o in self._session.get_outputs()]

    def _check_config_matches_model(self) -> None:
        """Refuse a config whose inputs or outputs the model does not have (names, data types,
        fixed dims), as Triton does at load, instead of failing every request later."""
        from protocol.proto.model_config_pb2 import DataType

        skip = 1 if self.config.max_batch_size > 0 else 0
        # Ragged inputs and scattered batch outputs are 1-D in the model whatever the config's
        # dims say (Triton's ragged batching): their shapes are not compared.
        flat = {t.name for t in self.config.input if t.allow_ragged_batch} | {
            name for spec in self.config.batch_output for name in spec.target_name
        }
        model_io = {
            "input": {t.name: t for t in self._session.get_inputs()},
            "output": {t.name: t for t in self._session.get_outputs()},
        }
        for kind, declared in (("input", self.config.input), ("output", self.config.output)):
            available = model_io[kind]
            for tensor in declared:
                actual = available.get(tensor.name)
                if actual is None:
                    raise BackendError(
                        f"model '{self.config.name}': unexpected {kind} "
                        f"'{tensor.name}', the model's {kind}s are "
                        f"{sorted(available)}"
                    )
                wanted = DataType.Name(tensor.data_type)
                if _ORT_TO_CONFIG.get(actual.type) != wanted:
                    raise BackendError(
                        f"model '{self.config.name}': {kind} '{tensor.name}' is "
                        f"{wanted} in the config but {actual.type} in the model"
                    )
                if tensor.HasField("reshape") or tensor.name in flat:
                    continue
                model_dims = [_dim_value(d) for d in actual.shape[skip:]]
                config_dims = [int(d) for d in tensor.dims]
                compatible = len(model_dims) == len(config_dims) and all(
                    m == -1 or c == -1 or m == c
                    for m, c in zip(model_dims, config_dims, strict=False)
                )
                if not compatible:
                    raise BackendError(
                        f"model '{self.config.name}': {kind} '{tensor.name}' has "
                        f"dims {config_dims} in the config but {model_dims} in "
                        f"the model" + (" (after the batch dimension)" if skip else "")
                    )
        # The server feeds every model input from a request, a batch_input, a sequence
        # control or an implicit state: none may be left.
        sequence = self.config.sequence_batching
        fed = (
            {t.name for t in self.config.input}
            | {name for spec in self.config.batch_input for name in spec.target_name}
            | {control.name for control in sequence.control_input}
            | {state.input_name for state in sequence.state}
        )
        unfed = sorted(set(model_io["input"]) - fed)
        if unfed:
            raise BackendError(
                f"model '{self.config.name}': the model's inputs {unfed} are not in the config"
            )

    def execute(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {
            name: (_to_ort_strings(name, array) if array.dtype.kind == "O" else array)
            for name, array in inputs.items()
        }
        try:
            results = self._session.run(self._output_names, feeds)
        except Exception as exc:
            raise BackendError(f"onnxruntime execution failed: {exc}") from exc
        return {
            name: (_from_ort_strings(value) if value.dtype.kind in "OU" else value)
            for name, value in zip(self._output_names, results, strict=False)
        }

    def unload(self) -> None:
        self._session = None
