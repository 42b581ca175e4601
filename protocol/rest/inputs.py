"""One input of a REST infer request: its metadata, then its data from JSON or from the
binary section that follows the JSON, as a numpy array.

Part of the request decoding (protocol/rest/decode.py), kept apart so each module stays small.
No number from the wire is trusted before it is checked: shapes are checked for overflow and
against the size limit before anything is sized from them, binary inputs become zero-copy
`np.frombuffer` views over the body, and JSON data is converted by numpy in C where it can be.
"""

from __future__ import annotations

from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol import datatypes, shared_memory
from protocol.datatypes import DataType
from protocol.errors import InvalidArgument, TooLarge
from protocol.rest.common import HEADER_LENGTH_HEADER
from protocol.text import shown
from protocol.types import Tensor
from protocol.values import is_uint

if TYPE_CHECKING:
    from protocol.request_plans import RequestPlan

MAX_DIMS = datatypes.MAX_DIMS  # numpy's limit on ndim; more dims could never become an array
_INT64_MAX = 2**63 - 1
SHARED_MEMORY = -1  # an input's "size" when its data is in a registered region
_LIMIT_HINT = "Use --http-max-input-size to increase the limit."


class BinaryCursor:
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
            return self.view[self.offset : self.offset]
        if not self.has_header:
            raise InvalidArgument(
                f"must specify valid '{HEADER_LENGTH_HEADER}' in request header and "
                "'binary_data_size' when passing inputs in binary data format"
            )
        end = self.offset + size
        available = self.view.nbytes - self.offset
        if size > available:
            raise InvalidArgument(
                f"unexpected size for input '{name}', expecting {size - available} additional "
                f"bytes for model '{self.model_name}'"
            )
        segment = self.view[self.offset : end]
        self.offset = end
        return segment

    def finish(self) -> None:
        """Every byte after the JSON must belong to some input."""
        if self.offset != self.view.nbytes:
            raise InvalidArgument(f"unexpected additional input data for model '{self.model_name}'")


def decode_inputs(
    document: dict[str, Any], cursor: BinaryCursor, max_bytes: int | None, may_hold_bools: bool
) -> list[Tensor]:
    """The request's `inputs`, in order, each name once; `max_bytes` caps their decoded size
    together, and `may_hold_bools` says whether the JSON text holds `true`/`false` at all."""
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


def read_planned_inputs(
    plan: RequestPlan, view: memoryview, offset: int, model_name: str
) -> list[Tensor]:
    """The inputs of a request whose header was decoded before (protocol/request_plans.py):
    each one's bytes from the binary section at `offset` (which holds `plan.binary_size` bytes),
    checked and viewed as a full decode does."""
    tensors = []
    for planned in plan.inputs:
        end = offset + planned.size
        data = _tensor_from_binary(
            planned.name,
            planned.datatype,
            planned.shape,
            planned.count,
            view[offset:end],
            model_name,
        )
        offset = end
        parameters = planned.parameters
        tensors.append(
            Tensor(
                planned.name,
                planned.datatype.name,
                planned.shape,
                data,
                dict(parameters) if parameters else {},
            )
        )
    return tensors


class _SizeBudget:
    """Bytes the inputs' shapes may claim in total, checked before any input is decoded."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.used = 0

    def claim(self, name: str, shape: tuple[int, ...], datatype: DataType, count: int) -> None:
        self.used += count * max(datatype.itemsize, 1)
        if self.limit is not None and self.used > self.limit:
            raise TooLarge(
                f"input '{name}' with shape {list(shape)} and datatype {datatype.name} brings "
                f"the request's inputs to {self.used} bytes, which exceeds the maximum allowed "
                f"input size of {self.limit} bytes. {_LIMIT_HINT}"
            )


def _decode_input(
    entry: Any, index: int, cursor: BinaryCursor, budget: _SizeBudget, may_hold_bools: bool
) -> Tensor:
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
    if binary_size == SHARED_MEMORY:  # read where the regions are (server/core/client_shm.py)
        return Tensor(
            name=name,
            datatype=datatype.name,
            shape=shape,
            data=shared_memory.placeholder(datatype.numpy),
            parameters=parameters,
        )
    budget.claim(name, shape, datatype, count)
    if binary_size is None:
        data = tensor_from_json(name, datatype, shape, count, entry["data"], may_hold_bools)
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
            f"Unable to parse 'parameters' for input '{name}': expected a JSON object"
        )
    return parameters


def _input_source(name: str, entry: dict[str, Any], parameters: dict[str, Any]) -> int | None:
    """The input's binary_data_size, None when its data is JSON, SHARED_MEMORY when it is in a
    region; exactly one source allowed."""
    has_data = "data" in entry
    has_binary = "binary_data_size" in parameters
    has_shm = "shared_memory_region" in parameters
    if has_data + has_binary + has_shm != 1:
        found = [
            label
            for label, present in (
                ("'data'", has_data),
                ("'binary_data_size'", has_binary),
                ("'shared_memory_region'", has_shm),
            )
            if present
        ]
        but = " set " + " ".join(found) if found else " no field is set"
        raise InvalidArgument(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            f"'parameters', 'shared_memory_region' in 'parameters'. But{but} (input '{name}')"
        )
    if has_shm:
        return SHARED_MEMORY
    if not has_binary:
        return None
    size = parameters["binary_data_size"]
    if not is_uint(size):
        raise InvalidArgument(
            f"Unable to parse 'binary_data_size' for input '{name}': "
            "expected a non-negative integer"
        )
    return size


def _parse_datatype(name: str, value: Any) -> DataType:
    if not isinstance(value, str):
        raise InvalidArgument(
            f"Unable to parse 'datatype' for input '{shown(name)}': expected a string"
        )
    datatype = datatypes.BY_NAME.get(value)
    if datatype is None:
        raise InvalidArgument(f"invalid datatype '{value[:64]}' for input '{shown(name)}'")
    return datatype


def _parse_shape(name: str, value: Any) -> tuple[int, ...]:
    """A list of unsigned integers (bools and floats refused, as JSON's uint access does)."""
    if not isinstance(value, list):
        raise InvalidArgument(
            f"Unable to parse 'shape' for input '{shown(name)}': expected a JSON array"
        )
    if len(value) > MAX_DIMS:
        raise InvalidArgument(
            f"Unable to parse 'shape' for input '{name}': {len(value)} dimensions exceed the "
            f"maximum of {MAX_DIMS}"
        )
    for position, dim in enumerate(value):
        if type(dim) is not int or dim < 0 or dim > _INT64_MAX:
            raise InvalidArgument(
                f"Unable to parse 'shape' for input '{name}': dimension {position} must be a "
                f"non-negative integer, got {str(dim)[:32]}"
            )
    return tuple(value)


def _checked_element_count(name: str, shape: tuple[int, ...], datatype: DataType) -> int:
    """prod(shape), refusing shapes whose byte count overflows int64, also where a zero
    dimension hides it (`[9223372036854775807, 0]`: numpy cannot hold that array)."""
    return datatypes.checked_element_count(name, shape, datatype)


# --------------------------------------------------------------------------- input data


def _tensor_from_binary(
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    count: int,
    segment: memoryview,
    model_name: str,
) -> np.ndarray:
    """A zero-copy view for fixed-size types; BYTES elements parsed from their length prefixes."""
    if datatype.itemsize:
        expected = count * datatype.itemsize
        if segment.nbytes != expected:
            raise InvalidArgument(
                f"input byte size mismatch for input '{name}' for model '{model_name}'. "
                f"Expected {expected}, got {segment.nbytes}"
            )
    elif count * 4 > segment.nbytes:
        # Checked before deserialising, which allocates one slot per claimed element.
        raise InvalidArgument(
            f"incomplete string length indicator for inference input '{name}': {count} "
            f"elements need at least {count * 4} bytes but only {segment.nbytes} bytes available"
        )
    return datatypes.tensor_from_raw(datatype, shape, segment, name)


def tensor_from_json(
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    count: int,
    data: Any,
    may_hold_bools: bool,
) -> np.ndarray:
    """One input's JSON `data` as an array of `shape` (also for generate's JSON inputs)."""
    if not datatype.json_allowed:
        raise InvalidArgument(
            f"receiving {datatype.name} data via JSON is not supported. Please use the binary "
            f"data format for input {name}"
        )
    if not isinstance(data, list):
        raise InvalidArgument(
            f"Unable to parse 'data' for input '{shown(name)}': expected a JSON array"
        )
    if datatype.name == "BYTES":
        flat = _bytes_from_json(name, data)
    else:
        flat = _numbers_from_json(name, datatype, data, may_hold_bools)
    if flat.size != count:
        raise InvalidArgument(
            "Unable to parse 'data': Shape does not match true shape of 'data' field: "
            f"unexpected number of elements for input '{name}': shape {list(shape)} needs "
            f"{count}, 'data' holds {flat.size}"
        )
    return flat.reshape(shape)


def flatten(data: list) -> list:
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
        encoded = _encode_strings(name, flatten(data))
    out = np.empty(len(encoded), dtype=object)
    out[:] = encoded
    return out


def _encode_strings(name: str, leaves: list) -> list[bytes]:
    try:
        return [item.encode("utf-8") for item in leaves]
    except AttributeError:
        raise InvalidArgument(
            f"Unable to parse 'data' for input '{name}': BYTES expects JSON strings"
        ) from None


_KIND_NAMES = {
    "b": "JSON booleans",
    "i": "JSON integers",
    "u": "JSON integers",
    "f": "JSON numbers",
}
# Element kinds numpy may infer from JSON values that each target kind accepts.
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


def _numbers_from_json(
    name: str, datatype: DataType, data: list, may_hold_bools: bool
) -> np.ndarray:
    """Numeric JSON values -> a flat array of the datatype, built by numpy in C.

    numpy infers the element kind of the whole (possibly nested) list in one pass; the kind
    tells ints from floats from bools without a Python loop. Bools mixed into numbers are the
    one thing the inferred kind hides, so those are looked for only when the JSON text holds
    `true` or `false` at all.
    """
    target = datatype.numpy
    assert target is not None  # a numeric datatype has its numpy type
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
            return np.array(flatten(data))
        except (ValueError, OverflowError, TypeError):
            return np.array(flatten(data), dtype=object)


def _leaf_types(data: list, ndim: int) -> set[type]:
    """The Python types of the leaves; C-speed iteration when the nesting is rectangular."""
    leaves: Any = data
    for _ in range(ndim - 1):
        leaves = chain.from_iterable(leaves)
    types = set(map(type, leaves))
    if list in types:  # ragged nesting: numpy saw the flattened leaves
        types = set(map(type, flatten(data)))
    return types


def _exact_ints(name: str, datatype: DataType, data: list, ndim: int) -> np.ndarray:
    """Integers numpy could not infer as one integer dtype, converted exactly (or refused)."""
    if _leaf_types(data, ndim) != {int}:
        raise _type_error(name, datatype)
    leaves = data if ndim <= 1 and not any(type(x) is list for x in data) else flatten(data)
    try:
        return np.array(leaves, dtype=datatype.numpy)
    except OverflowError:
        raise InvalidArgument(
            f"Unable to parse 'data' for input '{name}': a value is out of range for "
            f"{datatype.name}"
        ) from None


def _type_error(name: str, datatype: DataType) -> InvalidArgument:
    assert datatype.numpy is not None  # only numeric datatypes get here
    return InvalidArgument(
        f"Unable to parse 'data' for input '{name}': {datatype.name} expects "
        f"{_KIND_NAMES[datatype.numpy.kind]}"
    )


def _check_int_range(name: str, datatype: DataType, array: np.ndarray) -> None:
    info = np.iinfo(datatype.numpy)
    low, high = int(array.min()), int(array.max())
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        raise InvalidArgument(
            f"Unable to parse 'data' for input '{name}': value {bad} is out of range for "
            f"{datatype.name}"
        )
