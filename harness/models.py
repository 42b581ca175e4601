"""Models that tests and bench/ both build: an ONNX FP32 identity for large bodies
(tests/e2e's offload and frontend-process tests, bench/studies/hostile.py)."""

from __future__ import annotations

from pathlib import Path


def build_identity_fp32(repo: Path) -> None:
    """`identity_fp32`: an ONNX Identity over FP32 [-1, -1], no batching (large bodies)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT"], ["OUTPUT"], name="identity")],
        "identity_fp32",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, [-1, -1])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, [-1, -1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    directory = repo / "identity_fp32"
    (directory / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(directory / "1" / "model.onnx"))
    (directory / "config.pbtxt").write_text(
        'name: "identity_fp32"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )
