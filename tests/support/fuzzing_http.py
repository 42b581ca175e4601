"""The requests tests/e2e/hostile_input/test_fuzz_http.py sends, as Hypothesis strategies:
infer requests for the example models, valid and then mutated (datatypes, shapes, data, binary
header lengths, parameters, outputs, compression headers, odd model names and versions); any
route with any method; and load / unload requests whose config overrides are the models' own
configs mutated. The property they are checked against is in tests/support/fuzzing.py."""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from typing import Any
from urllib.parse import quote

import numpy as np
from hypothesis import strategies as st

from tests.support.fuzzing import DATATYPES, MODELS, ODD_NAMES, ODD_VERSIONS, OUTPUTS

NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": np.uint16,
}
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
HEADER_LENGTH = "Inference-Header-Content-Length"


# ----- strategies --------------------------------------------------------------------------------
big_ints = st.one_of(
    st.integers(-3, 70),
    st.sampled_from(
        [
            2**31 - 1,
            2**31,
            2**32,
            2**53 + 1,
            2**63 - 1,
            2**63,
            2**64,
            -(2**63),
            -(2**63) - 1,
            10**30,
        ]
    ),
)
json_scalars = st.one_of(
    st.none(), st.booleans(), big_ints, st.floats(width=64), st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
shapes = st.one_of(
    st.lists(big_ints, max_size=6),
    st.just([1] * 65),
    st.just([9223372036854775807, 0]),
    st.lists(json_scalars, max_size=3),
    json_values,
)
param_keys = st.sampled_from(
    [
        "binary_data_size",
        "binary_data",
        "binary_data_output",
        "classification",
        "timeout",
        "priority",
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "shared_memory_region",
        "shared_memory_byte_size",
        "shared_memory_offset",
        "custom",
    ]
)
parameters = st.one_of(st.dictionaries(param_keys, json_values, max_size=4), json_values)


def valid_data(datatype: str, count: int, rng: np.random.Generator) -> list:
    if datatype == "BYTES":
        return [f"s{i}" * int(rng.integers(0, 4)) for i in range(count)]
    if datatype == "BOOL":
        return [bool(v) for v in rng.integers(0, 2, count)]
    if datatype.startswith("FP"):
        return [float(v) for v in rng.random(count, dtype=np.float32)]
    return [int(v) for v in rng.integers(0, 100, count)]


def tensor_bytes(datatype: str, data: Any, rng: np.random.Generator, count: int) -> bytes:
    """The binary-extension bytes of an input (random bytes where the data cannot be encoded)."""
    try:
        if datatype == "BYTES":
            items = [str(v).encode() for v in data]
            return b"".join(struct.pack("<I", len(i)) + i for i in items)
        return np.asarray(data, dtype=NUMPY[datatype]).tobytes()
    except Exception:
        return rng.bytes(max(0, min(count, 4096)) * 4)


@st.composite
def infer_requests(draw: st.DrawFn) -> dict:
    """(path, headers, body) of one infer request: a valid one for an example model, mutated."""
    model = draw(st.sampled_from(sorted(MODELS)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs: list[Any] = []
    for name, datatype, shape in MODELS[model]:
        inputs.append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(shape),
                "data": valid_data(datatype, int(np.prod(shape)), rng),
            }
        )
    document: Any = {"inputs": inputs}
    if draw(st.booleans()):
        document["outputs"] = [{"name": n} for n in OUTPUTS[model]]
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), max_size=4)):
        document = MUTATORS[mutation](draw, document, rng)
    encoding = draw(st.sampled_from(["json", "json", "binary", "binary", "raw", "noise"]))
    headers: dict[str, str] = {}
    if encoding == "json":
        body = json.dumps(document).encode()
    elif encoding == "binary":
        body = binary_body(draw, document, rng, headers)
    elif encoding == "raw":
        first = inputs[0] if inputs and isinstance(inputs[0], dict) else {}
        body = tensor_bytes(str(first.get("datatype")), first.get("data", []), rng, 64)
        headers[HEADER_LENGTH] = "0"
        if draw(st.booleans()):
            headers["Content-Type"] = "application/octet-stream"
    else:
        body = draw(st.binary(max_size=256))
    body = mutate_bytes(draw, body)
    body = compress(draw, body, headers)
    if draw(st.booleans()):
        headers["Accept-Encoding"] = draw(
            st.sampled_from(
                [
                    "gzip",
                    "deflate",
                    "identity",
                    "br",
                    "gzip;q=0",
                    "*",
                    "gzip;q=abc, deflate;q=0.5",
                    "",
                    "identity;q=0, *;q=0",
                ]
            )
        )
    if draw(st.integers(0, 4)) == 0:
        headers["Content-Type"] = draw(
            st.sampled_from(
                [
                    "application/json",
                    "application/octet-stream",
                    "text/plain",
                    "multipart/form-data",
                    "application/json; charset=latin-1",
                ]
            )
        )
    if draw(st.integers(0, 5)) == 0:
        model = draw(st.sampled_from(ODD_NAMES))
    path = f"/v2/models/{quote(model, safe='')}"
    if draw(st.integers(0, 3)) == 0:
        path += f"/versions/{quote(draw(st.sampled_from(ODD_VERSIONS)), safe='')}"
    return {"method": "POST", "path": path + "/infer", "headers": headers, "body": body}


def binary_body(
    draw: st.DrawFn, document: Any, rng: np.random.Generator, headers: dict[str, str]
) -> bytes:
    """Some inputs as binary data after the JSON header, with a (maybe wrong) header length."""
    blobs = b""
    if isinstance(document, dict) and isinstance(document.get("inputs"), list):
        for entry in document["inputs"]:
            if not isinstance(entry, dict) or not draw(st.booleans()):
                continue
            data = entry.pop("data", [])
            count = len(data) if isinstance(data, list) else 1
            blob = tensor_bytes(str(entry.get("datatype")), data, rng, count)
            size: Any = len(blob)
            if draw(st.integers(0, 3)) == 0:
                size = draw(st.one_of(big_ints, json_scalars))
            params = entry.get("parameters")
            if not isinstance(params, dict):
                params = entry["parameters"] = {}
            params["binary_data_size"] = size
            blobs += blob
    if isinstance(document, dict) and draw(st.booleans()):
        document.setdefault("parameters", {})
        if isinstance(document["parameters"], dict):
            document["parameters"]["binary_data_output"] = draw(
                st.one_of(st.booleans(), json_scalars)
            )
    header = json.dumps(document).encode()
    length: Any = len(header)
    choice = draw(st.integers(0, 5))
    if choice == 1:
        length += draw(st.integers(-8, 8))
    elif choice == 2:
        length = draw(
            st.sampled_from(
                [
                    "-1",
                    "abc",
                    "",
                    " 5",
                    "0x10",
                    "1e3",
                    "99999999999999999999",
                    str(len(header) + len(blobs) + 1),
                    "+1",
                    "١٢",
                ]
            )
        )
    headers[HEADER_LENGTH] = str(length)
    return header + blobs


def mutate_bytes(draw: st.DrawFn, body: bytes) -> bytes:
    """Mostly unchanged; else a few bytes flipped, a cut, or a splice."""
    kind = draw(st.integers(0, 12))
    if not body or kind > 3:
        return body
    data = bytearray(body)
    if kind == 0:
        for _ in range(draw(st.integers(1, 4))):
            index = draw(st.integers(0, len(data) - 1))
            data[index] ^= 1 << draw(st.integers(0, 7))
    elif kind == 1:
        data = data[: draw(st.integers(0, len(data)))]
    elif kind == 2:
        index = draw(st.integers(0, len(data)))
        data[index:index] = draw(st.binary(min_size=1, max_size=16))
    else:
        index = draw(st.integers(0, len(data)))
        data[index:index] = data[: draw(st.integers(0, min(len(data), 64)))]
    return bytes(data)


def compress(draw: st.DrawFn, body: bytes, headers: dict[str, str]) -> bytes:
    kind = draw(
        st.sampled_from(
            [
                "none",
                "none",
                "gzip",
                "deflate",
                "raw-deflate",
                "gzip-lie",
                "gzip-cut",
                "unknown",
                "stacked",
            ]
        )
    )
    if kind == "gzip":
        headers["Content-Encoding"] = draw(st.sampled_from(["gzip", "GZIP", "x-gzip"]))
        return gzip.compress(body)
    if kind == "deflate":
        headers["Content-Encoding"] = "deflate"
        return zlib.compress(body)
    if kind == "raw-deflate":
        headers["Content-Encoding"] = "deflate"
        compressor = zlib.compressobj(wbits=-15)
        return compressor.compress(body) + compressor.flush()
    if kind == "gzip-lie":  # says gzip, sends something else
        headers["Content-Encoding"] = draw(st.sampled_from(["gzip", "deflate"]))
        return body
    if kind == "gzip-cut":
        headers["Content-Encoding"] = "gzip"
        packed = gzip.compress(body)
        return packed[: draw(st.integers(0, len(packed)))]
    if kind == "unknown":
        headers["Content-Encoding"] = draw(
            st.sampled_from(["br", "zstd", "compress", "gzip;q=1", ",", "identity", "gzip,,br"])
        )
        return body
    if kind == "stacked":
        headers["Content-Encoding"] = "gzip, deflate"
        return zlib.compress(gzip.compress(body))
    return body


# ----- mutations of the request document ----------------------------------------------------------
def _pick_input(draw: st.DrawFn, document: Any) -> dict | None:
    if (
        isinstance(document, dict)
        and isinstance(document.get("inputs"), list)
        and document["inputs"]
        and isinstance(document["inputs"][0], dict)
    ):
        inputs = [i for i in document["inputs"] if isinstance(i, dict)]
        return draw(st.sampled_from(inputs)) if inputs else None
    return None


def m_datatype(draw, document, rng):  # type: ignore[no-untyped-def]
    entry = _pick_input(draw, document)
    if entry is not None:
        entry["datatype"] = draw(
            st.one_of(st.sampled_from(DATATYPES + ["TYPE_FP32", "fp32", ""]), json_scalars)
        )
    return document


def m_shape(draw, document, rng):  # type: ignore[no-untyped-def]
    entry = _pick_input(draw, document)
    if entry is not None:
        entry["shape"] = draw(shapes)
    return document


def m_data_length(draw, document, rng):  # type: ignore[no-untyped-def]
    entry = _pick_input(draw, document)
    if entry is not None and isinstance(entry.get("data"), list):
        data = entry["data"]
        entry["data"] = draw(
            st.sampled_from([data[:-1], data + data[:1], [], data[: len(data) // 2], data * 2])
        )
    return document


def m_data_values(draw, document, rng):  # type: ignore[no-untyped-def]
    entry = _pick_input(draw, document)
    if entry is not None:
        data = entry.get("data")
        if isinstance(data, list) and data and draw(st.booleans()):
            index = draw(st.integers(0, len(data) - 1))
            data[index] = draw(json_values)
        elif isinstance(data, list) and draw(st.booleans()):  # nested as the shape says
            shape = entry.get("shape")
            try:
                entry["data"] = np.asarray(data, dtype=object).reshape(shape).tolist()
            except Exception:
                pass
        else:
            entry["data"] = draw(json_values)
    return document


def m_drop_field(draw, document, rng):  # type: ignore[no-untyped-def]
    entry = _pick_input(draw, document)
    if entry is not None and entry:
        entry.pop(draw(st.sampled_from(sorted(entry))), None)
    elif isinstance(document, dict) and document:
        document.pop(draw(st.sampled_from(sorted(document))), None)
    return document


def m_extra_field(draw, document, rng):  # type: ignore[no-untyped-def]
    target = _pick_input(draw, document) if draw(st.booleans()) else document
    if isinstance(target, dict):
        key = draw(
            st.sampled_from(
                [
                    "name",
                    "shape",
                    "datatype",
                    "data",
                    "parameters",
                    "id",
                    "inputs",
                    "outputs",
                    "extra",
                    "",
                ]
            )
        )
        target[key] = draw(json_values)
    return document


def m_inputs(draw, document, rng):  # type: ignore[no-untyped-def]
    if isinstance(document, dict) and isinstance(document.get("inputs"), list):
        inputs = document["inputs"]
        kind = draw(st.integers(0, 3))
        if kind == 0 and inputs:
            inputs.pop(draw(st.integers(0, len(inputs) - 1)))
        elif kind == 1 and inputs:
            inputs.append(json.loads(json.dumps(inputs[0])))
        elif kind == 2 and inputs and isinstance(inputs[0], dict):
            inputs[0]["name"] = draw(st.one_of(st.sampled_from(ODD_NAMES), json_scalars))
        else:
            document["inputs"] = draw(json_values)
    return document


def m_parameters(draw, document, rng):  # type: ignore[no-untyped-def]
    target = _pick_input(draw, document) if draw(st.booleans()) else document
    if isinstance(target, dict):
        target["parameters"] = draw(parameters)
    return document


def m_outputs(draw, document, rng):  # type: ignore[no-untyped-def]
    if isinstance(document, dict):
        names = st.one_of(
            st.sampled_from(sum(OUTPUTS.values(), [])), st.sampled_from(ODD_NAMES), json_scalars
        )
        output = st.fixed_dictionaries(
            {"name": names},
            optional={
                "parameters": st.one_of(
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "binary_data": st.one_of(st.booleans(), json_scalars),
                            "classification": st.one_of(big_ints, json_scalars),
                        },
                    ),
                    json_values,
                )
            },
        )
        document["outputs"] = draw(st.one_of(st.lists(output, max_size=3), json_values))
    return document


def m_document(draw, document, rng):  # type: ignore[no-untyped-def]
    return draw(json_values)


MUTATORS = {
    f.__name__[2:]: f
    for f in (
        m_datatype,
        m_shape,
        m_data_length,
        m_data_values,
        m_drop_field,
        m_extra_field,
        m_inputs,
        m_parameters,
        m_outputs,
        m_document,
    )
}
MUTATIONS = sorted(MUTATORS)


@st.composite
def other_requests(draw: st.DrawFn) -> dict:
    """Any route, any method: health, metadata, ready, config, stats, repository."""
    model = draw(st.one_of(st.sampled_from(sorted(MODELS)), st.sampled_from(ODD_NAMES)))
    name = quote(model, safe="")
    version = quote(draw(st.sampled_from(ODD_VERSIONS)), safe="")
    prefix = f"/v2/models/{name}" + (f"/versions/{version}" if draw(st.booleans()) else "")
    path = draw(
        st.sampled_from(
            [
                "/v2/health/live",
                "/v2/health/ready",
                "/v2",
                "/v2/",
                "/v2/models/stats",
                "/v2/repository/index",
                f"/v2/repository/models/{name}/load",
                f"/v2/repository/models/{name}/unload",
                f"/v2/repository/{name}/index",
                f"/v2/repository/{name}/models/{name}/load",
                f"/v2/repository/{name}/models/{name}/unload",
                prefix,
                prefix + "/ready",
                prefix + "/config",
                prefix + "/stats",
                prefix + "/infer",
                "/v2/models",
                "/",
                "/metrics",
                "/v2/trace/setting",
                "/v2/logging",
                "/v2//health/live",
                "/v2/models/simple/versions/1/infer/extra",
                "/v2/systemsharedmemory/status",
            ]
        )
    )
    if draw(st.integers(0, 5)) == 0:
        path += draw(st.sampled_from(["?", "?a=1", "?ready=true&x", "#frag", "%", "%zz"]))
    method = draw(st.sampled_from(METHODS))
    body_kind = draw(st.sampled_from(["none", "json", "repository", "noise"]))
    body = b""
    if body_kind == "json":
        body = json.dumps(draw(json_values)).encode()
    elif body_kind == "repository":
        load = st.fixed_dictionaries(
            {},
            optional={
                "ready": st.one_of(st.booleans(), json_scalars),
                "parameters": st.one_of(
                    st.dictionaries(
                        st.sampled_from(
                            [
                                "config",
                                "unload_dependents",
                                "file:1/model.onnx",
                                "file:../x",
                                "file:",
                                "custom",
                            ]
                        ),
                        json_values,
                        max_size=3,
                    ),
                    json_values,
                ),
            },
        )
        body = json.dumps(draw(load)).encode()
    elif body_kind == "noise":
        body = draw(st.binary(max_size=128))
    headers: dict[str, str] = {}
    body = compress(draw, mutate_bytes(draw, body), headers)
    return {"method": method, "path": path, "headers": headers, "body": body}


# ----- the load API in explicit mode: config overrides mutated -----------------------------------
RELOADABLE = ["simple", "identity_bytes", "dense_compute_nobatch"]  # ONNX: cheap to reload
CONFIG_KEYS = [
    "name",
    "platform",
    "backend",
    "max_batch_size",
    "input",
    "output",
    "instance_group",
    "dynamic_batching",
    "parameters",
    "default_model_filename",
    "version_policy",
    "sequence_batching",
    "ensemble_scheduling",
    "optimization",
    "model_warmup",
    "batch_input",
    "response_cache",
    "junk",
]


def mutate_config(draw: st.DrawFn, config: dict) -> Any:
    config = json.loads(json.dumps(config))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.integers(0, 4))
        if kind == 0:
            config[draw(st.sampled_from(CONFIG_KEYS))] = draw(json_values)
        elif kind == 1 and config:
            config.pop(draw(st.sampled_from(sorted(config))), None)
        elif kind == 2 and isinstance(config.get("input"), list) and config["input"]:
            tensor = config["input"][0]
            if isinstance(tensor, dict):
                tensor[
                    draw(
                        st.sampled_from(
                            [
                                "dims",
                                "data_type",
                                "name",
                                "format",
                                "reshape",
                                "optional",
                                "is_shape_tensor",
                            ]
                        )
                    )
                ] = draw(
                    st.one_of(
                        st.lists(big_ints, max_size=4),
                        st.sampled_from(
                            ["TYPE_FP32", "TYPE_STRING", "TYPE_BF16", "TYPE_INVALID", "FP32"]
                        ),
                        json_values,
                    )
                )
        elif kind == 3:  # instances: a few, of any kind
            config["instance_group"] = [
                {
                    "count": draw(st.integers(-1, 3)),
                    "kind": draw(
                        st.sampled_from(
                            ["KIND_CPU", "KIND_GPU", "KIND_MODEL", "KIND_AUTO", "KIND_X"]
                        )
                    ),
                }
            ]
        else:
            config["max_batch_size"] = draw(big_ints)
    return config


@st.composite
def load_requests(draw: st.DrawFn, configs: dict[str, dict]) -> dict:
    name = draw(st.sampled_from(RELOADABLE))
    action = draw(st.sampled_from(["load", "load", "load", "unload"]))
    path_name = name if draw(st.integers(0, 5)) else draw(st.sampled_from(ODD_NAMES))
    parameters: dict[str, Any] = {}
    if action == "load" and draw(st.integers(0, 4)):
        config = mutate_config(draw, configs[name])
        parameters["config"] = (
            json.dumps(config)
            if draw(st.integers(0, 5))
            else draw(st.one_of(st.text(max_size=20), json_values))
        )
    if action == "unload" and draw(st.booleans()):
        parameters["unload_dependents"] = draw(st.one_of(st.booleans(), json_scalars))
    body = json.dumps(
        {"parameters": parameters} if draw(st.integers(0, 5)) else draw(json_values)
    ).encode()
    headers: dict[str, str] = {}
    body = compress(draw, mutate_bytes(draw, body), headers)
    return {
        "method": "POST",
        "path": f"/v2/repository/models/{quote(path_name, safe='')}/{action}",
        "headers": headers,
        "body": body,
    }
