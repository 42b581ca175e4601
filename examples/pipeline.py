"""The example image pipeline: Python preprocessing, the ONNX `classifier`, Python postprocessing.

Usage (after the ONNX models are built)::

    from examples.pipeline import build_pipeline
    build_pipeline(repo)          # writes preprocess/, postprocess/ and pipeline/

===============  ==========================================================================
``preprocess``   Python. IMAGE UINT8 [32, 32, 3] (raw HWC pixels) -> PIXELS FP32 [3, 32, 32]
                 (scaled to [0, 1], normalised per channel, CHW); max_batch_size 8, dynamic
                 batching, 1 worker process.
``postprocess``  Python. PROBABILITIES FP32 [10] -> LABEL BYTES [1] (the top class name) and
                 SCORE FP32 [1] (its probability); max_batch_size 8, dynamic batching.
``pipeline``     Ensemble: IMAGE -> preprocess -> classifier -> postprocess -> LABEL, SCORE,
                 served with one request.
===============  ==========================================================================

The Python models are written exactly as Triton's python backend documents them
(`import triton_python_backend_utils as pb_utils`), so they also run in Triton unchanged.
Files are written through a temporary file and a rename, as build_repository.py does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from examples.common import CLASSIFIER_LABELS, write_text

PIPELINE_MODELS = ("preprocess", "postprocess", "pipeline")
IMAGE_SHAPE = (32, 32, 3)
# Per-channel statistics the preprocessing normalises with (CIFAR-10's).
CHANNEL_MEAN = (0.4914, 0.4822, 0.4465)
CHANNEL_STD = (0.2470, 0.2435, 0.2616)

PREPROCESS_MODEL = '''"""Raw HWC uint8 images -> the normalised CHW float32 tensor to classify."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils

MEAN = np.array(%(mean)r, dtype=np.float32)
STD = np.array(%(std)r, dtype=np.float32)


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        output_config = pb_utils.get_output_config_by_name(model_config, "PIXELS")
        self.output_dtype = pb_utils.triton_string_to_numpy(output_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            scaled = image.astype(np.float32) / 255.0  # [batch, H, W, C]
            normalised = (scaled - MEAN) / STD
            pixels = np.ascontiguousarray(normalised.transpose(0, 3, 1, 2))  # [batch, C, H, W]
            output = pb_utils.Tensor("PIXELS", pixels.astype(self.output_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses

    def finalize(self):
        pass
'''

POSTPROCESS_MODEL = '''"""Class probabilities -> the top label (BYTES) and its score."""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        label_path = os.path.join(args["model_repository"], "labels.txt")
        with open(label_path, encoding="utf-8") as handle:
            self.labels = [line.strip() for line in handle if line.strip()]
        score_config = pb_utils.get_output_config_by_name(model_config, "SCORE")
        self.score_dtype = pb_utils.triton_string_to_numpy(score_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            probabilities = pb_utils.get_input_tensor_by_name(request, "PROBABILITIES").as_numpy()
            if probabilities.shape[-1] != len(self.labels):
                error = pb_utils.TritonError(
                    f"expected {len(self.labels)} probabilities, got {probabilities.shape[-1]}")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            top = probabilities.argmax(axis=-1)  # [batch]
            labels = np.array([[self.labels[i].encode("utf-8")] for i in top], dtype=np.object_)
            scores = np.take_along_axis(probabilities, top[:, None], axis=-1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("LABEL", labels),
                pb_utils.Tensor("SCORE", scores.astype(self.score_dtype)),
            ]))
        return responses
'''

PREPROCESS_CONFIG = """name: "preprocess"
backend: "python"
max_batch_size: 8
input [
  {
    name: "IMAGE"
    data_type: TYPE_UINT8
    dims: [ 32, 32, 3 ]
  }
]
output [
  {
    name: "PIXELS"
    data_type: TYPE_FP32
    dims: [ 3, 32, 32 ]
  }
]
dynamic_batching { }
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
"""

POSTPROCESS_CONFIG = """name: "postprocess"
backend: "python"
max_batch_size: 8
input [
  {
    name: "PROBABILITIES"
    data_type: TYPE_FP32
    dims: [ 10 ]
  }
]
output [
  {
    name: "LABEL"
    data_type: TYPE_STRING
    dims: [ 1 ]
  },
  {
    name: "SCORE"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }
]
dynamic_batching { }
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
"""

PIPELINE_CONFIG = """name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [
  {
    name: "IMAGE"
    data_type: TYPE_UINT8
    dims: [ 32, 32, 3 ]
  }
]
output [
  {
    name: "LABEL"
    data_type: TYPE_STRING
    dims: [ 1 ]
  },
  {
    name: "SCORE"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }
]
ensemble_scheduling {
  step [
    {
      model_name: "preprocess"
      model_version: -1
      input_map { key: "IMAGE" value: "IMAGE" }
      output_map { key: "PIXELS" value: "pixels" }
    },
    {
      model_name: "classifier"
      model_version: -1
      input_map { key: "INPUT" value: "pixels" }
      output_map { key: "PROBABILITIES" value: "probabilities" }
    },
    {
      model_name: "postprocess"
      model_version: -1
      input_map { key: "PROBABILITIES" value: "probabilities" }
      output_map { key: "LABEL" value: "LABEL" }
      output_map { key: "SCORE" value: "SCORE" }
    }
  ]
}
"""


def _default_labels() -> Sequence[str]:
    return CLASSIFIER_LABELS


def preprocess_source() -> str:
    return PREPROCESS_MODEL % {"mean": CHANNEL_MEAN, "std": CHANNEL_STD}


def build_preprocess(repo: Path, name: str = "preprocess") -> Path:
    model_dir = Path(repo) / name
    write_text(model_dir / "1" / "model.py", preprocess_source())
    write_text(model_dir / "config.pbtxt", PREPROCESS_CONFIG.replace('"preprocess"', f'"{name}"'))
    return model_dir


def build_postprocess(
    repo: Path, name: str = "postprocess", labels: Sequence[str] | None = None
) -> Path:
    model_dir = Path(repo) / name
    labels = _default_labels() if labels is None else labels
    write_text(model_dir / "1" / "model.py", POSTPROCESS_MODEL)
    write_text(model_dir / "labels.txt", "".join(f"{label}\n" for label in labels))
    write_text(model_dir / "config.pbtxt", POSTPROCESS_CONFIG.replace('"postprocess"', f'"{name}"'))
    return model_dir


def build_pipeline_ensemble(repo: Path, name: str = "pipeline") -> Path:
    """The ensemble's directory: a config and an empty version folder, as Triton requires."""
    model_dir = Path(repo) / name
    write_text(model_dir / "1" / ".gitkeep", "")  # keeps the version folder in git
    write_text(model_dir / "config.pbtxt", PIPELINE_CONFIG.replace('"pipeline"', f'"{name}"', 1))
    return model_dir


PIPELINE_BUILDERS: dict[str, Callable[[Path], Path]] = {
    "preprocess": build_preprocess,
    "postprocess": build_postprocess,
    "pipeline": build_pipeline_ensemble,
}


def build_pipeline(repo: Path) -> list[Path]:
    """Write the pipeline's three models under `repo` (which must also hold `classifier`)."""
    return [build(Path(repo)) for build in PIPELINE_BUILDERS.values()]


def preprocess_reference(image):
    """What `preprocess` computes, in numpy, for tests: [N, 32, 32, 3] uint8 -> [N, 3, 32, 32]."""
    import numpy as np

    mean = np.array(CHANNEL_MEAN, dtype=np.float32)
    std = np.array(CHANNEL_STD, dtype=np.float32)
    scaled = image.astype(np.float32) / 255.0
    return np.ascontiguousarray(((scaled - mean) / std).transpose(0, 3, 1, 2))
