"""The model-side utilities a Triton Python model imports as `pb_utils`.

Model code written against Triton's python backend does
`import triton_python_backend_utils as pb_utils` and uses the classes and helpers below; this
module provides the same names and behaviour so such a `model.py` runs unmodified in
ascend-serve's worker processes. It is our own implementation of the documented interface.

It is imported inside every worker process, so it depends on numpy and the standard library
only (a worker must start in well under a second).

Response senders (decoupled models), BLS (`InferenceRequest.exec` / `async_exec`),
cancellation and custom metrics (`MetricFamily`) talk to the server through the worker
(backends/python/worker/model_api.py, backends/python/worker/bridge.py). Not supported (they raise
TritonModelException with a clear message): `load_model`, `unload_model`, `is_model_ready`,
DLPack and GPU tensors.
"""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.python.worker import model_api as _api
from backends.python.worker.model_api import (
    InferenceResponseSender,
    Logger,
    LogLevel,
    Metric,
    MetricFamily,
    TritonModelException,
)

_STATE_LOCK = threading.Lock()  # guards the lazy creation of a request's sender state

__all__ = [
    "Tensor",
    "InferenceRequest",
    "InferenceResponse",
    "TritonError",
    "TritonModelException",
    "ModelConfig",
    "Logger",
    "LogLevel",
    "InferenceResponseSender",
    "MetricFamily",
    "Metric",
    "using_decoupled_model_transaction_policy",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
]

# Request flags and response/release flags, with Triton's values.
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# TRITONSERVER_DataType numbers (what Tensor.triton_dtype() returns).
TYPE_INVALID, TYPE_BOOL, TYPE_UINT8, TYPE_UINT16, TYPE_UINT32, TYPE_UINT64 = 0, 1, 2, 3, 4, 5
TYPE_INT8, TYPE_INT16, TYPE_INT32, TYPE_INT64 = 6, 7, 8, 9
TYPE_FP16, TYPE_FP32, TYPE_FP64, TYPE_STRING, TYPE_BF16 = 10, 11, 12, 13, 14

_TRITON_TO_NUMPY: dict[int, Any] = {
    TYPE_BOOL: np.bool_,
    TYPE_UINT8: np.uint8,
    TYPE_UINT16: np.uint16,
    TYPE_UINT32: np.uint32,
    TYPE_UINT64: np.uint64,
    TYPE_INT8: np.int8,
    TYPE_INT16: np.int16,
    TYPE_INT32: np.int32,
    TYPE_INT64: np.int64,
    TYPE_FP16: np.float16,
    TYPE_FP32: np.float32,
    TYPE_FP64: np.float64,
    TYPE_STRING: np.object_,
}
_STRING_TO_TRITON: dict[str, int] = {
    "TYPE_BOOL": TYPE_BOOL,
    "TYPE_UINT8": TYPE_UINT8,
    "TYPE_UINT16": TYPE_UINT16,
    "TYPE_UINT32": TYPE_UINT32,
    "TYPE_UINT64": TYPE_UINT64,
    "TYPE_INT8": TYPE_INT8,
    "TYPE_INT16": TYPE_INT16,
    "TYPE_INT32": TYPE_INT32,
    "TYPE_INT64": TYPE_INT64,
    "TYPE_FP16": TYPE_FP16,
    "TYPE_FP32": TYPE_FP32,
    "TYPE_FP64": TYPE_FP64,
    "TYPE_STRING": TYPE_STRING,
    "TYPE_BF16": TYPE_BF16,
}


def triton_to_numpy_type(data_type: int) -> Any:
    """TRITONSERVER_DataType number -> numpy type (np.object_ for BYTES)."""
    try:
        return _TRITON_TO_NUMPY[data_type]
    except KeyError:
        raise TritonModelException(f"unsupported data type {data_type}") from None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """numpy type or dtype -> TRITONSERVER_DataType number; None when there is none."""
    dtype = np.dtype(data_type)
    if dtype.kind in ("O", "S", "U"):
        return TYPE_STRING
    for number, numpy_type in _TRITON_TO_NUMPY.items():
        if numpy_type is not np.object_ and np.dtype(numpy_type) == dtype:
            return number
    return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """Config data type name ("TYPE_FP32") -> numpy type, as model configs spell it."""
    try:
        return triton_to_numpy_type(_STRING_TO_TRITON[triton_type_string])
    except KeyError:
        raise TritonModelException(f"unsupported data type '{triton_type_string}'") from None


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray:
    """Elements as 4-byte little-endian length + bytes, returned as a flat uint8 array."""
    parts: list[bytes] = []
    for item in np.asarray(input_tensor, dtype=object).reshape(-1):
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    """The inverse of serialize_byte_tensor: a 1-D object array of bytes."""
    # (numpy's stubs give ndarray the buffer protocol, __buffer__, on Python 3.12+ only)
    buffer = memoryview(
        np.ascontiguousarray(encoded_tensor).view(np.uint8)  # type: ignore[arg-type]  # see above
        if isinstance(encoded_tensor, np.ndarray)
        else encoded_tensor
    ).cast("B")
    items: list[bytes] = []
    offset = 0
    while offset < len(buffer):
        (length,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        items.append(bytes(buffer[offset : offset + length]))
        offset += length
    result = np.empty(len(items), dtype=object)
    result[:] = items
    return result


def _json_text(parameters: Any) -> str:
    if isinstance(parameters, str):
        return parameters
    return json.dumps(parameters or {})


def _json_dict(parameters: Any) -> dict:
    """Parameters as given (a dict or a JSON object string) as a dict of plain values."""
    if parameters is None or parameters == "":
        return {}
    if isinstance(parameters, str):
        try:
            parameters = json.loads(parameters)
        except ValueError:
            raise TritonModelException(
                "parameters must be a JSON object string or a dict"
            ) from None
    if not isinstance(parameters, dict):
        raise TritonModelException("parameters must be a JSON object string or a dict")
    for key, value in parameters.items():
        if not isinstance(value, (bool, int, float, str)):
            raise TritonModelException(f"parameter '{key}' must be a bool, int, float or str")
    return dict(parameters)


class TritonError:
    """An error a model attaches to one response; `code` selects the client status."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


def _as_array(array: Any) -> np.ndarray:
    """Models may pass fixed-width numpy strings; BYTES tensors travel as object arrays."""
    if not isinstance(array, np.ndarray):
        raise TritonModelException(f"Tensor expects a numpy array, got {type(array).__name__}")
    if array.dtype.kind in ("S", "U"):
        converted = np.empty(array.shape, dtype=object)
        flat = converted.reshape(-1)
        for index, item in enumerate(array.reshape(-1)):
            flat[index] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        return converted
    return array


class Tensor:
    """A named tensor holding a numpy array (object dtype for BYTES)."""

    def __init__(self, name: str, numpy_array: np.ndarray) -> None:
        if not isinstance(name, str):
            raise TritonModelException("Tensor name must be a string")
        self._name = name
        self._array = _as_array(numpy_array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        number = numpy_to_triton_type(self._array.dtype)
        return TYPE_INVALID if number is None else number

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        raise TritonModelException("DLPack tensors are not supported by ascend-serve")

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        raise TritonModelException("DLPack tensors are not supported by ascend-serve")

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


class InferenceRequest:
    """One request as `execute` receives it (and the constructor a BLS call would use)."""

    # The worker's sender state. The worker sets it on a decoupled model's requests; the other
    # requests `execute` receives (`_received`) get theirs when the model first asks for a
    # sender, which most never do; a request a model builds itself (BLS) has none.
    _state: Any = None
    _received = False

    def __init__(
        self,
        model_name: str = "",
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        parameters: Any = None,
        **_ignored: Any,
    ) -> None:
        self._model_name = model_name
        self._inputs = list(inputs)
        self._requested_output_names = list(requested_output_names)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters  # rendered as JSON only when asked for

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def requested_output_names(self) -> list[str]:
        return list(self._requested_output_names)

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request parameters as a JSON object string, as Triton hands them over."""
        return _json_text(self._parameters)

    def _parameter_dict(self) -> dict:
        return _json_dict(self._parameters)

    def is_cancelled(self) -> bool:
        """True once the client gave up on this request (decoupled models learn it at once;
        others when the worker next reads from the server)."""
        return self._state is not None and self._state.cancelled

    def get_response_sender(self) -> InferenceResponseSender:
        state = self._sender_state()
        if state is None:
            raise TritonModelException(
                "a response sender is only available for the requests execute() receives"
            )
        return InferenceResponseSender(state)

    def _sender_state(self) -> Any:
        """The sender state, made on first use for a received request that has none yet."""
        if self._state is None and self._received:
            with _STATE_LOCK:  # two threads asking at once get the same state
                if self._state is None:
                    self._state = _api.bridge().register(0, False, None)
        return self._state

    def exec(self, decoupled: bool = False) -> Any:
        """BLS: run this request on another model through the server's infer path. Returns
        its InferenceResponse, or with `decoupled=True` an iterator over its responses (the
        last one empty, carrying the final flag)."""
        answers = _api.bridge().infer(self, decoupled, _bls_response)
        if decoupled:
            return _api.ResponseIterator(answers)
        return next(answers)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """`exec` for `async def execute`: other coroutines run while it waits."""
        if decoupled:
            answers = await asyncio.to_thread(lambda: list(self.exec(decoupled=True)))
            return iter(answers)
        return await asyncio.to_thread(self.exec)


def _bls_response(message: dict) -> InferenceResponse:
    """A BLS answer from the server as the InferenceResponse the model sees."""
    error = message.get("error")
    tensors = [Tensor(name, array) for name, array in message.get("tensors", {}).items()]
    return InferenceResponse(
        tensors, TritonError(error[1], error[0]) if error else None, message.get("params") or None
    )


class InferenceResponse:
    """What `execute` returns for each request: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: Any = None,
    ) -> None:
        tensors = list(output_tensors or ())
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"InferenceResponse output_tensors must be pb_utils.Tensor objects, got "
                    f"{type(tensor).__name__}"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException("InferenceResponse error must be a pb_utils.TritonError")
        self._outputs = tensors
        self._error = error
        self._parameters = parameters

    def output_tensors(self) -> list[Tensor]:
        return list(self._outputs)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return _json_text(self._parameters)

    def _parameter_dict(self) -> dict:
        return _json_dict(self._parameters)


def using_decoupled_model_transaction_policy(model_config: Any) -> bool:
    """True when the (parsed) model config says `model_transaction_policy { decoupled: true }`."""
    if isinstance(model_config, ModelConfig):
        model_config = model_config.as_dict()
    if isinstance(model_config, str):
        model_config = json.loads(model_config)
    return bool((model_config.get("model_transaction_policy") or {}).get("decoupled", False))


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def _config_entry(model_config: Any, key: str, name: str) -> dict | None:
    if isinstance(model_config, ModelConfig):
        model_config = model_config.as_dict()
    if isinstance(model_config, str):
        model_config = json.loads(model_config)
    for entry in model_config.get(key, []) or []:
        if entry.get("name") == name:
            return entry
    return None


def get_input_config_by_name(model_config: Any, name: str) -> dict | None:
    """The `input` entry of the parsed model config called `name`, or None."""
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: Any, name: str) -> dict | None:
    """The `output` entry of the parsed model config called `name`, or None."""
    return _config_entry(model_config, "output", name)


class ModelConfig:
    """The config a model's `auto_complete_config(auto_complete_model_config)` may extend.

    The changes are returned to the server, which merges them into the model's config before
    validating it. Adding a tensor that exists already must agree with it.
    """

    def __init__(self, model_config: Any) -> None:
        if isinstance(model_config, str):
            model_config = json.loads(model_config)
        self._config: dict = dict(model_config)

    def as_dict(self) -> dict:
        return self._config

    def max_batch_size(self) -> int:
        return int(self._config.get("max_batch_size", 0) or 0)

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if not isinstance(max_batch_size, int) or max_batch_size < 0:
            raise TritonModelException("max_batch_size must be a non-negative integer")
        current = self.max_batch_size()
        if current and current != max_batch_size:
            raise TritonModelException(
                f"configuration specified max_batch_size {current}, but the model's "
                f"auto_complete_config tried to set it to {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        if "sequence_batching" in self._config:
            raise TritonModelException(
                "Configuration specified scheduling_choice as 'sequence_batching', but "
                f"auto-complete-config function for model '{self._config.get('name', '')}' "
                "tries to set scheduling_choice as 'dynamic_batching'"
            )
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        unknown = set(transaction_policy_dict) - {"decoupled"}
        if unknown:
            raise TritonModelException(
                f"model_transaction_policy has unknown keys {sorted(unknown)}"
            )
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)

    def add_input(self, input: dict) -> None:
        self._add("input", input)

    def add_output(self, output: dict) -> None:
        self._add("output", output)

    def _add(self, key: str, tensor: dict) -> None:
        if not isinstance(tensor, dict) or "name" not in tensor:
            raise TritonModelException(f"{key} must be a dict with a 'name'")
        allowed = {
            "name",
            "data_type",
            "dims",
            "optional",
            "reshape",
            "is_shape_tensor",
            "label_filename",
            "allow_ragged_batch",
            "format",
        }
        unknown = set(tensor) - allowed
        if unknown:
            raise TritonModelException(
                f"{key} '{tensor['name']}' has unknown keys {sorted(unknown)}"
            )
        entries = self._config.setdefault(key, [])
        for entry in entries:
            if entry.get("name") != tensor["name"]:
                continue
            for field in ("data_type", "dims"):
                given, existing = tensor.get(field), entry.get(field)
                if given is None:
                    continue
                if field == "dims":
                    given, existing = [int(d) for d in given], [int(d) for d in existing or []]
                    if not existing:
                        entry["dims"] = given
                        continue
                elif existing in (None, "", "TYPE_INVALID"):
                    entry[field] = given
                    continue
                if given != existing:
                    raise TritonModelException(
                        f"model '{self._config.get('name', '')}': {key} '{tensor['name']}' has "
                        f"{field} {existing} in the config, but auto_complete_config gave {given}"
                    )
            return
        entries.append({k: (list(v) if k == "dims" else v) for k, v in tensor.items()})


def _unsupported(what: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise TritonModelException(f"{what} is not supported by ascend-serve")

    call.__name__ = what
    return call


is_model_ready = _unsupported("is_model_ready")
load_model = _unsupported("load_model")
unload_model = _unsupported("unload_model")
