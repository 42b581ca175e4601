"""The HTTP/REST wire form <-> InferRequest / InferResponse, converted exactly once.

protocol.md 1.5-1.7. Decoding trusts no number from the wire before checking it: the JSON
nesting depth is measured by a linear scan before parsing, shapes are checked for overflow and
against the size limit before anything is sized from them, and binary inputs become zero-copy
`np.frombuffer` views over the request body. Error texts follow Triton's, so clients that match
on them keep working; Triton answers 500 for some of these (negative dims, element counts), we
answer 400 (InvalidArgument) for every malformed request.
"""
from __future__ import annotations

import re
from itertools import chain
from typing import Any, Optional, Union

import numpy as np
import orjson

from protocol import datatypes
from protocol.datatypes import DataType
from protocol.errors import InternalError, InvalidArgument, TooLarge
from protocol.types import InferRequest, InferResponse, RequestedOutput, Tensor

Buffer = Union[bytes, bytearray, memoryview]

HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"
DEFAULT_MAX_JSON_DEPTH = 100
MAX_DIMS = 64  # numpy's limit on ndim; more dims could never become an array
_INT64_MAX = 2**63 - 1
_LIMIT_HINT = "Use --http-max-input-size to increase the limit."
_DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


# --------------------------------------------------------------------------- framing

_HEADER_LENGTH_RE = re.compile(r"-?[0-9]{1,20}")


def parse_header_length(value: Optional[str]) -> Optional[int]:
    """The Inference-Header-Content-Length header as an int (None when absent).

    Only plain decimal digits are accepted: Triton's atoi turns text into 0, which would make a
    garbled header look like a raw binary request.
    """
    if value is None:
        return None
    if value.isascii() and value.isdigit() and len(value) <= 20:  # the usual form, no regex
        return int(value)
    text = value.strip()
    if not _HEADER_LENGTH_RE.fullmatch(text):
        raise InvalidArgument(f"Unable to parse {HEADER_LENGTH_HEADER}, got: {value[:64]}")
    return int(text)


def check_header_length(header_length: int, body_size: int) -> None:
    """A header length must lie within the (decompressed) body."""
    if header_length < 0 or header_length > body_size:
        raise InvalidArgument(
            f"inference header size should be in range (0, {body_size}), got: {header_length}")


# --------------------------------------------------------------------------- JSON depth

_ESCAPE_RE = re.compile(rb"\\.", re.DOTALL)
_STRING_RE = re.compile(rb'"[^"]*"')
_NON_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_DELTA = np.zeros(256, dtype=np.int8)
_BRACKET_DELTA[list(b"[{")] = 1
_BRACKET_DELTA[list(b"]}")] = -1
_DEPTH_CHUNK = 1 << 20


def check_json_depth(text: bytes, limit: int = DEFAULT_MAX_JSON_DEPTH) -> None:
    """Reject JSON nested deeper than `limit` before any parser sees it (CVE-2025-23325).

    Linear and allocation-light: the usual request has fewer brackets than the limit and costs
    two `count` calls. Otherwise escape pairs are dropped first (so no quote is escaped and
    strings are plain `"[^"]*"`, which a regex matches without backtracking), strings are
    dropped (brackets inside them don't nest), then everything but brackets, and the running
    depth is a chunked cumulative sum.
    """
    if text.count(b"[") + text.count(b"{") <= limit:
        return
    if b"\\" in text:
        text = _ESCAPE_RE.sub(b"", text)
    if b'"' in text:
        text = _STRING_RE.sub(b"", text)
    brackets = text.translate(None, _NON_BRACKETS)
    depth = 0
    for start in range(0, len(brackets), _DEPTH_CHUNK):
        count = min(_DEPTH_CHUNK, len(brackets) - start)
        chunk = np.frombuffer(brackets, dtype=np.uint8, count=count, offset=start)
        running = np.cumsum(_BRACKET_DELTA[chunk], dtype=np.int32)
        running += depth
        if int(running.max()) > limit:
            raise InvalidArgument(f"JSON nesting depth exceeds maximum allowed limit ({limit})")
        depth = int(running[-1])


def _parse_json(text: Buffer) -> dict[str, Any]:
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgument("failed to parse the request JSON buffer: expected a JSON object")
    return document


# --------------------------------------------------------------------------- request

def decode_infer_request(body: Buffer, header_length: Optional[int], model_name: str,
                         model_version: str, *, max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
                         max_bytes: Optional[int] = None) -> InferRequest:
    """Decode a JSON or JSON+binary infer body (decompressed) into an InferRequest.

    `header_length` is the parsed Inference-Header-Content-Length, None when absent (the whole
    body is JSON). A header length of 0 is a raw binary request: use `decode_raw_request`.
    `max_bytes` caps the decoded size of all inputs together (the --http-max-input-size value),
    so a JSON body whose dtype expansion or claimed shapes exceed it is refused before any
    allocation.
    """
    view = memoryview(body).cast("B") if isinstance(body, memoryview) else memoryview(body)
    size = view.nbytes
    if header_length is None:
        json_end = size
    else:
        check_header_length(header_length, size)
        if header_length == 0:
            raise ValueError("header length 0 is a raw binary request: call decode_raw_request")
        json_end = header_length
    whole = json_end == size and isinstance(body, (bytes, bytearray))
    header = body if whole else bytes(view[:json_end])
    check_json_depth(header, max_json_depth)
    document = _parse_json(header)

    request = InferRequest(model_name=model_name, model_version=model_version)
    request.id = _parse_id(document)
    request.parameters = _parse_request_parameters(document)
    cursor = _BinaryCursor(view, json_end, header_length is not None, model_name)
    may_hold_bools = b"true" in header or b"false" in header
    request.inputs = _decode_inputs(document, cursor, max_bytes, may_hold_bools)
    cursor.finish()
    request.outputs = _parse_outputs(document)
    return request


def _parse_id(document: dict[str, Any]) -> str:
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("Unable to parse 'id': expected a string")
    return request_id


# Reserved request parameters Triton reads itself, with the JSON types it accepts.
def _is_uint(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_bool(value: Any) -> bool:
    return type(value) is bool


def _is_sequence_id(value: Any) -> bool:
    return _is_uint(value) or isinstance(value, str)


_RESERVED_PARAMETERS = {
    "sequence_id": _is_sequence_id,
    "sequence_start": _is_bool,
    "sequence_end": _is_bool,
    "priority": _is_uint,
    "timeout": _is_uint,
    "binary_data_output": _is_bool,
}
_CUSTOM_PARAMETER_TYPES = (str, int, bool, float)


def _parse_request_parameters(document: dict[str, Any]) -> dict[str, Any]:
    """Request-level parameters, type-checked; reserved ones stay in the dict for later layers."""
    parameters = document.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidArgument("Unable to parse 'parameters': expected a JSON object")
    for key, value in parameters.items():
        check = _RESERVED_PARAMETERS.get(key)
        if check is not None:
            if not check(value):
                raise InvalidArgument(f"Unable to parse '{key}'")
        elif key.startswith("triton_"):
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage "
                "and should not be specified.")
        elif not isinstance(value, _CUSTOM_PARAMETER_TYPES):
            raise InvalidArgument(f"parameter '{key}' has invalid type. It should be either "
                                  "'int', 'bool', or 'string'.")
    return parameters


class _BinaryCursor:
    """Hands out the binary segments that follow the JSON, in input order."""

    __slots__ = ("view", "offset", "has_header", "model_name")

    def __init__(self, view: memoryview, json_end: int, has_header: bool, model_name: str) -> None:
        self.view = view
        self.offset = json_end
        self.has_header = has_header
        self.model_name = model_name

    def take(self, name: str, size: int) -> memoryview:
        """The next `size` bytes, as a view (no copy)."""
        if size == 0:
            return self.view[self.offset:self.offset]
        if not self.has_header:
            raise InvalidArgument(
                f"must specify valid '{HEADER_LENGTH_HEADER}' in request header and "
                "'binary_data_size' when passing inputs in binary data format")
        end = self.offset + size
        available = self.view.nbytes - self.offset
        if size > available:
            raise InvalidArgument(
                f"unexpected size for input '{name}', expecting {size - available} additional "
                f"bytes for model '{self.model_name}'")
        segment = self.view[self.offset:end]
        self.offset = end
        return segment

    def finish(self) -> None:
        """Every byte after the JSON must belong to some input."""
        if self.offset != self.view.nbytes:
            raise InvalidArgument(f"unexpected additional input data for model '{self.model_name}'")


def _decode_inputs(document: dict[str, Any], cursor: _BinaryCursor, max_bytes: Optional[int],
                   may_hold_bools: bool) -> list[Tensor]:
    entries = document.get("inputs")
    if not isinstance(entries, list):
        raise InvalidArgument("Unable to parse 'inputs': expected a JSON array")
    tensors: list[Tensor] = []
    seen: set[str] = set()
    budget = _SizeBudget(max_bytes)
    for index, entry in enumerate(entries):
        tensor = _decode_input(entry, index, cursor, budget, may_hold_bools)
        if tensor.name in seen:
            raise InvalidArgument(f"input '{tensor.name}' already exists in request")
        seen.add(tensor.name)
        tensors.append(tensor)
    return tensors


class _SizeBudget:
    """Bytes the inputs' shapes may claim in total, checked before any input is decoded."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: Optional[int]) -> None:
        self.limit = limit
        self.used = 0

    def claim(self, name: str, shape: tuple[int, ...], datatype: DataType, count: int) -> None:
        self.used += count * max(datatype.itemsize, 1)
        if self.limit is not None and self.used > self.limit:
            raise TooLarge(
                f"input '{name}' with shape {list(shape)} and datatype {datatype.name} brings "
                f"the request's inputs to {self.used} bytes, which exceeds the maximum allowed "
                f"input size of {self.limit} bytes. {_LIMIT_HINT}")


def _decode_input(entry: Any, index: int, cursor: _BinaryCursor, budget: _SizeBudget,
                  may_hold_bools: bool) -> Tensor:
    """One input: its metadata, then its data from JSON or from the binary section."""
    if not isinstance(entry, dict):
        raise InvalidArgument(f"Unable to parse 'inputs': input {index} is not a JSON object")
    name = entry.get("name")
    if not isinstance(name, str):
        raise InvalidArgument(f"Unable to parse 'name' of input {index}: expected a string")
    parameters = _input_parameters(name, entry)
    binary_size = _input_source(name, entry, parameters)
    datatype = _parse_datatype(name, entry.get("datatype"))
    shape = _parse_shape(name, entry.get("shape"))
    count = _checked_element_count(name, shape, datatype)
    budget.claim(name, shape, datatype, count)
    if binary_size is None:
        data = _tensor_from_json(name, datatype, shape, count, entry["data"], may_hold_bools)
    else:
        segment = cursor.take(name, binary_size)
        data = _tensor_from_binary(name, datatype, shape, count, segment, cursor.model_name)
    if "binary_data_size" in parameters:
        parameters = {k: v for k, v in parameters.items() if k != "binary_data_size"}
    return Tensor(name=name, datatype=datatype.name, shape=shape, data=data, parameters=parameters)


def _input_parameters(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    parameters = entry.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidArgument(
            f"Unable to parse 'parameters' for input '{name}': expected a JSON object")
    return parameters


def _input_source(name: str, entry: dict[str, Any], parameters: dict[str, Any]) -> Optional[int]:
    """The input's binary_data_size, or None when its data is JSON; exactly one source allowed."""
    has_data = "data" in entry
    has_binary = "binary_data_size" in parameters
    has_shm = "shared_memory_region" in parameters
    if has_data + has_binary + has_shm != 1:
        found = [label for label, present in (("'data'", has_data),
                                              ("'binary_data_size'", has_binary),
                                              ("'shared_memory_region'", has_shm)) if present]
        but = " set " + " ".join(found) if found else " no field is set"
        raise InvalidArgument(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            f"'parameters', 'shared_memory_region' in 'parameters'. But{but} (input '{name}')")
    if has_shm:
        raise InvalidArgument(
            f"input '{name}' uses shared memory region '{parameters['shared_memory_region']}', "
            "but shared memory is not supported by this server; send the data as JSON or binary")
    if not has_binary:
        return None
    size = parameters["binary_data_size"]
    if not _is_uint(size):
        raise InvalidArgument(f"Unable to parse 'binary_data_size' for input '{name}': "
                              "expected a non-negative integer")
    return size


def _parse_datatype(name: str, value: Any) -> DataType:
    if not isinstance(value, str):
        raise InvalidArgument(f"Unable to parse 'datatype' for input '{name}': expected a string")
    datatype = datatypes.BY_NAME.get(value)
    if datatype is None:
        raise InvalidArgument(f"invalid datatype '{value[:64]}' for input '{name}'")
    return datatype


def _parse_shape(name: str, value: Any) -> tuple[int, ...]:
    """A list of unsigned integers (bools and floats refused, as JSON's uint access does)."""
    if not isinstance(value, list):
        raise InvalidArgument(f"Unable to parse 'shape' for input '{name}': expected a JSON array")
    if len(value) > MAX_DIMS:
        raise InvalidArgument(
            f"Unable to parse 'shape' for input '{name}': {len(value)} dimensions exceed the "
            f"maximum of {MAX_DIMS}")
    for position, dim in enumerate(value):
        if type(dim) is not int or dim < 0 or dim > _INT64_MAX:
            raise InvalidArgument(
                f"Unable to parse 'shape' for input '{name}': dimension {position} must be a "
                f"non-negative integer, got {str(dim)[:32]}")
    return tuple(value)


def _checked_element_count(name: str, shape: tuple[int, ...], datatype: DataType) -> int:
    """prod(shape), refusing shapes whose element or byte count overflows int64."""
    count = datatypes.element_count(shape)
    if count * max(datatype.itemsize, 1) > _INT64_MAX:
        raise InvalidArgument(
            f"shape {list(shape)} of input '{name}' is too large: its byte size overflows int64")
    return count


# --------------------------------------------------------------------------- input data

def _tensor_from_binary(name: str, datatype: DataType, shape: tuple[int, ...], count: int,
                        segment: memoryview, model_name: str) -> np.ndarray:
    """A zero-copy view for fixed-size types; BYTES elements parsed from their length prefixes."""
    if datatype.itemsize:
        expected = count * datatype.itemsize
        if segment.nbytes != expected:
            raise InvalidArgument(
                f"input byte size mismatch for input '{name}' for model '{model_name}'. "
                f"Expected {expected}, got {segment.nbytes}")
    elif count * 4 > segment.nbytes:
        # Checked before deserialising, which allocates one slot per claimed element.
        raise InvalidArgument(
            f"incomplete string length indicator for inference input '{name}': {count} "
            f"elements need at least {count * 4} bytes but only {segment.nbytes} bytes available")
    return datatypes.tensor_from_raw(datatype, shape, segment, name)


def _tensor_from_json(name: str, datatype: DataType, shape: tuple[int, ...], count: int,
                      data: Any, may_hold_bools: bool) -> np.ndarray:
    if not datatype.json_allowed:
        raise InvalidArgument(
            f"receiving {datatype.name} data via JSON is not supported. Please use the binary "
            f"data format for input {name}")
    if not isinstance(data, list):
        raise InvalidArgument(f"Unable to parse 'data' for input '{name}': expected a JSON array")
    if datatype.name == "BYTES":
        flat = _bytes_from_json(name, data)
    else:
        flat = _numbers_from_json(name, datatype, data, may_hold_bools)
    if flat.size != count:
        raise InvalidArgument(
            "Unable to parse 'data': Shape does not match true shape of 'data' field: "
            f"unexpected number of elements for input '{name}': shape {list(shape)} needs "
            f"{count}, 'data' holds {flat.size}")
    return flat.reshape(shape)


def _flatten(data: list) -> list:
    """Leaves of arbitrarily nested lists, row-major, without recursion."""
    leaves: list = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                stack.append(iter(item))
                break
            leaves.append(item)
        else:
            stack.pop()
    return leaves


def _bytes_from_json(name: str, data: list) -> np.ndarray:
    """JSON strings -> flat object array of their UTF-8 bytes (sized by the data, not the shape)."""
    try:
        encoded = [item.encode("utf-8") for item in data]
    except AttributeError:  # a nested list (or a non-string): flatten, then check the leaves
        encoded = _encode_strings(name, _flatten(data))
    out = np.empty(len(encoded), dtype=object)
    out[:] = encoded
    return out


def _encode_strings(name: str, leaves: list) -> list[bytes]:
    try:
        return [item.encode("utf-8") for item in leaves]
    except AttributeError:
        raise InvalidArgument(
            f"Unable to parse 'data' for input '{name}': BYTES expects JSON strings") from None


_KIND_NAMES = {"b": "JSON booleans", "i": "JSON integers", "u": "JSON integers",
               "f": "JSON numbers"}
# Element kinds numpy may infer from JSON values that each target kind accepts.
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


def _numbers_from_json(name: str, datatype: DataType, data: list,
                       may_hold_bools: bool) -> np.ndarray:
    """Numeric JSON values -> a flat array of the datatype, built by numpy in C.

    numpy infers the element kind of the whole (possibly nested) list in one pass; the kind
    tells ints from floats from bools without a Python loop. Bools mixed into numbers are the
    one thing the inferred kind hides, so those are looked for only when the JSON text holds
    `true` or `false` at all.
    """
    target = datatype.numpy
    array = _infer_array(data)
    if array.size == 0:
        return np.empty(0, dtype=target)
    want = target.kind
    if want in "iu" and array.dtype.kind in "fO":
        # Ints past int64 mixed with others make numpy pick float64 (losing precision) or object.
        return _exact_ints(name, datatype, data, array.ndim)
    if array.dtype.kind not in _ACCEPTED_KINDS[want]:
        raise _type_error(name, datatype)
    if want != "b" and may_hold_bools and bool in _leaf_types(data, array.ndim):
        raise _type_error(name, datatype)
    if want in "iu":
        _check_int_range(name, datatype, array)
    return array.reshape(-1).astype(target, copy=False)


def _infer_array(data: list) -> np.ndarray:
    try:
        return np.array(data)
    except (ValueError, OverflowError, TypeError):
        # Ragged nesting ([[1, 2], [3]]): Triton accepts any nesting whose leaf count matches.
        try:
            return np.array(_flatten(data))
        except (ValueError, OverflowError, TypeError):
            return np.array(_flatten(data), dtype=object)


def _leaf_types(data: list, ndim: int) -> set[type]:
    """The Python types of the leaves; C-speed iteration when the nesting is rectangular."""
    leaves: Any = data
    for _ in range(ndim - 1):
        leaves = chain.from_iterable(leaves)
    types = set(map(type, leaves))
    if list in types:  # ragged nesting: numpy saw the flattened leaves
        types = set(map(type, _flatten(data)))
    return types


def _exact_ints(name: str, datatype: DataType, data: list, ndim: int) -> np.ndarray:
    """Integers numpy could not infer as one integer dtype, converted exactly (or refused)."""
    if _leaf_types(data, ndim) != {int}:
        raise _type_error(name, datatype)
    leaves = data if ndim <= 1 and not any(type(x) is list for x in data) else _flatten(data)
    try:
        return np.array(leaves, dtype=datatype.numpy)
    except OverflowError:
        raise InvalidArgument(
            f"Unable to parse 'data' for input '{name}': a value is out of range for "
            f"{datatype.name}") from None


def _type_error(name: str, datatype: DataType) -> InvalidArgument:
    return InvalidArgument(
        f"Unable to parse 'data' for input '{name}': {datatype.name} expects "
        f"{_KIND_NAMES[datatype.numpy.kind]}")


def _check_int_range(name: str, datatype: DataType, array: np.ndarray) -> None:
    info = np.iinfo(datatype.numpy)
    low, high = int(array.min()), int(array.max())
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        raise InvalidArgument(
            f"Unable to parse 'data' for input '{name}': value {bad} is out of range for "
            f"{datatype.name}")


# --------------------------------------------------------------------------- outputs

def _parse_outputs(document: dict[str, Any]) -> Optional[list[RequestedOutput]]:
    """Requested outputs; None (every output) when the list is absent or empty, as in Triton."""
    entries = document.get("outputs")
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise InvalidArgument("Unable to parse 'outputs': expected a JSON array")
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        output = _parse_output(entry, index)
        if output.name in seen:
            raise InvalidArgument(f"output '{output.name}' already exists in request")
        seen.add(output.name)
        outputs.append(output)
    return outputs or None


def _parse_output(entry: Any, index: int) -> RequestedOutput:
    if not isinstance(entry, dict):
        raise InvalidArgument(f"Unable to parse 'outputs': output {index} is not a JSON object")
    name = entry.get("name")
    if not isinstance(name, str):
        raise InvalidArgument(f"Unable to parse 'name' of output {index}: expected a string")
    parameters = entry.get("parameters")
    if parameters is None:
        parameters = {}
    elif not isinstance(parameters, dict):
        raise InvalidArgument(
            f"Unable to parse 'parameters' for output '{name}': expected a JSON object")
    if "shared_memory_region" in parameters:
        region = parameters["shared_memory_region"]
        raise InvalidArgument(f"output '{name}' asks for shared memory region '{region}', but "
                              "shared memory is not supported by this server")
    binary = parameters.get("binary_data")
    if binary is not None and not _is_bool(binary):
        raise InvalidArgument(f"Unable to parse 'binary_data' for output '{name}'")
    classification = parameters.get("classification", 0)
    if not _is_uint(classification):
        raise InvalidArgument(f"Unable to set 'classification' for output '{name}'")
    return RequestedOutput(name=name, binary=binary, classification=classification,
                           parameters=parameters)


# --------------------------------------------------------------------------- raw request

def raw_input_count_message(model_name: str, input_count: int) -> str:
    """Triton's text for a raw binary request to a model without exactly one input."""
    return (f"Raw request must only have 1 input (found 1) to be deduced but got {input_count} "
            f"inputs in '{model_name}' model configuration")


def check_raw_input_count(model_name: str, input_count: int) -> None:
    """A raw binary request (header length 0) needs a model with exactly one input."""
    if input_count != 1:
        raise InvalidArgument(raw_input_count_message(model_name, input_count))


def decode_raw_request(body: Buffer, model_name: str, model_version: str, input_name: str,
                       datatype: str, dims: list[int], max_batch_size: int) -> InferRequest:
    """The whole body is the data of the model's single input (Inference-Header-Content-Length: 0).

    `datatype` may be a wire name ("FP32") or a config name ("TYPE_FP32"); `dims` are the
    config dims, where at most one may be -1 and is deduced from the body size. Batching
    models get batch 1. Every output comes back binary, as Triton does for raw requests.
    """
    wire = _raw_datatype(datatype)
    shape = ([1] if max_batch_size > 0 else []) + [int(d) for d in dims]
    view = memoryview(body).cast("B") if isinstance(body, memoryview) else memoryview(body)
    variable = [i for i, dim in enumerate(shape) if dim == -1]
    if len(variable) > 1:
        raise InvalidArgument(
            f"The shape of the raw input '{input_name}' can not be deduced because there are "
            "more than one variable-sized dimension")
    if wire.name == "BYTES":
        data = _raw_bytes_input(input_name, shape, variable, view)
    else:
        data = _raw_fixed_input(input_name, wire, shape, variable, view, model_name)
    tensor = Tensor(name=input_name, datatype=wire.name, shape=tuple(data.shape), data=data)
    return InferRequest(model_name=model_name, model_version=model_version, inputs=[tensor],
                        parameters={"binary_data_output": True})


def _raw_datatype(datatype: str) -> DataType:
    found = datatypes.BY_CONFIG_NAME.get(datatype) or datatypes.BY_NAME.get(datatype)
    if found is None:
        raise InvalidArgument(f"invalid datatype '{datatype}' for the raw input")
    return found


def _raw_bytes_input(input_name: str, shape: list[int], variable: list[int],
                     view: memoryview) -> np.ndarray:
    """A BYTES raw input is one element holding the whole body."""
    if variable or datatypes.element_count(shape) != 1:
        raise InvalidArgument(
            f"For BYTE datatype raw input '{input_name}', the model must have input shape [1]")
    data = np.empty(1, dtype=object)
    whole = isinstance(view.obj, bytes) and view.nbytes == len(view.obj)
    data[0] = view.obj if whole else view.tobytes()
    return data.reshape(shape)


def _raw_fixed_input(input_name: str, datatype: DataType, shape: list[int], variable: list[int],
                     view: memoryview, model_name: str) -> np.ndarray:
    fixed = datatypes.element_count([d for d in shape if d != -1]) * datatype.itemsize
    if variable:
        shape[variable[0]] = view.nbytes // fixed if fixed else 0
    expected = datatypes.element_count(shape) * datatype.itemsize
    if view.nbytes != expected:
        raise InvalidArgument(
            f"input byte size mismatch for input '{input_name}' for model '{model_name}'. "
            f"Expected {expected}, got {view.nbytes}")
    return np.frombuffer(view, dtype=datatype.numpy).reshape(shape)


# --------------------------------------------------------------------------- response

def encode_infer_response(response: InferResponse, requested: Optional[list[RequestedOutput]],
                          binary_default: bool) -> tuple[bytes, Optional[int]]:
    """The response body and its JSON length (None when nothing binary follows the JSON).

    An output is binary when its RequestedOutput says so, or says nothing and `binary_default`
    (the request's binary_data_output) is true. Binary blobs follow the JSON in output order.
    """
    choices = {output.name: output.binary for output in requested} if requested else {}
    entries: list[dict[str, Any]] = []
    blobs: list[Buffer] = []
    for tensor in response.outputs:
        choice = choices.get(tensor.name)
        if binary_default if choice is None else choice:
            blob = datatypes.raw_from_tensor(_wire_array(tensor), tensor.datatype)
            entries.append(_output_entry(tensor, len(blob)))
            blobs.append(blob)
        else:
            entry = _output_entry(tensor, None)
            entry["data"] = _json_data(tensor)
            entries.append(entry)
    header = _dumps(_response_document(response, entries))
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def encode_error(message: str) -> bytes:
    """The error body every failed HTTP call carries."""
    return orjson.dumps({"error": message})


def _response_document(response: InferResponse, outputs: list[dict[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    if response.id:
        document["id"] = response.id
    document["model_name"] = response.model_name
    document["model_version"] = str(response.model_version)
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = outputs
    return document


def _output_entry(tensor: Tensor, binary_size: Optional[int]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "shape": [int(dim) for dim in tensor.shape],
    }
    if binary_size is not None:
        entry["parameters"] = {**tensor.parameters, "binary_data_size": binary_size}
    elif tensor.parameters:
        entry["parameters"] = tensor.parameters
    return entry


def _wire_array(tensor: Tensor) -> np.ndarray:
    """The output as its datatype's native little-endian numpy dtype (BYTES left as is)."""
    datatype = datatypes.BY_NAME.get(tensor.datatype)
    if datatype is None:
        raise InternalError(f"output '{tensor.name}' has unknown datatype '{tensor.datatype}'")
    array = np.asarray(tensor.data)
    if datatype.numpy is None or array.dtype == datatype.numpy:
        return array
    if datatype.name == "BF16" and array.dtype.kind == "f":
        return _float_to_bf16_bits(array)
    return array.astype(datatype.numpy)


def _float_to_bf16_bits(array: np.ndarray) -> np.ndarray:
    """The top 16 bits of each float32 (truncation), which is what BF16 on the wire carries."""
    return (np.ascontiguousarray(array, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _json_data(tensor: Tensor) -> Any:
    """Flat row-major JSON data: numpy arrays go to orjson as is; BYTES become strings."""
    array = _wire_array(tensor)
    if tensor.datatype == "BYTES":
        return [_as_text(item) for item in array.reshape(-1).tolist()]
    if tensor.datatype == "BF16":
        array = (array.astype(np.uint32) << 16).view(np.float32)
    # orjson needs C-contiguous native-endian arrays; FP16 it writes as float32 values.
    return np.ascontiguousarray(array).reshape(-1)


def _as_text(item: Any) -> str:
    """BYTES elements for JSON: UTF-8 decoded; invalid sequences become U+FFFD.

    Triton copies raw bytes into the JSON string, which makes invalid JSON for non-UTF-8
    data; replacing keeps the body valid. Clients that need exact bytes ask for binary.
    """
    if isinstance(item, (bytes, bytearray)):
        return item.decode("utf-8", errors="replace")
    if isinstance(item, str):
        return item
    return str(item)


def _dumps(document: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(document, option=_DUMPS_OPTIONS)
    except orjson.JSONEncodeError as exc:
        raise InternalError(f"failed to serialize the inference response: {exc}") from None
