"""Variants of the `simple` example whose answers tell them apart, for hot-swap demos and tests.

``make_offset_model(k)`` has simple's inputs and outputs but computes
OUTPUT0 = INPUT0 + INPUT1 + k and OUTPUT1 = INPUT0 - INPUT1 + k, so a client sees at once which
copy answered. ``write_version`` writes one version directory of such a model, optionally in
slow chunks (a repository being copied into while a polling server watches it).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from examples.build_repository import SIMPLE_DIM, simple_config
from examples.common import IR_VERSION, OPSET


def make_offset_model(offset: int) -> onnx.ModelProto:
    """simple's add/sub, plus `offset` on both outputs; INT32 ['batch', 16]."""
    shape = ["batch", SIMPLE_DIM]
    constant = numpy_helper.from_array(np.array([offset], dtype=np.int32), "offset")
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["sum"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["difference"], name="sub"),
            helper.make_node("Add", ["sum", "offset"], ["OUTPUT0"], name="add_offset0"),
            helper.make_node("Add", ["difference", "offset"], ["OUTPUT1"], name="add_offset1"),
        ],
        "simple_offset",
        [
            helper.make_tensor_value_info("INPUT0", TensorProto.INT32, shape),
            helper.make_tensor_value_info("INPUT1", TensorProto.INT32, shape),
        ],
        [
            helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, shape),
            helper.make_tensor_value_info("OUTPUT1", TensorProto.INT32, shape),
        ],
        [constant],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="ascend-serve-examples",
        doc_string=f"simple plus {offset}",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def model_bytes(offset: int) -> bytes:
    """The serialized model: `simple` itself for offset 0, a distinguishable variant otherwise."""
    if offset == 0:
        from examples.build_repository import make_simple_model

        return make_simple_model().SerializeToString()
    return make_offset_model(offset).SerializeToString()


def write_version(
    model_dir: Path,
    version: int,
    offset: int,
    *,
    chunks: int = 1,
    pause: float = 0.0,
    config: bool = True,
) -> Path:
    """Write `<model_dir>/<version>/model.onnx` (and config.pbtxt when asked), the model in
    `chunks` appends with `pause` seconds between them; returns the version directory."""
    model_dir = Path(model_dir)
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    if config:
        (model_dir / "config.pbtxt").write_text(simple_config(model_dir.name, 8))
    data = model_bytes(offset)
    step = max(1, -(-len(data) // max(chunks, 1)))
    with open(version_dir / "model.onnx", "wb") as handle:
        for start in range(0, len(data), step):
            handle.write(data[start : start + step])
            handle.flush()
            if pause and start + step < len(data):
                time.sleep(pause)
    return version_dir
