"""The HTTP/REST request wire form -> InferRequest (and the repository requests' parameters),
converted exactly once.

protocol.md 1.5-1.7. Decoding trusts no number from the wire before checking it: the JSON
nesting depth is measured by a linear scan before parsing, and each input is checked before
anything is sized from it (protocol/rest/inputs.py). Error texts follow Triton's, so clients that
match on them keep working; Triton answers 500 for some of these (negative dims, element counts),
we answer 400 (InvalidArgument) for every malformed request.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

import numpy as np
import orjson

from protocol import datatypes, shared_memory
from protocol.datatypes import DataType
from protocol.errors import InvalidArgument
from protocol.request_plans import RequestPlans
from protocol.rest.common import HEADER_LENGTH_HEADER, Buffer
from protocol.rest.header_plans import plan_of
from protocol.rest.inputs import BinaryCursor, decode_inputs, read_planned_inputs
from protocol.text import shown
from protocol.types import InferRequest, RequestedOutput, Tensor
from protocol.values import is_bool, is_uint

DEFAULT_MAX_JSON_DEPTH = 100
# The headers of binary requests decoded before, by their bytes (one table per process).
_PLANS = RequestPlans()


# --------------------------------------------------------------------------- framing

_HEADER_LENGTH_RE = re.compile(r"-?[0-9]{1,20}")


def parse_header_length(value: str | None) -> int | None:
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
            f"inference header size should be in range (0, {body_size}), got: {header_length}"
        )


# --------------------------------------------------------------------------- JSON depth

_KEEP_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_BRACKET_DELTA = np.zeros(256, dtype=np.int8)
_BRACKET_DELTA[list(b"[{")] = 1
_BRACKET_DELTA[list(b"]}")] = -1
_QUOTE = np.zeros(256, dtype=np.uint8)
_QUOTE[ord('"')] = 1
_DEPTH_CHUNK = 1 << 20


def check_json_depth(text: bytes, limit: int = DEFAULT_MAX_JSON_DEPTH) -> None:
    """Reject JSON nested deeper than `limit` before any parser sees it (CVE-2025-23325).

    Linear and allocation-light: the usual request has fewer brackets than the limit and costs
    two `count` calls. Otherwise escape pairs are dropped first (so no quote is escaped), then
    everything but brackets and quotes; a bracket counts when an even number of quotes precede
    it (outside strings), and the running depth is a chunked cumulative sum. All of it is
    vectorised (numpy), so a hostile 64 MiB body costs a fraction of a second, not seconds of
    regex matches.
    """
    if text.count(b"[") + text.count(b"{") <= limit:
        return
    if b"\\" in text:
        text = _drop_escapes(text)
    structure = text.translate(None, _KEEP_STRUCTURE)
    if structure.count(b'"') & 1:  # an unterminated string: brackets after it still count
        last = structure.rfind(b'"')
        structure = structure[:last] + structure[last + 1 :]
    depth = 0
    in_string = 0  # quotes seen so far, mod 2
    for start in range(0, len(structure), _DEPTH_CHUNK):
        count = min(_DEPTH_CHUNK, len(structure) - start)
        chunk = np.frombuffer(structure, dtype=np.uint8, count=count, offset=start)
        quotes = np.cumsum(_QUOTE[chunk], dtype=np.int32)
        quotes += in_string
        outside = (quotes & 1) == 0  # a bracket is never a quote: its own count is those before
        delta = _BRACKET_DELTA[chunk] * outside
        running = np.cumsum(delta, dtype=np.int32)
        running += depth
        if int(running.max()) > limit:
            raise InvalidArgument(f"JSON nesting depth exceeds maximum allowed limit ({limit})")
        depth = int(running[-1])
        in_string = int(quotes[-1]) & 1


def _drop_escapes(text: bytes) -> bytes:
    """`text` without its escape pairs (what `re.sub(rb"\\\\.", b"", text)` leaves, as far as
    brackets and quotes go), vectorised: every backslash goes, and so does the character after
    a run of an odd number of them."""
    chars = np.frombuffer(text, dtype=np.uint8)
    backslash = chars == 0x5C
    edges = np.diff(backslash.view(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)  # the index after each run
    escaped = ends[((ends - starts) & 1) == 1]
    keep = ~backslash
    keep[escaped[escaped < chars.size]] = False
    return chars[keep].tobytes()


def _parse_json(text: Buffer) -> dict[str, Any]:
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgument("failed to parse the request JSON buffer: expected a JSON object")
    return document


# --------------------------------------------------------------------------- request


def decode_infer_request(
    body: Buffer,
    header_length: int | None,
    model_name: str,
    model_version: str,
    *,
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
    max_bytes: int | None = None,
) -> InferRequest:
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
    key: tuple[bytes, int, int | None] | None = None
    if json_end < size:  # a binary section follows: the header may have been seen before
        head = bytes(view[:json_end])
        header: Buffer = head
        key = (head, max_json_depth, max_bytes)
        plan = _PLANS.get(key)  # protocol/request_plans.py
        if plan is not None and plan.binary_size == size - json_end:
            request = plan.new_request(model_name, model_version)
            request.inputs = read_planned_inputs(plan, view, json_end, model_name)
            return request
    elif isinstance(body, (bytes, bytearray)):
        header = body
    else:
        header = bytes(view)
    check_json_depth(header, max_json_depth)
    document = _parse_json(header)

    request = InferRequest(model_name=model_name, model_version=model_version)
    request.id = _parse_id(document)
    request.parameters = _parse_request_parameters(document)
    cursor = BinaryCursor(view, json_end, header_length is not None, model_name)
    may_hold_bools = b"true" in header or b"false" in header
    request.inputs = decode_inputs(document, cursor, max_bytes, may_hold_bools)
    cursor.finish()
    request.outputs = _parse_outputs(document)
    if key is not None:
        plan = plan_of(document, request)
        if plan is not None:
            _PLANS.keep(key, plan)
    return request


def _parse_id(document: dict[str, Any]) -> str:
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("Unable to parse 'id': expected a string")
    return request_id


# Reserved request parameters Triton reads itself, with the JSON types it accepts.
def _is_sequence_id(value: Any) -> bool:
    return is_uint(value) or isinstance(value, str)


_RESERVED_PARAMETERS = {
    "sequence_id": _is_sequence_id,
    "sequence_start": is_bool,
    "sequence_end": is_bool,
    "priority": is_uint,
    "timeout": is_uint,
    "binary_data_output": is_bool,
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
                raise InvalidArgument(f"Unable to parse '{shown(key)}'")
        elif key.startswith("triton_"):
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage "
                "and should not be specified."
            )
        elif not isinstance(value, _CUSTOM_PARAMETER_TYPES):
            raise InvalidArgument(
                f"parameter '{key}' has invalid type. It should be either "
                "'int', 'bool', or 'string'."
            )
    return parameters


# --------------------------------------------------------------------------- outputs


def _parse_outputs(document: dict[str, Any]) -> list[RequestedOutput] | None:
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
            f"Unable to parse 'parameters' for output '{name}': expected a JSON object"
        )
    binary = parameters.get("binary_data")
    if binary is not None and not is_bool(binary):
        raise InvalidArgument(f"Unable to parse 'binary_data' for output '{shown(name)}'")
    classification = parameters.get("classification", 0)
    if not is_uint(classification):
        raise InvalidArgument(f"Unable to set 'classification' for output '{shown(name)}'")
    if shared_memory.in_shared_memory(parameters):
        if classification:
            raise InvalidArgument(
                f"Output can't set both 'shared_memory_region' and "
                f"'classification' (output '{name}')"
            )
        if binary:
            raise InvalidArgument(
                f"Output can't set both 'shared_memory_region' and 'binary_data' (output '{name}')"
            )
    return RequestedOutput(
        name=name, binary=binary, classification=classification, parameters=parameters
    )


# --------------------------------------------------------------------------- raw request


def raw_input_count_message(model_name: str, input_count: int) -> str:
    """Triton's text for a raw binary request to a model without exactly one input."""
    return (
        f"Raw request must only have 1 input (found 1) to be deduced but got {input_count} "
        f"inputs in '{model_name}' model configuration"
    )


def check_raw_input_count(model_name: str, input_count: int) -> None:
    """A raw binary request (header length 0) needs a model with exactly one input."""
    if input_count != 1:
        raise InvalidArgument(raw_input_count_message(model_name, input_count))


def decode_raw_request(
    body: Buffer,
    model_name: str,
    model_version: str,
    input_name: str,
    datatype: str,
    dims: list[int],
    max_batch_size: int,
) -> InferRequest:
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
            "more than one variable-sized dimension"
        )
    if wire.name == "BYTES":
        data = _raw_bytes_input(input_name, shape, variable, view)
    else:
        data = _raw_fixed_input(input_name, wire, shape, variable, view, model_name)
    tensor = Tensor(name=input_name, datatype=wire.name, shape=tuple(data.shape), data=data)
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=[tensor],
        parameters={"binary_data_output": True},
    )


def _raw_datatype(datatype: str) -> DataType:
    found = datatypes.BY_CONFIG_NAME.get(datatype) or datatypes.BY_NAME.get(datatype)
    if found is None:
        raise InvalidArgument(f"invalid datatype '{datatype}' for the raw input")
    return found


def _raw_bytes_input(
    input_name: str, shape: list[int], variable: list[int], view: memoryview
) -> np.ndarray:
    """A BYTES raw input is one element holding the whole body."""
    if variable or datatypes.element_count(shape) != 1:
        raise InvalidArgument(
            f"For BYTE datatype raw input '{input_name}', the model must have input shape [1]"
        )
    data = np.empty(1, dtype=object)
    whole = isinstance(view.obj, bytes) and view.nbytes == len(view.obj)
    data[0] = view.obj if whole else view.tobytes()
    return data.reshape(shape)


def _raw_fixed_input(
    input_name: str,
    datatype: DataType,
    shape: list[int],
    variable: list[int],
    view: memoryview,
    model_name: str,
) -> np.ndarray:
    fixed = datatypes.element_count([d for d in shape if d != -1]) * datatype.itemsize
    if variable:
        shape[variable[0]] = view.nbytes // fixed if fixed else 0
    expected = datatypes.element_count(shape) * datatype.itemsize
    if view.nbytes != expected:
        raise InvalidArgument(
            f"input byte size mismatch for input '{input_name}' for model '{model_name}'. "
            f"Expected {expected}, got {view.nbytes}"
        )
    return np.frombuffer(view, dtype=datatype.numpy).reshape(shape)


# --------------------------------------------------------------------------- repository


def decode_index_ready(payload: Any) -> bool:
    """`ready` from a repository index request's parsed JSON body (None: an empty body)."""
    if payload is None:
        return False
    if not isinstance(payload, dict):
        raise InvalidArgument("the repository index request must be a JSON object")
    ready = payload.get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidArgument("Invalid value for 'ready': expected a boolean")
    return ready


def decode_load_parameters(name: str, payload: Any) -> tuple[str | None, dict[str, bytes]]:
    """`config` (a JSON string) and `file:<path>` (base64 text, decoded) from a repository load
    request's parsed JSON body; other parameters are ignored, as in Triton."""
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, value in _repository_parameters(payload or {}).items():
        if not isinstance(value, str):
            raise InvalidArgument(
                f"load failed for model '{name}': parameter '{key}' must be a string"
            )
        if key == "config":
            config = value
        elif key.startswith("file:"):
            try:
                files[key[len("file:") :]] = base64.b64decode(value, validate=True)
            except binascii.Error:
                raise InvalidArgument(
                    f"load failed for model '{name}': file content for '{key}' is not valid base64"
                ) from None
    return config, files


def decode_unload_dependents(payload: Any) -> bool:
    """`unload_dependents` from a repository unload request's parsed JSON body."""
    dependents = _repository_parameters(payload or {}).get("unload_dependents", False)
    if not isinstance(dependents, bool):
        raise InvalidArgument("'unload_dependents' must be a boolean")
    return dependents


def _repository_parameters(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise InvalidArgument("the request body must be a JSON object")
    parameters = payload.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidArgument("'parameters' must be a JSON object")
    return parameters
