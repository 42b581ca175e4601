"""Build the example Triton model repository (ONNX models made with ``onnx.helper``).

Usage::

    python examples/build_repository.py [--output DIR]      # default: examples/models

No model binaries are committed: every ``model.onnx`` is generated here from fixed seeds, so
two builds write byte-identical files. Building is idempotent (files are rewritten in place,
each through a temporary file and an atomic rename, so a polling server never reads half a
file) and takes well under a second.

Models (the repository layout is ``<output>/<model>/config.pbtxt`` and
``<output>/<model>/1/model.onnx``):

==========================  ================================================================
``simple``                  Triton's classic example: INPUT0, INPUT1 INT32 [16] ->
                            OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1;
                            max_batch_size 8, no dynamic batching.
``simple_batching``         the same model, max_batch_size 64, dynamic batching (500 us).
``classifier``              INPUT FP32 [3, 32, 32] -> PROBABILITIES FP32 [10] (softmax over
                            10 CIFAR-10 style labels, ``labels.txt``); max_batch_size 8.
``dense_compute``           INPUT FP32 [256] -> OUTPUT FP32 [256], 4 x (MatMul 256x256 + Tanh);
                            max_batch_size 64, dynamic batching (2000 us), 1 CPU instance,
                            intra_op_thread_count 1.
``dense_compute_nobatch``   the same model and config without dynamic batching.
``conv_compute``            INPUT FP32 [3, 64, 64] -> PROBABILITIES FP32 [10]: 4 x (Conv 3x3,
                            32 channels, stride 1 + Relu), GlobalAveragePool, Flatten,
                            Gemm 32 -> 10, Softmax. About 117 M multiply-adds (2.5 to 3.5 ms
                            on one CPU thread) per inference from 115 KiB of weights: compute
                            that dominates per-request serving overhead (the benchmark's
                            throughput model). max_batch_size 64, dynamic batching (2000 us),
                            1 CPU instance, intra_op_thread_count 1.
``conv_compute_nobatch``    the same model and config without dynamic batching.
``identity_bytes``          INPUT BYTES [-1] -> OUTPUT BYTES [-1] (Identity); max_batch_size 0.
==========================  ================================================================

The Python ``pipeline`` ensemble comes from ``examples/pipeline.py``, the streaming examples
(``token_stream``, a decoupled model sending one word per response, and ``token_join``, a BLS
model calling it) from ``examples/streaming.py``. Benchmark-only models live in
``examples/mlp_compute.py``.

The ``build_*`` functions take the repository root and write one model directory under it,
returning that directory; the ``make_*_model`` functions return the ``onnx.ModelProto`` and the
``*onnx_config`` functions the config.pbtxt text, so tests and benchmarks can reuse either.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnx

if __package__ in (None, ""):
    # Run as a script (python examples/build_repository.py): make `examples.*` importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from onnx import TensorProto, helper, numpy_helper

from examples.common import (
    CLASSIFIER_LABELS,
    dynamic_batching_block,
    finish_model,
    onnx_config,
    tensor_block,
    write_model_dir,
    write_text,
)
from examples.output_argument import parse_output_folder

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "models"


SIMPLE_DIM = 16
CLASSIFIER_INPUT_DIMS = (3, 32, 32)
DENSE_WIDTH = 256
DENSE_LAYERS = 4
CONV_INPUT_DIMS = (3, 64, 64)
CONV_CHANNELS = 32
CONV_LAYERS = 4
CONV_CLASSES = 10

CLASSIFIER_SEED = 20240601
DENSE_SEED = 20240602
CONV_SEED = 20240603


def simple_config(
    name: str = "simple", max_batch_size: int = 8, max_queue_delay_us: int | None = None
) -> str:
    """config.pbtxt for the add/sub model; dynamic batching only when a delay is given."""
    extra: list[str] = (
        [] if max_queue_delay_us is None else [dynamic_batching_block(max_queue_delay_us)]
    )
    return onnx_config(
        name,
        max_batch_size,
        [
            tensor_block("INPUT0", "TYPE_INT32", (SIMPLE_DIM,)),
            tensor_block("INPUT1", "TYPE_INT32", (SIMPLE_DIM,)),
        ],
        [
            tensor_block("OUTPUT0", "TYPE_INT32", (SIMPLE_DIM,)),
            tensor_block("OUTPUT1", "TYPE_INT32", (SIMPLE_DIM,)),
        ],
        extra,
    )


def classifier_config(name: str = "classifier") -> str:
    return onnx_config(
        name,
        8,
        [tensor_block("INPUT", "TYPE_FP32", CLASSIFIER_INPUT_DIMS)],
        [tensor_block("PROBABILITIES", "TYPE_FP32", (len(CLASSIFIER_LABELS),), "labels.txt")],
    )


def dense_compute_config(name: str = "dense_compute", dynamic_batching: bool = True) -> str:
    extra: list[str] = []
    if dynamic_batching:
        extra.append(dynamic_batching_block(2000))
    extra.append("instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]")
    extra.append(
        'parameters {\n  key: "intra_op_thread_count"\n  value: {\n    string_value: "1"\n  }\n}'
    )
    return onnx_config(
        name,
        64,
        [tensor_block("INPUT", "TYPE_FP32", (DENSE_WIDTH,))],
        [tensor_block("OUTPUT", "TYPE_FP32", (DENSE_WIDTH,))],
        extra,
    )


def conv_compute_config(name: str = "conv_compute", dynamic_batching: bool = True) -> str:
    """`dense_compute`'s serving setup (batching, 1 CPU instance, 1 ORT thread) for the CNN."""
    extra: list[str] = []
    if dynamic_batching:
        extra.append(dynamic_batching_block(2000))
    extra.append("instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]")
    extra.append(
        'parameters {\n  key: "intra_op_thread_count"\n  value: {\n    string_value: "1"\n  }\n}'
    )
    return onnx_config(
        name,
        64,
        [tensor_block("INPUT", "TYPE_FP32", CONV_INPUT_DIMS)],
        [tensor_block("PROBABILITIES", "TYPE_FP32", (CONV_CLASSES,))],
        extra,
    )


def identity_bytes_config(name: str = "identity_bytes") -> str:
    return onnx_config(
        name,
        0,
        [tensor_block("INPUT", "TYPE_STRING", (-1,))],
        [tensor_block("OUTPUT", "TYPE_STRING", (-1,))],
    )


# --------------------------------------------------------------------------------------------
# ONNX models


def make_simple_model() -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1; INT32 ['batch', 16]."""
    shape: list[str | int | None] = ["batch", SIMPLE_DIM]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        "simple",
        [
            helper.make_tensor_value_info("INPUT0", TensorProto.INT32, shape),
            helper.make_tensor_value_info("INPUT1", TensorProto.INT32, shape),
        ],
        [
            helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, shape),
            helper.make_tensor_value_info("OUTPUT1", TensorProto.INT32, shape),
        ],
    )
    return finish_model(graph, "Triton's simple example: element-wise add and subtract.")


def make_classifier_model(seed: int = CLASSIFIER_SEED) -> onnx.ModelProto:
    """A small CNN: 2 x (Conv + Relu), GlobalAveragePool, Flatten, Gemm -> 10, Softmax."""
    rng = np.random.default_rng(seed)
    c_in = CLASSIFIER_INPUT_DIMS[0]
    c1, c2, classes = 16, 32, len(CLASSIFIER_LABELS)

    def he(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    initializers = [
        numpy_helper.from_array(he((c1, c_in, 3, 3), c_in * 9), "conv1.weight"),
        numpy_helper.from_array((rng.standard_normal(c1) * 0.1).astype(np.float32), "conv1.bias"),
        numpy_helper.from_array(he((c2, c1, 3, 3), c1 * 9), "conv2.weight"),
        numpy_helper.from_array((rng.standard_normal(c2) * 0.1).astype(np.float32), "conv2.bias"),
        numpy_helper.from_array(he((c2, classes), c2), "fc.weight"),
        numpy_helper.from_array((rng.standard_normal(classes) * 0.1).astype(np.float32), "fc.bias"),
    ]
    nodes = [
        helper.make_node(
            "Conv",
            ["INPUT", "conv1.weight", "conv1.bias"],
            ["conv1"],
            name="conv1",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node(
            "Conv",
            ["relu1", "conv2.weight", "conv2.bias"],
            ["conv2"],
            name="conv2",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            strides=[2, 2],
        ),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["relu2"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["features"], name="flatten", axis=1),
        helper.make_node("Gemm", ["features", "fc.weight", "fc.bias"], ["logits"], name="fc"),
        helper.make_node("Softmax", ["logits"], ["PROBABILITIES"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [
            helper.make_tensor_value_info(
                "INPUT", TensorProto.FLOAT, ["batch", *CLASSIFIER_INPUT_DIMS]
            )
        ],
        [helper.make_tensor_value_info("PROBABILITIES", TensorProto.FLOAT, ["batch", classes])],
        initializers,
    )
    return finish_model(graph, "Small seeded CNN image classifier over 10 CIFAR-10 classes.")


def make_dense_compute_model(
    seed: int = DENSE_SEED, width: int = DENSE_WIDTH, layers: int = DENSE_LAYERS
) -> onnx.ModelProto:
    """``layers`` x (MatMul width x width + Tanh); weights scaled by 1/sqrt(width)."""
    rng = np.random.default_rng(seed)
    initializers = []
    nodes = []
    current = "INPUT"
    for i in range(layers):
        weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        initializers.append(numpy_helper.from_array(weight, f"dense{i}.weight"))
        nodes.append(
            helper.make_node(
                "MatMul", [current, f"dense{i}.weight"], [f"matmul{i}"], name=f"matmul{i}"
            )
        )
        out = "OUTPUT" if i == layers - 1 else f"tanh{i}"
        nodes.append(helper.make_node("Tanh", [f"matmul{i}"], [out], name=f"tanh{i}"))
        current = out
    graph = helper.make_graph(
        nodes,
        "dense_compute",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", width])],
        initializers,
    )
    return finish_model(graph, f"{layers} dense {width}x{width} MatMul + Tanh layers.")


def make_conv_compute_model(
    seed: int = CONV_SEED, channels: int = CONV_CHANNELS, layers: int = CONV_LAYERS
) -> onnx.ModelProto:
    """``layers`` x (Conv 3x3, pad 1, stride 1 + Relu) at full resolution, GlobalAveragePool,
    Flatten, Gemm -> 10, Softmax. Compute grows with the image, weights do not: 4 layers of 32
    channels on 64x64 are ~117 M multiply-adds per inference from ~28 K parameters."""
    rng = np.random.default_rng(seed)
    c_in = CONV_INPUT_DIMS[0]
    initializers = []
    nodes = []
    current = "INPUT"
    for i in range(layers):
        fan_in = c_in * 9
        weight = rng.standard_normal((channels, c_in, 3, 3)) * np.sqrt(2.0 / fan_in)
        bias = rng.standard_normal(channels) * 0.1
        initializers += [
            numpy_helper.from_array(weight.astype(np.float32), f"conv{i}.weight"),
            numpy_helper.from_array(bias.astype(np.float32), f"conv{i}.bias"),
        ]
        nodes += [
            helper.make_node(
                "Conv",
                [current, f"conv{i}.weight", f"conv{i}.bias"],
                [f"conv{i}"],
                name=f"conv{i}",
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
            ),
            helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"relu{i}"),
        ]
        current, c_in = f"relu{i}", channels
    fc = rng.standard_normal((channels, CONV_CLASSES)) * np.sqrt(2.0 / channels)
    initializers += [
        numpy_helper.from_array(fc.astype(np.float32), "fc.weight"),
        numpy_helper.from_array(
            (rng.standard_normal(CONV_CLASSES) * 0.1).astype(np.float32), "fc.bias"
        ),
    ]
    nodes += [
        helper.make_node("GlobalAveragePool", [current], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["features"], name="flatten", axis=1),
        helper.make_node("Gemm", ["features", "fc.weight", "fc.bias"], ["logits"], name="fc"),
        helper.make_node("Softmax", ["logits"], ["PROBABILITIES"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_compute",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", *CONV_INPUT_DIMS])],
        [
            helper.make_tensor_value_info(
                "PROBABILITIES", TensorProto.FLOAT, ["batch", CONV_CLASSES]
            )
        ],
        initializers,
    )
    return finish_model(
        graph,
        f"{layers} Conv 3x3 x {channels} channels + Relu at full "
        "resolution, then pool and a 10-way softmax: compute-bound.",
    )


def make_identity_bytes_model() -> onnx.ModelProto:
    """OUTPUT = Identity(INPUT) on a 1-D string tensor."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT"], ["OUTPUT"], name="identity")],
        "identity_bytes",
        [helper.make_tensor_value_info("INPUT", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.STRING, ["n"])],
    )
    return finish_model(graph, "BYTES passthrough.")


# --------------------------------------------------------------------------------------------
# model directories


def build_simple(repo: Path, name: str = "simple") -> Path:
    return write_model_dir(repo, name, make_simple_model(), simple_config(name, 8))


def build_simple_batching(repo: Path, name: str = "simple_batching") -> Path:
    return write_model_dir(
        repo, name, make_simple_model(), simple_config(name, 64, max_queue_delay_us=500)
    )


def build_classifier(repo: Path, name: str = "classifier") -> Path:
    model_dir = write_model_dir(repo, name, make_classifier_model(), classifier_config(name))
    write_text(model_dir / "labels.txt", "".join(f"{label}\n" for label in CLASSIFIER_LABELS))
    return model_dir


def build_dense_compute(
    repo: Path, name: str = "dense_compute", dynamic_batching: bool = True
) -> Path:
    return write_model_dir(
        repo, name, make_dense_compute_model(), dense_compute_config(name, dynamic_batching)
    )


def build_dense_compute_nobatch(repo: Path, name: str = "dense_compute_nobatch") -> Path:
    return build_dense_compute(repo, name, dynamic_batching=False)


def build_conv_compute(
    repo: Path, name: str = "conv_compute", dynamic_batching: bool = True
) -> Path:
    return write_model_dir(
        repo, name, make_conv_compute_model(), conv_compute_config(name, dynamic_batching)
    )


def build_conv_compute_nobatch(repo: Path, name: str = "conv_compute_nobatch") -> Path:
    return build_conv_compute(repo, name, dynamic_batching=False)


def build_identity_bytes(repo: Path, name: str = "identity_bytes") -> Path:
    return write_model_dir(repo, name, make_identity_bytes_model(), identity_bytes_config(name))


BUILDERS = {
    "simple": build_simple,
    "simple_batching": build_simple_batching,
    "classifier": build_classifier,
    "dense_compute": build_dense_compute,
    "dense_compute_nobatch": build_dense_compute_nobatch,
    "conv_compute": build_conv_compute,
    "conv_compute_nobatch": build_conv_compute_nobatch,
    "identity_bytes": build_identity_bytes,
}


def build_repository(output: Path = DEFAULT_OUTPUT) -> Path:
    """Build every example model under ``output`` (created if missing); returns ``output``."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    for build in BUILDERS.values():
        build(output)
    # The pipeline (python preprocess -> classifier -> python postprocess) uses `classifier`.
    from examples.pipeline import build_pipeline

    build_pipeline(output)
    # The streaming examples: a decoupled token streamer and a BLS model that calls it.
    from examples.streaming import build_streaming

    build_streaming(output)
    return output


def main(argv: list[str] | None = None) -> int:
    output_folder = parse_output_folder(argv, __doc__, DEFAULT_OUTPUT, "model repository folder")
    start = time.perf_counter()
    output = build_repository(output_folder)
    elapsed = time.perf_counter() - start
    from examples.pipeline import PIPELINE_BUILDERS
    from examples.streaming import STREAMING_MODELS

    names = [*BUILDERS, *PIPELINE_BUILDERS, *STREAMING_MODELS]
    print(f"built {len(names)} models in {output} ({elapsed:.2f} s): {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
