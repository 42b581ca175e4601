"""gRPC wire form <-> the internal types, each direction exactly once.

Inputs: `raw_input_contents` become zero-copy numpy views (datatypes.tensor_from_raw); typed
`contents` become numpy arrays. Outputs always travel in `raw_output_contents`, index-aligned
with `outputs`, never as typed contents: tritonclient's `as_numpy` cannot read typed contents.
Only wire checks happen here (datatypes, element counts, byte sizes, parameter types); checks
against the model config belong to scheduler/validation.py. Nothing here imports grpc.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from protocol import datatypes, shared_memory
from protocol.errors import InvalidArgument
from protocol.grpc.wire import InferAnswer, InferRequestMessage, StreamAnswer
from protocol.proto import grpc_service_pb2 as pb
from protocol.text import shown
from protocol.types import (
    DurationSnapshot,
    IndexEntry,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestedOutput,
    StatisticsSnapshot,
    Tensor,
    TensorMetadata,
)
from protocol.values import TRACE_NUMBER_LOW, check_trace_number

# Request parameters Triton reads itself, with the InferParameter kinds it accepts for each.
_TYPED_PARAMETERS: dict[str, tuple[str, ...]] = {
    "priority": ("uint64_param", "int64_param"),
    "timeout": ("int64_param",),
    "sequence_id": ("int64_param", "uint64_param", "string_param"),
    "sequence_start": ("bool_param",),
    "sequence_end": ("bool_param",),
    "triton_enable_empty_final_response": ("bool_param",),
}
_RESERVED_PREFIX = "triton_"
CONTENTS_STEP = 1 << 16  # typed values converted per step once a tensor has more
_INT64_MAX = 2**63 - 1
# What a ModelInfer deserializer gives: protobuf's message, or protocol/grpc/wire.py's with the
# raw contents left in the received bytes.
ReceivedRequest = pb.ModelInferRequest | InferRequestMessage


# ----- parameters ---------------------------------------------------------------------------
def parameter_value(key: str, parameter: Any) -> Any:
    """The Python value of a parameter_choice oneof (InferParameter, a log SettingValue),
    INVALID_ARG when it holds none."""
    kind = parameter.WhichOneof("parameter_choice")
    if kind is None:
        raise InvalidArgument(f"parameter '{shown(key)}' has no value")
    return getattr(parameter, kind)


def _typed_value(key: str, parameter: pb.InferParameter, kinds: tuple[str, ...]) -> Any:
    kind = parameter.WhichOneof("parameter_choice")
    if kind not in kinds:
        expected = " or ".join(kinds)
        raise InvalidArgument(
            f"invalid value type for '{shown(key)}' parameter, expected {expected}"
        )
    return getattr(parameter, kind)


def _entries(parameters: Mapping[str, pb.InferParameter]) -> Iterable[tuple[str, Any]]:
    """A parameters map's items; nothing to walk for an empty one (most requests), whose
    `items()` on a protobuf map still costs about a microsecond."""
    return parameters.items() if parameters else ()


def decode_request_parameters(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """Request-level parameters as Python values; Triton's own keys must have Triton's types,
    and other `triton_*` keys are reserved."""
    decoded: dict[str, Any] = {}
    for key, parameter in _entries(parameters):
        kinds = _TYPED_PARAMETERS.get(key)
        if kinds is not None:
            decoded[key] = _typed_value(key, parameter, kinds)
        elif key.startswith(_RESERVED_PREFIX):
            raise InvalidArgument(
                f"parameter keys starting with '{_RESERVED_PREFIX}' are reserved "
                f"for Triton usage and should not be specified."
            )
        else:
            decoded[key] = parameter_value(key, parameter)
    return decoded


def encode_parameter(target: pb.InferParameter, value: Any) -> None:
    """Set the InferParameter oneof that matches a Python value (bool before int: bool is int)."""
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, (int, np.integer)):
        if int(value) > _INT64_MAX:
            target.uint64_param = int(value)
        else:
            target.int64_param = int(value)
    elif isinstance(value, (float, np.floating)):
        target.double_param = float(value)
    else:
        target.string_param = str(value)


def encode_parameters(target: Any, values: Mapping[str, Any]) -> None:
    """Fill a map<string, InferParameter> field from a dict."""
    for key, value in values.items():
        encode_parameter(target[key], value)


# ----- inputs -------------------------------------------------------------------------------
def _shape(name: str, dims: Iterable[int]) -> tuple[int, ...]:
    shape = tuple(dims)  # int64 fields: already Python ints
    if shape and min(shape) < 0:
        raise InvalidArgument(
            f"invalid shape {list(shape)} for input '{name}': dimensions must be non-negative"
        )
    return shape


def _array_from_contents(
    tensor: pb.ModelInferRequest.InferInputTensor,
    datatype: datatypes.DataType,
    shape: tuple[int, ...],
) -> np.ndarray:
    """Typed contents -> numpy; FP16/BF16 have no typed field and must be sent raw."""
    field = datatype.contents_field
    if field is None:
        raise InvalidArgument(
            f"{datatype.name} input '{tensor.name}' can only be sent in raw_input_contents"
        )
    values = getattr(tensor.contents, field)
    count = datatypes.checked_element_count(tensor.name, shape, datatype)
    if len(values) != count:
        raise InvalidArgument(
            f"unexpected number of elements for input '{tensor.name}': shape "
            f"{list(shape)} needs {count} values in {field}, got {len(values)}"
        )
    as_objects = datatype.numpy is None or datatype.name == "BYTES"
    if count <= CONTENTS_STEP:
        return _converted(tensor.name, datatype, values, as_objects).reshape(shape)
    # Large typed contents: a step at a time, so no single C call holds the GIL for long (this
    # runs in a thread beside the event loop: server/grpc/services.py).
    array = np.empty(count, dtype=object if as_objects else datatype.numpy)
    for first in range(0, count, CONTENTS_STEP):
        array[first : first + CONTENTS_STEP] = _converted(
            tensor.name, datatype, values[first : first + CONTENTS_STEP], as_objects
        )
    return array.reshape(shape)


def _converted(
    name: str, datatype: datatypes.DataType, values: Any, as_objects: bool
) -> np.ndarray:
    if as_objects:
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
        return array
    try:
        return np.array(values, dtype=datatype.numpy)
    except (OverflowError, ValueError) as exc:
        raise InvalidArgument(
            f"invalid {datatype.name} value for input '{shown(name)}': {exc}"
        ) from None


def per_element_input_bytes(message: ReceivedRequest) -> int:
    """How many bytes of the request are converted element by element when decoded (BYTES raw
    contents, and typed contents at 8 bytes a value); numeric raw contents become views and
    do not count. O(number of inputs): it decides whether the decode leaves the event loop."""
    total = 0
    raw = message.raw_input_contents
    for index, tensor in enumerate(message.inputs):
        if index < len(raw) and tensor.datatype == "BYTES":
            total += len(raw[index])
        if tensor.HasField("contents"):
            for _, values in tensor.contents.ListFields():
                total += 8 * len(values)
    return total


def per_element_output_bytes(response: InferResponse) -> int:
    """The same for a response: BYTES outputs, 8 bytes an element (numeric ones are one copy)."""
    return sum(
        8 * tensor.data.size
        for tensor in response.outputs
        if isinstance(tensor.data, np.ndarray) and tensor.data.dtype == object
    )


def _has_contents(tensor: pb.ModelInferRequest.InferInputTensor) -> bool:
    return tensor.HasField("contents") and tensor.contents.ByteSize() > 0


def _decode_input(
    tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | memoryview | None, model: str
) -> Tensor:
    datatype = datatypes.lookup(tensor.datatype)
    shape = _shape(tensor.name, tensor.shape)
    if shared_memory.REGION in tensor.parameters:  # read where the regions are
        datatypes.checked_element_count(tensor.name, shape, datatype)
        if _has_contents(tensor):
            raise InvalidArgument(
                f"contents field must not be specified when using shared "
                f"memory for '{tensor.name}' for model '{model}'"
            )
        data = shared_memory.placeholder(datatype.numpy)
    elif raw is not None:
        if _has_contents(tensor):
            raise InvalidArgument(
                f"contents field must not be specified when using "
                f"raw_input_contents for '{tensor.name}' for model '{model}'"
            )
        data = datatypes.tensor_from_raw(datatype, shape, raw, tensor.name)
    else:
        data = _array_from_contents(tensor, datatype, shape)
    parameters = {key: parameter_value(key, value) for key, value in _entries(tensor.parameters)}
    return Tensor(tensor.name, datatype.name, shape, data, parameters)


def _raw_contents(message: ReceivedRequest) -> list[bytes | memoryview | None]:
    """One raw buffer per input (read once: each access to protobuf's copies out of the
    message; wire.py's are views of the received bytes), or Nones
    when the request uses typed contents. Inputs in shared memory have no raw entry (as
    tritonclient sends them): the others take the entries in order."""
    raw = list(message.raw_input_contents)
    if not raw:
        return [None] * len(message.inputs)
    in_shm = [shared_memory.REGION in tensor.parameters for tensor in message.inputs]
    expected = len(in_shm) - sum(in_shm)
    if len(raw) != expected:
        raise InvalidArgument(f"expected {expected} inputs but got {len(raw)} raw input contents")
    if expected == len(in_shm):
        return raw  # type: ignore[return-value]  # list[bytes] is one, but list is invariant
    entries = iter(raw)
    return [None if shm else next(entries) for shm in in_shm]


def _decode_output(output: pb.ModelInferRequest.InferRequestedOutputTensor) -> RequestedOutput:
    """A requested output; `classification` must be an integer, `binary_data` means nothing
    over gRPC (outputs are always raw) and is ignored."""
    classification = 0
    parameters: dict[str, Any] = {}
    for key, value in _entries(output.parameters):
        if key == "classification":
            classification = _typed_value(key, value, ("int64_param", "uint64_param"))
            if classification < 0:
                raise InvalidArgument(
                    f"invalid 'classification' count {classification} for output '{output.name}'"
                )
        elif key != "binary_data":
            parameters[key] = parameter_value(key, value)
    if classification and shared_memory.REGION in parameters:
        raise InvalidArgument(
            f"Output can't set both 'shared_memory_region' and "
            f"'classification' (output '{output.name}')"
        )
    return RequestedOutput(output.name, None, classification, parameters)


def decode_infer_request(message: ReceivedRequest) -> InferRequest:
    """ModelInferRequest -> InferRequest: wire checks only, tensors as numpy arrays."""
    raw = _raw_contents(message)
    inputs = [
        _decode_input(tensor, buffer, message.model_name)
        for tensor, buffer in zip(message.inputs, raw, strict=False)
    ]
    outputs = [_decode_output(o) for o in message.outputs] if message.outputs else None
    return InferRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        id=message.id,
        inputs=inputs,
        outputs=outputs,
        parameters=decode_request_parameters(message.parameters),
    )


# ----- outputs ------------------------------------------------------------------------------
# The serialized `outputs` records of answers with no parameters, by their outputs' names,
# datatypes and shapes. A model answers with a few such signatures, and building each output
# in protobuf was most of an answer's encoding (bench/FINDINGS.md 37). At most this many are
# kept; an answer whose signature is not kept is encoded the same way, only not remembered.
OUTPUT_RECORDS_KEPT = 256
_output_records: dict[tuple[tuple[str, str, tuple[int, ...]], ...], bytes] = {}


def encode_infer_answer(response: InferResponse, request_id: str = "") -> InferAnswer:
    """InferResponse -> ModelInfer's answer with every output in raw_output_contents, the
    outputs' bytes still their arrays' (protocol/grpc/wire.py copies them once, into the
    bytes grpc sends); the other fields in protobuf's message, or already serialized when
    no output and not the answer carry parameters (`_planned_answer`)."""
    if not response.parameters:
        signature = []
        for tensor in response.outputs:
            if tensor.parameters:  # shared memory, classification labels, ...: protobuf's way
                break
            signature.append((tensor.name, tensor.datatype, tuple(tensor.shape)))
        else:
            return _planned_answer(response, request_id, tuple(signature))
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or request_id,
    )
    for tensor in response.outputs:
        output = message.outputs.add(
            name=tensor.name, datatype=tensor.datatype, shape=[int(d) for d in tensor.shape]
        )
        encode_parameters(output.parameters, tensor.parameters)
    encode_parameters(message.parameters, response.parameters)
    # index-aligned with `outputs`: an output written to shared memory has an empty entry
    raw = [
        b""
        if shared_memory.REGION in t.parameters
        else datatypes.raw_from_tensor(t.data, t.datatype)
        for t in response.outputs
    ]
    return InferAnswer(message, raw)


def _planned_answer(
    response: InferResponse,
    request_id: str,
    signature: tuple[tuple[str, str, tuple[int, ...]], ...],
) -> InferAnswer:
    """The answer's head serialized as its scalar fields (1-3) followed by the remembered
    `outputs` records (field 5): protobuf writes fields in number order, so the two
    serializations joined are the whole message's."""
    records = _output_records.get(signature)
    if records is None:
        records = pb.ModelInferResponse(
            outputs=[
                pb.ModelInferResponse.InferOutputTensor(
                    name=name, datatype=datatype, shape=[int(d) for d in shape]
                )
                for name, datatype, shape in signature
            ]
        ).SerializeToString()
        if len(_output_records) < OUTPUT_RECORDS_KEPT:
            _output_records[signature] = records
    head = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or request_id,
    ).SerializeToString()
    raw = [datatypes.raw_from_tensor(t.data, t.datatype) for t in response.outputs]
    return InferAnswer(None, raw, head + records)


def encode_infer_response(response: InferResponse, request_id: str = "") -> pb.ModelInferResponse:
    """The same answer as one protobuf message (copies the outputs; the servers send
    `encode_infer_answer`'s)."""
    return encode_infer_answer(response, request_id).to_message()


def stream_response(
    response: pb.ModelInferResponse | InferAnswer, final: bool = True
) -> pb.ModelStreamInferResponse | StreamAnswer:
    """A stream answer; `triton_final_response` tells the client this request is complete."""
    if isinstance(response, InferAnswer):
        response.message.parameters["triton_final_response"].bool_param = final
        return StreamAnswer(response)
    message = pb.ModelStreamInferResponse(infer_response=response)
    message.infer_response.parameters["triton_final_response"].bool_param = final
    return message


def stream_empty_final(model_name: str, request_id: str) -> pb.ModelStreamInferResponse:
    """The flag-only last answer of a decoupled request, for a client that asked for it
    (`triton_enable_empty_final_response`): no outputs, and model_version "" as in Triton."""
    message = pb.ModelStreamInferResponse()
    message.infer_response.model_name = model_name
    message.infer_response.id = request_id
    message.infer_response.parameters["triton_final_response"].bool_param = True
    return message


def stream_error(message: str, request_id: str) -> pb.ModelStreamInferResponse:
    """A failed stream request: the error text, and the id so the client knows which one."""
    answer = pb.ModelStreamInferResponse(error_message=message)
    answer.infer_response.id = request_id
    return answer


# ----- metadata, config, index --------------------------------------------------------------
def encode_server_metadata(metadata: Mapping[str, Any]) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(
        name=metadata["name"], version=metadata["version"], extensions=list(metadata["extensions"])
    )


def _tensor_metadata(
    items: Sequence[TensorMetadata],
) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    return [
        pb.ModelMetadataResponse.TensorMetadata(
            name=t.name, datatype=t.datatype, shape=list(t.shape)
        )
        for t in items
    ]


def encode_model_metadata(meta: ModelMetadata) -> pb.ModelMetadataResponse:
    return pb.ModelMetadataResponse(
        name=meta.name,
        versions=list(meta.versions),
        platform=meta.platform,
        inputs=_tensor_metadata(meta.inputs),
        outputs=_tensor_metadata(meta.outputs),
    )


def encode_model_config(config: Any) -> pb.ModelConfigResponse:
    """The same ModelConfig message config.pbtxt was parsed into (so any Triton config
    round-trips unchanged)."""
    return pb.ModelConfigResponse(config=config)


def encode_repository_index(entries: Iterable[IndexEntry]) -> pb.RepositoryIndexResponse:
    """Missing version/state/reason are "" on gRPC, as in Triton."""
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.ModelIndex(
                name=e.name, version=e.version, state=e.state, reason=e.reason
            )
            for e in entries
        ]
    )


# ----- statistics ---------------------------------------------------------------------------
def _duration(duration: DurationSnapshot) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=duration.count, ns=duration.ns)


def encode_statistics(stats: StatisticsSnapshot) -> pb.ModelStatistics:
    """One version's statistics with the same fields as the HTTP JSON (protocol/rest/encode.py
    encode_statistics), from one snapshot so the counts agree with each other."""
    return pb.ModelStatistics(
        name=stats.name,
        version=stats.version,
        last_inference=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(stats.success),
            fail=_duration(stats.fail),
            queue=_duration(stats.queue),
            compute_input=_duration(stats.compute_input),
            compute_infer=_duration(stats.compute_infer),
            compute_output=_duration(stats.compute_output),
            cache_hit=_duration(stats.cache_hit),
            cache_miss=_duration(stats.cache_miss),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=b.batch_size,
                compute_input=_duration(b.compute_input),
                compute_infer=_duration(b.compute_infer),
                compute_output=_duration(b.compute_output),
            )
            for b in stats.batch_stats
        ],
    )


def encode_statistics_response(items: Iterable[StatisticsSnapshot]) -> pb.ModelStatisticsResponse:
    return pb.ModelStatisticsResponse(model_stats=[encode_statistics(s) for s in items])


# ----- repository load parameters -----------------------------------------------------------
def decode_load_parameters(
    name: str, parameters: Mapping[str, pb.ModelRepositoryParameter]
) -> tuple[str | None, dict[str, bytes]]:
    """`config` (a JSON string) and `file:<path>` (bytes) from a RepositoryModelLoad request."""
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, parameter in parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        if key == "config":
            if kind != "string_param":
                raise InvalidArgument(
                    f"load failed for model '{name}': parameter 'config' must be a string_param"
                )
            config = parameter.string_param
        elif key.startswith("file:"):
            if kind != "bytes_param":
                raise InvalidArgument(
                    f"load failed for model '{name}': file content for "
                    f"'{key}' must be a bytes_param"
                )
            files[key[len("file:") :]] = parameter.bytes_param
    return config, files


def decode_unload_dependents(parameters: Mapping[str, pb.ModelRepositoryParameter]) -> bool:
    parameter = parameters.get("unload_dependents")
    if parameter is None:
        return False
    if parameter.WhichOneof("parameter_choice") != "bool_param":
        raise InvalidArgument("'unload_dependents' must be a boolean")
    return parameter.bool_param


# ----- shared memory --------------------------------------------------------------------------
def encode_system_shm_status(
    regions: Iterable[Mapping[str, Any]],
) -> pb.SystemSharedMemoryStatusResponse:
    """The registry's status rows, keyed by region name as Triton's map is."""
    response = pb.SystemSharedMemoryStatusResponse()
    for region in regions:
        response.regions[region["name"]].CopyFrom(
            pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)
        )
    return response


# ----- trace and log settings ---------------------------------------------------------------
def decode_trace_settings(
    settings: Mapping[str, pb.TraceSettingRequest.SettingValue],
) -> dict[str, list[str] | None]:
    """Each key's list of strings; an empty list means "reset to the global value" (None).
    Numbers are checked here in Triton's gRPC wording (protocol/values.py)."""
    changes = {key: (list(value.value) or None) for key, value in settings.items()}
    for key, values in changes.items():
        if key in TRACE_NUMBER_LOW and values is not None and len(values) == 1:
            check_trace_number(key, values[0], grpc=True)
    return changes


def encode_trace_settings(settings: Mapping[str, list[str]]) -> pb.TraceSettingResponse:
    response = pb.TraceSettingResponse()
    for key, values in settings.items():
        response.settings[key].value.extend(values)
    return response


# A log setting -> the SettingValue field Triton wants it in, and its words for another.
_LOG_KINDS = {
    "log_info": ("bool_param", "boolean"),
    "log_warning": ("bool_param", "boolean"),
    "log_error": ("bool_param", "boolean"),
    "log_verbose_level": ("uint32_param", "int32"),
    "log_format": ("string_param", "string"),
}


def decode_log_settings(
    settings: Mapping[str, pb.LogSettingsRequest.SettingValue],
) -> dict[str, Any]:
    """Each setting's value; one in the wrong field is refused in Triton's words
    ("expect int32 for 'log_verbose_level'"). Unknown keys are left to the core."""
    decoded: dict[str, Any] = {}
    for key, value in settings.items():
        kind = _LOG_KINDS.get(key)
        if kind is not None and value.WhichOneof("parameter_choice") != kind[0]:
            raise InvalidArgument(f"expect {kind[1]} for '{key}'")
        decoded[key] = parameter_value(key, value)
    return decoded


def encode_log_settings(settings: Mapping[str, Any]) -> pb.LogSettingsResponse:
    """bool -> bool_param, int -> uint32_param, str -> string_param."""
    response = pb.LogSettingsResponse()
    for key, value in settings.items():
        target = response.settings[key]
        if isinstance(value, bool):
            target.bool_param = value
        elif isinstance(value, int):
            target.uint32_param = value
        else:
            target.string_param = str(value)
    return response
