"""Our .proto files and generated modules against tritonclient's, and against themselves.

Both sides register the same proto file names (``model_config.proto``, ``grpc_service.proto``) in
protobuf's default descriptor pool, so each side is loaded in its own subprocess, which prints a
JSON description of its descriptors built by the same helper (``_describe_files``).
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from google.protobuf import text_format

ROOT = Path(__file__).resolve().parents[2]

OURS = ("protocol.proto.model_config_pb2", "protocol.proto.grpc_service_pb2")
TRITON = ("tritonclient.grpc.model_config_pb2", "tritonclient.grpc.service_pb2")


def _describe_files(module_names):
    """Describe the file descriptors of the given pb2 modules as plain JSON-able data.

    Runs in a subprocess (its source is sent with ``inspect.getsource``), so it must stay
    self-contained.
    """
    import importlib

    from google.protobuf.descriptor import FieldDescriptor

    type_names = {
        getattr(FieldDescriptor, attr): attr[len("TYPE_") :].lower()
        for attr in dir(FieldDescriptor)
        if attr.startswith("TYPE_")
    }

    def label(field):
        if hasattr(field, "is_repeated"):
            if field.is_repeated:
                return "repeated"
            return "required" if field.is_required else "optional"
        return {1: "optional", 2: "required", 3: "repeated"}[field.label]

    def describe_enum(enum):
        return {value.name: value.number for value in enum.values}

    def describe_message(message, messages, enums):
        fields = {}
        for field in message.fields:
            target = field.message_type or field.enum_type
            fields[field.name] = {
                "number": field.number,
                "type": type_names[field.type],
                "label": label(field),
                "type_name": target.full_name if target is not None else None,
                "oneof": field.containing_oneof.name if field.containing_oneof else None,
                "is_map": bool(
                    field.message_type is not None
                    and field.message_type.GetOptions().map_entry
                    and label(field) == "repeated"
                ),
                "has_presence": bool(getattr(field, "has_presence", False)),
                "json_name": field.json_name,
            }
        messages[message.full_name] = {
            "fields": fields,
            "oneofs": {
                oneof.name: [field.name for field in oneof.fields] for oneof in message.oneofs
            },
            "map_entry": bool(message.GetOptions().map_entry),
            "nested_types": sorted(nested.full_name for nested in message.nested_types),
            "enum_types": sorted(enum.full_name for enum in message.enum_types),
        }
        for enum in message.enum_types:
            enums[enum.full_name] = describe_enum(enum)
        for nested in message.nested_types:
            describe_message(nested, messages, enums)

    files = {}
    for module_name in module_names:
        file = importlib.import_module(module_name).DESCRIPTOR
        messages, enums, services = {}, {}, {}
        for message in file.message_types_by_name.values():
            describe_message(message, messages, enums)
        for enum in file.enum_types_by_name.values():
            enums[enum.full_name] = describe_enum(enum)
        for service in file.services_by_name.values():
            services[service.full_name] = {
                method.name: {
                    "input": method.input_type.full_name,
                    "output": method.output_type.full_name,
                    "client_streaming": bool(method.client_streaming),
                    "server_streaming": bool(method.server_streaming),
                }
                for method in service.methods
            }
        files[file.name] = {
            "package": file.package,
            "dependencies": sorted(dep.name for dep in file.dependencies),
            "messages": messages,
            "enums": enums,
            "services": services,
        }
    return files


def _run_in_subprocess(code: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"subprocess failed:\n{code}\n--- stderr ---\n{result.stderr}"
    return result.stdout


def _describe_in_subprocess(module_names: tuple[str, ...]) -> dict:
    code = (
        textwrap.dedent(inspect.getsource(_describe_files))
        + "\nimport json\n"
        + f"print(json.dumps(_describe_files({list(module_names)!r}), sort_keys=True))\n"
    )
    return json.loads(_run_in_subprocess(code))


def _compact(value) -> str:
    return json.dumps(value, sort_keys=True)


def _differences(expected, actual, path=()) -> list[str]:
    """Paths where ``actual`` (ours) departs from ``expected`` (Triton's), by path."""
    where = " / ".join(path)
    if isinstance(expected, dict) and isinstance(actual, dict):
        lines = []
        for key in sorted(expected.keys() | actual.keys()):
            sub = " / ".join(path + (key,))
            if key not in actual:
                lines.append(f"missing in ours: {sub} = {_compact(expected[key])}")
            elif key not in expected:
                lines.append(f"extra in ours:   {sub} = {_compact(actual[key])}")
            else:
                lines.extend(_differences(expected[key], actual[key], path + (key,)))
        return lines
    if expected != actual:
        return [f"differs:         {where}: triton {expected!r}, ours {actual!r}"]
    return []


def test_descriptors_match_tritonclient():
    triton = _describe_in_subprocess(TRITON)
    ours = _describe_in_subprocess(OURS)

    assert set(triton) == {"model_config.proto", "grpc_service.proto"}
    assert ours["grpc_service.proto"]["dependencies"] == ["model_config.proto"]
    assert "inference.GRPCInferenceService" in ours["grpc_service.proto"]["services"]
    diffs = _differences(triton, ours)
    assert not diffs, f"{len(diffs)} differences from tritonclient:\n" + "\n".join(diffs[:200])


def test_serialized_descriptors_identical_to_tritonclient():
    # Stricter than the structural walk: declaration order and options too. Identical files let
    # protobuf's default pool accept both modules in one process (it dedups identical files).
    code = textwrap.dedent(
        """
        import hashlib, importlib, json, sys
        out = {}
        for name in sys.argv[1:]:
            d = importlib.import_module(name).DESCRIPTOR
            out[d.name] = hashlib.sha256(d.serialized_pb).hexdigest()
        print(json.dumps(out))
        """
    )
    digests = {}
    for side, modules in (("triton", TRITON), ("ours", OURS)):
        digests[side] = json.loads(
            _run_in_subprocess(code.replace("sys.argv[1:]", repr(list(modules))))
        )
    assert digests["ours"] == digests["triton"], (
        "serialized descriptors differ from tritonclient's (see "
        "test_descriptors_match_tritonclient for a field-level diff; an order-only difference "
        f"means declarations were reordered): {digests}"
    )


def test_generated_modules_are_fresh(tmp_path):
    from protocol.proto.generate import GENERATED_FILES, PROTO_DIR, generate

    generate(tmp_path)
    stale = []
    for name in GENERATED_FILES:
        committed = PROTO_DIR / name
        fresh = tmp_path / name
        if not committed.is_file():
            stale.append(f"{name}: missing from protocol/")
            continue
        if committed.read_bytes() != fresh.read_bytes():
            diff = difflib.unified_diff(
                committed.read_text(encoding="utf-8").splitlines(),
                fresh.read_text(encoding="utf-8").splitlines(),
                f"protocol/{name} (committed)",
                f"{name} (fresh)",
                lineterm="",
                n=1,
            )
            shown = [line if len(line) <= 160 else line[:157] + "..." for line in diff]
            stale.append(f"{name}:\n" + "\n".join(shown[:40]))
    assert not stale, "generated modules are stale; run `make proto`:\n" + "\n\n".join(stale)


def test_generate_is_idempotent(tmp_path):
    from protocol.proto.generate import generate

    first = {path.name: path.read_bytes() for path in generate(tmp_path)}
    mtimes = {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()}
    second = {path.name: path.read_bytes() for path in generate(tmp_path)}
    assert first == second
    assert mtimes == {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()}


def test_generated_modules_use_package_imports():
    from protocol.proto.generate import GENERATED_FILES, PROTO_DIR

    for name in GENERATED_FILES:
        source = (PROTO_DIR / name).read_text(encoding="utf-8")
        for line in source.splitlines():
            assert not line.startswith(("import model_config_pb2", "import grpc_service_pb2")), (
                f"{name}: sibling import left in place: {line}"
            )
    grpc_module = (PROTO_DIR / "grpc_service_pb2_grpc.py").read_text(encoding="utf-8")
    assert "from protocol.proto import grpc_service_pb2 as grpc__service__pb2" in grpc_module


def test_grpc_module_imports_and_version_guard_within_pin():
    import grpc

    from protocol.proto import grpc_service_pb2_grpc
    from protocol.proto.generate import GRPCIO_MIN

    generated_for = tuple(int(p) for p in grpc_service_pb2_grpc.GRPC_GENERATED_VERSION.split("."))
    assert generated_for <= GRPCIO_MIN, (
        f"generated code demands grpcio>={grpc_service_pb2_grpc.GRPC_GENERATED_VERSION}, "
        f"above the pinned floor {GRPCIO_MIN}"
    )
    assert grpc_service_pb2_grpc._version_not_supported is False, grpc.__version__
    assert hasattr(grpc_service_pb2_grpc, "GRPCInferenceServiceStub")
    assert hasattr(grpc_service_pb2_grpc, "add_GRPCInferenceServiceServicer_to_server")


# Trailing blanks after a value are part of the case: written \x20 so that editors keep them.
CONFIG_PBTXT = """
# A Triton-style config as written by hand and by qa/common/gen_qa_models.py.
name: "text_classifier"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
max_batch_size: 8
version_policy: { specific { versions: [1, 3] }}

input [
  {
    name: "INPUT_IDS"
    data_type: TYPE_INT64
    dims: [ -1 ]
  }
]
input [
  {
    name: "ATTENTION_MASK"   # same shape as INPUT_IDS
    data_type: TYPE_INT64
    dims: [ -1 ]
    optional: true
  }
]
input {
  name: "IMAGE"
  data_type: TYPE_FP32
  format: FORMAT_NCHW
  dims: [ 3, 224, 224 ]
  reshape: { shape: [ 1, 3, 224, 224 ] }
}
output [
  {
    name: "LOGITS"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    label_filename: "labels.txt"\x20\x20\x20
  },
  {
    name: "TEXT"
    data_type: TYPE_STRING
    dims: [ 1 ]
  }
]

dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy {
    timeout_action: DELAY
    default_timeout_microseconds: 50000
    allow_timeout_override: true
  }
  priority_queue_policy {
    key: 1
    value: {
      timeout_action: REJECT
      max_queue_size: 16
    }
  }
  priority_queue_policy [ { key: 2 value { default_timeout_microseconds: 1000 } } ]
}

instance_group [
  {
    count: 2
    kind: KIND_GPU
    gpus: [ 0, 1 ]
  },
  {
    name: "cpu_fallback"
    kind: KIND_CPU
    count: 1
  }
]

parameters: {
  key: "intra_op_thread_count"
  value: { string_value: "4" }
}
parameters { key: "EXECUTION_ENV_PATH" value { string_value: "$$TRITON_MODEL_DIRECTORY/e.tgz" } }

model_warmup [
  {
    name: "zeros"
    batch_size: 1
    inputs { key: "INPUT_IDS" value { data_type: TYPE_INT64 dims: [ 16 ] zero_data: true } }
  }
]
"""


def test_config_pbtxt_text_format_parse():
    from protocol.proto import model_config_pb2 as mc

    config = text_format.Parse(CONFIG_PBTXT, mc.ModelConfig())

    assert config.name == "text_classifier"
    assert config.platform == "onnxruntime_onnx"
    assert config.backend == "onnxruntime"
    assert config.max_batch_size == 8

    assert config.version_policy.WhichOneof("policy_choice") == "specific"
    assert list(config.version_policy.specific.versions) == [1, 3]

    assert [tensor.name for tensor in config.input] == ["INPUT_IDS", "ATTENTION_MASK", "IMAGE"]
    assert list(config.input[0].dims) == [-1]
    assert config.input[0].data_type == mc.TYPE_INT64
    assert config.input[1].optional is True
    assert config.input[2].format == mc.ModelInput.FORMAT_NCHW
    assert list(config.input[2].dims) == [3, 224, 224]
    assert list(config.input[2].reshape.shape) == [1, 3, 224, 224]

    assert [tensor.name for tensor in config.output] == ["LOGITS", "TEXT"]
    assert config.output[0].label_filename == "labels.txt"
    assert config.output[1].data_type == mc.TYPE_STRING
    assert mc.DataType.Name(config.output[1].data_type) == "TYPE_STRING"

    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    batching = config.dynamic_batching
    assert list(batching.preferred_batch_size) == [4, 8]
    assert batching.max_queue_delay_microseconds == 100
    assert batching.priority_levels == 2
    assert batching.default_priority_level == 2
    assert batching.default_queue_policy.timeout_action == mc.ModelQueuePolicy.DELAY
    assert batching.default_queue_policy.default_timeout_microseconds == 50000
    assert batching.default_queue_policy.allow_timeout_override is True
    assert sorted(batching.priority_queue_policy) == [1, 2]
    assert batching.priority_queue_policy[1].timeout_action == mc.ModelQueuePolicy.REJECT
    assert batching.priority_queue_policy[1].max_queue_size == 16
    assert batching.priority_queue_policy[2].default_timeout_microseconds == 1000

    assert len(config.instance_group) == 2
    gpu_group, cpu_group = config.instance_group
    assert gpu_group.kind == mc.ModelInstanceGroup.KIND_GPU
    assert gpu_group.count == 2
    assert list(gpu_group.gpus) == [0, 1]
    assert cpu_group.name == "cpu_fallback"
    assert cpu_group.kind == mc.ModelInstanceGroup.KIND_CPU
    assert list(cpu_group.gpus) == []

    assert dict((k, v.string_value) for k, v in config.parameters.items()) == {
        "intra_op_thread_count": "4",
        "EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/e.tgz",
    }

    warmup = config.model_warmup[0]
    assert warmup.batch_size == 1
    assert warmup.inputs["INPUT_IDS"].WhichOneof("input_data_type") == "zero_data"
    assert list(warmup.inputs["INPUT_IDS"].dims) == [16]

    # The text form we would serve back parses to the same message.
    again = text_format.Parse(text_format.MessageToString(config), mc.ModelConfig())
    assert again == config


def test_config_pbtxt_parses_to_the_same_bytes_as_tritonclient():
    code = textwrap.dedent(
        """
        import importlib
        from google.protobuf import text_format
        mc = importlib.import_module(MODULE)
        config = text_format.Parse(TEXT, mc.ModelConfig())
        print(config.SerializeToString(deterministic=True).hex())
        """
    )
    encoded = {}
    for side, module in (("triton", TRITON[0]), ("ours", OURS[0])):
        encoded[side] = _run_in_subprocess(
            f"MODULE = {module!r}\nTEXT = {CONFIG_PBTXT!r}\n" + code
        ).strip()
    assert encoded["triton"]
    assert encoded["ours"] == encoded["triton"]


def test_generation_refuses_guards_above_the_pins():
    import pytest

    from protocol.proto.generate import GenerationError, check_runtime_guards

    check_runtime_guards("ok_pb2_grpc.py", "GRPC_GENERATED_VERSION = '1.81.1'\n")
    check_runtime_guards("old_pb2_grpc.py", "GRPC_GENERATED_VERSION = '1.64.0'\n")
    with pytest.raises(GenerationError, match="grpcio>=1.90.0"):
        check_runtime_guards("new_pb2_grpc.py", "GRPC_GENERATED_VERSION = '1.90.0'\n")
    protobuf7 = (
        "_runtime_version.ValidateProtobufRuntimeVersion(\n"
        "    _runtime_version.Domain.PUBLIC,\n    7,\n    34,\n    0,\n    '',\n    'x.proto'\n)\n"
    )
    with pytest.raises(GenerationError, match="protobuf 7.34.0"):
        check_runtime_guards("x_pb2.py", protobuf7)
