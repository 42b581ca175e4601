"""The benchmark's fast model, ``mlp_compute`` (not part of the example repository: its
weights alone are 36 MB; ``bench/run.py`` builds it into its own repository).

==========================  ================================================================
``mlp_compute``             INPUT FP32 [256] -> OUTPUT FP32 [16]: MatMul 256x2048 + Relu,
                            2 x (MatMul 2048x2048 + Relu), MatMul 2048x16. About 8.9 M
                            multiply-adds per inference, memory-bound at batch 1 and
                            GEMM-bound at batch 64 (the "batching pays when the model is fast"
                            model). max_batch_size 64, dynamic batching (preferred 16, 32, 64;
                            2000 us), 1 CPU instance, no ORT thread parameters (the server's
                            ONNX Runtime defaults apply).
==========================  ================================================================
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from examples.common import (
    dynamic_batching_block,
    finish_model,
    onnx_config,
    tensor_block,
    write_model_dir,
)

MLP_INPUT = 256
MLP_HIDDEN = 2048
MLP_HIDDEN_LAYERS = 3
MLP_OUTPUT = 16
MLP_PREFERRED_BATCH_SIZES = (16, 32, 64)
MLP_SEED = 20240604


def mlp_compute_config(name: str = "mlp_compute") -> str:
    """Dynamic batching with preferred sizes, 1 CPU instance and no ORT thread parameters: the
    server's ONNX Runtime defaults apply."""
    extra = [
        dynamic_batching_block(2000, MLP_PREFERRED_BATCH_SIZES),
        "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]",
    ]
    return onnx_config(
        name,
        64,
        [tensor_block("INPUT", "TYPE_FP32", (MLP_INPUT,))],
        [tensor_block("OUTPUT", "TYPE_FP32", (MLP_OUTPUT,))],
        extra,
    )


def make_mlp_compute_model(
    seed: int = MLP_SEED, hidden: int = MLP_HIDDEN, layers: int = MLP_HIDDEN_LAYERS
) -> onnx.ModelProto:
    """MatMul 256 x hidden + Relu, then ``layers - 1`` x (MatMul hidden x hidden + Relu), then
    MatMul hidden x 16; no biases, He-scaled weights. ~8.9 M multiply-adds per inference from
    36 MB of weights: a GEMV that streams the weights at batch 1, a GEMM at batch 64."""
    rng = np.random.default_rng(seed)
    widths = [MLP_INPUT, *([hidden] * layers), MLP_OUTPUT]
    initializers = []
    nodes = []
    current = "INPUT"
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:], strict=False)):
        weight = rng.standard_normal((fan_in, fan_out), dtype=np.float32)
        weight *= np.float32(np.sqrt(2.0 / fan_in))
        initializers.append(numpy_helper.from_array(weight, f"fc{i}.weight"))
        last = i == len(widths) - 2
        out = "OUTPUT" if last else f"matmul{i}"
        nodes.append(
            helper.make_node("MatMul", [current, f"fc{i}.weight"], [out], name=f"matmul{i}")
        )
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"relu{i}"], name=f"relu{i}"))
            current = f"relu{i}"
    graph = helper.make_graph(
        nodes,
        "mlp_compute",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", MLP_INPUT])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", MLP_OUTPUT])],
        initializers,
    )
    return finish_model(
        graph,
        f"MLP {MLP_INPUT} -> {layers} x {hidden} (Relu) -> "
        f"{MLP_OUTPUT}: fast per inference once batched.",
    )


def build_mlp_compute(repo: Path, name: str = "mlp_compute") -> Path:
    return write_model_dir(repo, name, make_mlp_compute_model(), mlp_compute_config(name))


#: Built by bench/run.py into its own repository, not by examples/build_repository.py.
BENCH_BUILDERS = {
    "mlp_compute": build_mlp_compute,
}
