"""Stateful example models for the sequence batcher: running sums, one per sequence.

Usage::

    python -m examples.sequences --output examples/models   # beside `make run`'s models

    from examples.sequences import build_sequences
    build_sequences(repo)         # writes accumulator/, accumulator_oldest/, accumulator_onnx/

====================  =======================================================================
``accumulator``       Python, direct strategy, max_batch_size 4, one instance. INPUT INT32 [1]
                      -> OUTPUT INT32 [1], the sum of the sequence's inputs so far, kept by the
                      model per ``request.correlation_id()`` and reset by START; SEQUENCE BYTES
                      [1] says what the model saw: ``<int|str>:<correlation id>:<CORRID input>``.
                      Control inputs START, END, READY (INT32 0/1) and CORRID (UINT64).
``accumulator_oldest``  The same model.py with the oldest strategy (4 candidate sequences).
``accumulator_onnx``  ONNX, direct strategy, max_batch_size 4, with implicit state: the server
                      feeds ACC_IN (the previous ACC_OUT, zeros at START) and the graph computes
                      OUTPUT = ACC_OUT = ACC_IN + INPUT * READY.
====================  =======================================================================

The Python model is written as Triton's python backend documents it, so it runs in Triton too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from onnx import TensorProto, helper

from examples.build_repository import DEFAULT_OUTPUT
from examples.common import finish_model, write_model_dir, write_text
from examples.output_argument import parse_output_folder

SEQUENCE_MODELS = ("accumulator", "accumulator_oldest", "accumulator_onnx")

ACCUMULATOR_MODEL = '''"""A running sum per sequence, kept in the model by correlation ID."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()
            if not ready.any():  # a padding slot of a direct batch: answer, keep nothing
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT", np.zeros_like(value)),
                    pb_utils.Tensor("SEQUENCE", np.full(value.shape, b"", dtype=object))]))
                continue
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            end = pb_utils.get_input_tensor_by_name(request, "END").as_numpy()
            corrid_input = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            sequence = request.correlation_id()
            if start.any():
                self.sums[sequence] = 0
            total = self.sums.get(sequence, 0) + int(value.sum())
            self.sums[sequence] = total
            if end.any():
                del self.sums[sequence]
            seen = corrid_input.reshape(-1)[0]
            if isinstance(seen, bytes):
                seen = seen.decode()
            label = f"{type(sequence).__name__}:{sequence}:{seen}".encode()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.full(value.shape, total, dtype=np.int32)),
                pb_utils.Tensor("SEQUENCE", np.full(value.shape, label, dtype=object))]))
        return responses
'''


def _control(name: str, kind: str, values: str = "int32_false_true: [ 0, 1 ]") -> str:
    return f'    {{ name: "{name}" control [ {{ kind: {kind} {values} }} ] }}'


def accumulator_config(
    name: str = "accumulator",
    strategy: str = "direct { }",
    corrid_type: str = "TYPE_UINT64",
    idle_us: int = 5_000_000,
    instances: int = 1,
    max_batch_size: int = 4,
) -> str:
    """config.pbtxt of the Python accumulator; `strategy` is the strategy block as written."""
    controls = ",\n".join(
        [
            _control("START", "CONTROL_SEQUENCE_START"),
            _control("END", "CONTROL_SEQUENCE_END"),
            _control("READY", "CONTROL_SEQUENCE_READY"),
            _control("CORRID", "CONTROL_SEQUENCE_CORRID", f"data_type: {corrid_type}"),
        ]
    )
    return f'''name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  control_input [
{controls}
  ]
  {strategy}
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "SEQUENCE" data_type: TYPE_STRING dims: [ 1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: {instances} }} ]
'''


def accumulator_onnx_config(name: str = "accumulator_onnx", idle_us: int = 5_000_000) -> str:
    return f'''name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 4
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  control_input [
{_control("READY", "CONTROL_SEQUENCE_READY")}
  ]
  state [
    {{
      input_name: "ACC_IN"
      output_name: "ACC_OUT"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state: {{ name: "zero" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }}
    }}
  ]
  direct {{ }}
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
'''


def make_accumulator_onnx():
    """OUTPUT = ACC_OUT = ACC_IN + INPUT * READY, INT32 ['batch', 1]."""
    shape = ["batch", 1]
    names = ("INPUT", "READY", "ACC_IN")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["INPUT", "READY"], ["ready_input"]),
            helper.make_node("Add", ["ACC_IN", "ready_input"], ["OUTPUT"]),
            helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"]),
        ],
        "accumulator",
        [helper.make_tensor_value_info(name, TensorProto.INT32, shape) for name in names],
        [
            helper.make_tensor_value_info(name, TensorProto.INT32, shape)
            for name in ("OUTPUT", "ACC_OUT")
        ],
    )
    return finish_model(graph, "A running sum carried in implicit sequence state.")


def write_accumulator(repo: Path, name: str = "accumulator", **config: object) -> Path:
    """The Python accumulator under `repo/name` (config keywords: see accumulator_config)."""
    model_dir = Path(repo) / name
    write_text(model_dir / "1" / "model.py", ACCUMULATOR_MODEL)
    write_text(model_dir / "config.pbtxt", accumulator_config(name, **config))  # type: ignore
    return model_dir


def build_accumulator_oldest(repo: Path, name: str = "accumulator_oldest") -> Path:
    return write_accumulator(
        repo,
        name,
        strategy="oldest { max_candidate_sequences: 4 "
        "preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 2000 }",
    )


def build_accumulator_onnx(repo: Path, name: str = "accumulator_onnx", **config: object) -> Path:
    return write_model_dir(
        repo, name, make_accumulator_onnx(), accumulator_onnx_config(name, **config)
    )  # type: ignore


SEQUENCE_BUILDERS: dict[str, Callable[[Path], Path]] = {
    "accumulator": write_accumulator,
    "accumulator_oldest": build_accumulator_oldest,
    "accumulator_onnx": build_accumulator_onnx,
}


def build_sequences(repo: Path) -> None:
    for build in SEQUENCE_BUILDERS.values():
        build(repo)


def main(argv: list[str] | None = None) -> int:
    output = parse_output_folder(argv, __doc__, DEFAULT_OUTPUT, "model repository folder")
    build_sequences(output)
    print(f"built {len(SEQUENCE_BUILDERS)} models in {output}: {', '.join(SEQUENCE_BUILDERS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
