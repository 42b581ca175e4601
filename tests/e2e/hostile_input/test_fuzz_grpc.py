"""Property-based fuzzing of the gRPC service against a real server subprocess (issue #13,
item 6): valid `ModelInferRequest`s for the example models, mutated (field values, datatypes,
shapes, typed contents of the wrong kind or count, raw contents of the wrong size, parameters,
outputs, odd names and versions) and then, some of them, mutated as serialized bytes (bits
flipped, cut, spliced), sent to ModelInfer and ModelStreamInfer; and the other RPCs' requests
mutated the same way.

The property (tests/support/fuzzing.py): no INTERNAL / UNKNOWN answer (UNAVAILABLE and UNIMPLEMENTED
only for the documented cases), the server stays alive, live after every case, no unexpected
error in its log (which also catches a stream request answered with an error_message only).
ASCEND_FUZZ=nightly (`make fuzz`) runs thousands of cases per test."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.serverproc import running_server
from protocol.proto import grpc_service_pb2 as pb
from tests.support.fuzzing import (
    ALLOWED_501,
    ALLOWED_503,
    DATATYPES,
    MODELS,
    ODD_NAMES,
    ODD_VERSIONS,
    OUTPUTS,
    Watch,
    describe,
    fuzz_settings,
)

pytestmark = pytest.mark.e2e

SERVICE = "/inference.GRPCInferenceService/"
INT64 = st.one_of(
    st.integers(-3, 70),
    st.sampled_from([2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, -(2**63), 9223372036854775807]),
)
NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "INT32": np.int32, "FP32": np.float32}
CONTENT_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
FIELD_VALUES = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=12),
}
PARAM_KEYS = [
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
    "triton_enable_empty_final_response",
    "custom",
    "",
]


@pytest.fixture(scope="module")
def watch(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watch]:
    with running_server(
        [example_repository], ["--exit-timeout-secs", "10"], log_dir=tmp_path_factory.mktemp("logs")
    ) as server:
        checker = Watch(server)
        checker.channel = grpc.insecure_channel(server.grpc_url)  # type: ignore[attr-defined]
        yield checker
        checker.channel.close()  # type: ignore[attr-defined]
        checker.close()


# ----- strategies --------------------------------------------------------------------------------
def raw_bytes(datatype: str, count: int, rng: np.random.Generator) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", 2) + b"ab" for _ in range(count))
    if datatype == "FP32":
        return rng.random(count, dtype=np.float32).tobytes()
    return rng.integers(0, 100, count).astype(NUMPY[datatype]).tobytes()


def fill_contents(tensor: Any, datatype: str, count: int, rng: np.random.Generator) -> None:
    field = getattr(tensor.contents, CONTENT_FIELDS[datatype])
    if datatype == "BYTES":
        field.extend([b"ab"] * count)
    elif datatype == "FP32":
        field.extend(rng.random(count, dtype=np.float32).tolist())
    else:
        field.extend(rng.integers(0, 100, count).tolist())


@st.composite
def parameter_maps(draw: st.DrawFn) -> dict[str, dict]:
    """key -> one InferParameter choice, as keyword arguments."""
    values = st.one_of(
        st.builds(lambda v: {"bool_param": v}, st.booleans()),
        st.builds(lambda v: {"int64_param": v}, INT64),
        st.builds(lambda v: {"uint64_param": v}, st.integers(0, 2**64 - 1)),
        st.builds(lambda v: {"double_param": v}, st.floats()),
        st.builds(lambda v: {"string_param": v}, st.text(max_size=12)),
    )
    return draw(st.dictionaries(st.sampled_from(PARAM_KEYS), values, max_size=3))


def set_parameters(target: Any, chosen: dict[str, dict]) -> None:
    for key, value in chosen.items():
        target[key].CopyFrom(pb.InferParameter(**value))


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    """A valid request for an example model (raw or typed contents), then mutated fields."""
    model = draw(st.sampled_from(sorted(MODELS)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    request = pb.ModelInferRequest(model_name=model)
    raw = draw(st.booleans())
    for name, datatype, shape in MODELS[model]:
        tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
        count = int(np.prod(shape))
        if raw:
            request.raw_input_contents.append(raw_bytes(datatype, count, rng))
        else:
            fill_contents(tensor, datatype, count, rng)
    if draw(st.booleans()):
        for name in OUTPUTS[model]:
            request.outputs.add(name=name)
    for mutation in draw(st.lists(st.sampled_from(sorted(MUTATORS)), max_size=4)):
        MUTATORS[mutation](draw, request, rng)
    return request


def m_names(draw, request, rng):  # type: ignore[no-untyped-def]
    if draw(st.booleans()):
        request.model_name = draw(st.sampled_from(ODD_NAMES))
    request.model_version = draw(st.sampled_from(ODD_VERSIONS))


def _tensor(draw, request):  # type: ignore[no-untyped-def]
    if not request.inputs:
        return None
    return request.inputs[draw(st.integers(0, len(request.inputs) - 1))]


def m_datatype(draw, request, rng):  # type: ignore[no-untyped-def]
    tensor = _tensor(draw, request)
    if tensor is not None:
        tensor.datatype = draw(
            st.one_of(st.sampled_from(DATATYPES + ["TYPE_FP32", "", "fp32"]), st.text(max_size=6))
        )


def m_shape(draw, request, rng):  # type: ignore[no-untyped-def]
    tensor = _tensor(draw, request)
    if tensor is not None:
        del tensor.shape[:]
        tensor.shape.extend(
            draw(
                st.one_of(
                    st.lists(INT64, max_size=6),
                    st.just([1] * 65),
                    st.just([9223372036854775807, 0]),
                )
            )
        )


def m_contents(draw, request, rng):  # type: ignore[no-untyped-def]
    """Typed contents of a drawn kind and count (maybe beside raw contents)."""
    tensor = _tensor(draw, request)
    if tensor is not None:
        if draw(st.booleans()):
            tensor.ClearField("contents")
        field = draw(st.sampled_from(sorted(FIELD_VALUES)))
        getattr(tensor.contents, field).extend(draw(st.lists(FIELD_VALUES[field], max_size=20)))


def m_content_count(draw, request, rng):  # type: ignore[no-untyped-def]
    tensor = _tensor(draw, request)
    if tensor is not None:
        for field in FIELD_VALUES:
            values = getattr(tensor.contents, field)
            if len(values):
                if draw(st.booleans()):
                    del values[-draw(st.integers(1, len(values))) :]
                else:
                    values.extend(values[: draw(st.integers(1, len(values)))])


def m_raw(draw, request, rng):  # type: ignore[no-untyped-def]
    """raw_input_contents of the wrong size, too many or too few, or beside typed contents."""
    raw = request.raw_input_contents
    kind = draw(st.integers(0, 4))
    if kind == 0 and len(raw):
        index = draw(st.integers(0, len(raw) - 1))
        raw[index] = raw[index][: draw(st.integers(0, len(raw[index])))]
    elif kind == 1 and len(raw):
        index = draw(st.integers(0, len(raw) - 1))
        raw[index] = raw[index] + draw(st.binary(min_size=1, max_size=9))
    elif kind == 2:
        raw.append(draw(st.binary(max_size=64)))
    elif kind == 3 and len(raw):
        del raw[-1]
    else:  # BYTES framing: a length prefix longer than what follows
        raw.append(struct.pack("<I", draw(st.sampled_from([5, 2**31, 2**32 - 1]))) + b"ab")


def m_inputs(draw, request, rng):  # type: ignore[no-untyped-def]
    kind = draw(st.integers(0, 2))
    if kind == 0 and request.inputs:
        del request.inputs[draw(st.integers(0, len(request.inputs) - 1))]
    elif kind == 1 and request.inputs:
        request.inputs.add().CopyFrom(request.inputs[0])
    elif request.inputs:
        request.inputs[0].name = draw(st.sampled_from(ODD_NAMES))


def m_parameters(draw, request, rng):  # type: ignore[no-untyped-def]
    where = draw(st.integers(0, 2))
    if where == 0:
        set_parameters(request.parameters, draw(parameter_maps()))
    elif where == 1 and request.inputs:
        set_parameters(_tensor(draw, request).parameters, draw(parameter_maps()))
    else:
        output = request.outputs.add(name=draw(st.sampled_from(sum(OUTPUTS.values(), []))))
        set_parameters(output.parameters, draw(parameter_maps()))


def m_outputs(draw, request, rng):  # type: ignore[no-untyped-def]
    names = st.one_of(st.sampled_from(sum(OUTPUTS.values(), [])), st.sampled_from(ODD_NAMES))
    for name in draw(st.lists(names, max_size=3)):
        request.outputs.add(name=name)


def m_id(draw, request, rng):  # type: ignore[no-untyped-def]
    request.id = draw(st.text(max_size=40))


MUTATORS = {
    f.__name__[2:]: f
    for f in (
        m_names,
        m_datatype,
        m_shape,
        m_contents,
        m_content_count,
        m_raw,
        m_inputs,
        m_parameters,
        m_outputs,
        m_id,
    )
}


@st.composite
def wire_bytes(draw: st.DrawFn, message: Any) -> bytes:
    """A message serialized, then mostly unchanged; else bits flipped, cut, or spliced."""
    data = bytearray(message.SerializeToString())
    kind = draw(st.integers(0, 5))
    if kind == 0 and data:
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif kind == 1:
        data = data[: draw(st.integers(0, len(data)))]
    elif kind == 2:
        index = draw(st.integers(0, len(data)))
        data[index:index] = draw(st.binary(min_size=1, max_size=12))
    return bytes(data)


# ----- the properties ----------------------------------------------------------------------------
def allowed(code: grpc.StatusCode, details: str) -> bool:
    if code in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ):
        return True
    if code is grpc.StatusCode.UNAVAILABLE:
        return bool(ALLOWED_503.search(details))
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return bool(ALLOWED_501.search(details))
    return False


def call_unary(watch: Watch, method: str, payload: bytes) -> None:
    call = watch.channel.unary_unary(SERVICE + method)  # type: ignore[attr-defined]
    problem, outcome = None, "OK"
    try:
        call(payload, timeout=30)
    except grpc.RpcError as error:
        outcome = error.code().name
        if not allowed(error.code(), error.details() or ""):
            problem = f"{method} answered {outcome}: {error.details()}"
    watch.after(f"{method} {describe(payload)}", problem, outcome)


@fuzz_settings(2)
@given(request=infer_requests(), data=st.data())
def test_model_infer_mutated_never_answers_internal(
    watch: Watch, request: pb.ModelInferRequest, data: st.DataObject
) -> None:
    call_unary(watch, "ModelInfer", data.draw(wire_bytes(request)))


@fuzz_settings(1)
@given(requests=st.lists(infer_requests(), min_size=1, max_size=3), data=st.data())
def test_model_stream_infer_mutated_never_answers_internal(
    watch: Watch, requests: list[pb.ModelInferRequest], data: st.DataObject
) -> None:
    payloads = [data.draw(wire_bytes(r)) for r in requests]
    status_errors = data.draw(st.integers(0, 2)) > 0
    metadata = (("triton_grpc_error", "true"),) if status_errors else ()
    call = watch.channel.stream_stream(SERVICE + "ModelStreamInfer")  # type: ignore[attr-defined]
    problem, outcome = None, "OK"
    try:
        for answer in call(iter(payloads), timeout=30, metadata=metadata):
            # a well-formed answer, error or not
            if pb.ModelStreamInferResponse.FromString(answer).error_message:
                outcome = "error_message"
    except grpc.RpcError as error:
        outcome = error.code().name
        if not allowed(error.code(), error.details() or ""):
            problem = f"ModelStreamInfer answered {outcome}: {error.details()}"
    watch.after(
        f"ModelStreamInfer status_errors={status_errors} {describe(payloads)}", problem, outcome
    )


def _other_rpcs() -> st.SearchStrategy:
    names = st.one_of(st.sampled_from(sorted(MODELS)), st.sampled_from(ODD_NAMES))
    versions = st.sampled_from(ODD_VERSIONS)
    load_parameters = st.dictionaries(
        st.sampled_from(["config", "unload_dependents", "file:1/model.onnx", "file:../x", "x"]),
        st.one_of(
            st.builds(lambda v: pb.ModelRepositoryParameter(bool_param=v), st.booleans()),
            st.builds(
                lambda v: pb.ModelRepositoryParameter(string_param=v),
                st.one_of(
                    st.text(max_size=30),
                    st.sampled_from(['{"backend": "python"}', '{"max_batch_size": -1}', "{", "[]"]),
                ),
            ),
            st.builds(lambda v: pb.ModelRepositoryParameter(bytes_param=v), st.binary(max_size=16)),
            st.builds(lambda v: pb.ModelRepositoryParameter(int64_param=v), INT64),
        ),
        max_size=2,
    )
    return st.one_of(
        st.tuples(st.just("ServerLive"), st.just(pb.ServerLiveRequest())),
        st.tuples(st.just("ServerReady"), st.just(pb.ServerReadyRequest())),
        st.tuples(st.just("ServerMetadata"), st.just(pb.ServerMetadataRequest())),
        st.tuples(
            st.just("ModelReady"), st.builds(pb.ModelReadyRequest, name=names, version=versions)
        ),
        st.tuples(
            st.just("ModelMetadata"),
            st.builds(pb.ModelMetadataRequest, name=names, version=versions),
        ),
        st.tuples(
            st.just("ModelConfig"), st.builds(pb.ModelConfigRequest, name=names, version=versions)
        ),
        st.tuples(
            st.just("ModelStatistics"),
            st.builds(pb.ModelStatisticsRequest, name=names, version=versions),
        ),
        st.tuples(
            st.just("RepositoryIndex"),
            st.builds(
                pb.RepositoryIndexRequest,
                repository_name=st.sampled_from(["", "models", "x"]),
                ready=st.booleans(),
            ),
        ),
        st.tuples(
            st.just("RepositoryModelLoad"),
            st.builds(pb.RepositoryModelLoadRequest, model_name=names, parameters=load_parameters),
        ),
        st.tuples(
            st.just("RepositoryModelUnload"),
            st.builds(
                pb.RepositoryModelUnloadRequest, model_name=names, parameters=load_parameters
            ),
        ),
        st.tuples(
            st.just("SystemSharedMemoryStatus"),
            st.builds(pb.SystemSharedMemoryStatusRequest, name=st.text(max_size=8)),
        ),
        st.tuples(
            st.just("TraceSetting"),
            st.builds(
                pb.TraceSettingRequest,
                model_name=names,
                settings=st.dictionaries(
                    st.sampled_from(["trace_level", "trace_rate", "log_file", "trace_file", "x"]),
                    st.builds(
                        lambda v: pb.TraceSettingRequest.SettingValue(value=v),
                        st.lists(st.text(max_size=8), max_size=2),
                    ),
                    max_size=2,
                ),
            ),
        ),
        st.tuples(
            st.just("LogSettings"),
            st.builds(
                pb.LogSettingsRequest,
                settings=st.dictionaries(
                    st.sampled_from(
                        ["log_file", "log_info", "log_verbose_level", "log_format", "x"]
                    ),
                    st.one_of(
                        st.builds(
                            lambda v: pb.LogSettingsRequest.SettingValue(bool_param=v),
                            st.booleans(),
                        ),
                        st.builds(
                            lambda v: pb.LogSettingsRequest.SettingValue(uint32_param=v),
                            st.integers(0, 2**32 - 1),
                        ),
                        st.builds(
                            lambda v: pb.LogSettingsRequest.SettingValue(string_param=v),
                            st.text(max_size=8),
                        ),
                    ),
                    max_size=2,
                ),
            ),
        ),
    )


@fuzz_settings(1)
@given(rpc=_other_rpcs(), data=st.data())
def test_other_rpcs_mutated_never_answer_internal(
    watch: Watch, rpc: tuple[str, Any], data: st.DataObject
) -> None:
    method, request = rpc
    call_unary(watch, method, data.draw(wire_bytes(request)))


def test_the_fuzzers_reached_the_inference_path_and_the_refusals(watch: Watch) -> None:
    """Runs after the fuzz tests above (pytest keeps file order) on their counts."""
    watch.check_variety("OK", {"INVALID_ARGUMENT"})
