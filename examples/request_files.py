"""Write the request bodies the README's curl examples send (``-d @examples/requests/...``).

Usage::

    python examples/request_files.py [--output DIR]      # default: examples/requests

``make models`` runs it. The two models want different inputs, so there is one file each, both
of the same red 32x32 image:

=============================  ==================================================================
``red_image_pipeline.json``    for ``pipeline``: IMAGE UINT8 [1, 32, 32, 3], the raw HWC pixels
                               (255, 0, 0).
``red_image_classifier.json``  for ``classifier``: INPUT FP32 [1, 3, 32, 32], that image as
                               ``preprocess`` hands it to the classifier (scaled to [0, 1],
                               normalised per channel, CHW), asking for the top 3 classes; so
                               both examples answer the same class and score.
=============================  ==================================================================
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as a script (python examples/request_files.py): make `examples.*` importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from examples.output_argument import parse_output_folder
from examples.pipeline import IMAGE_SHAPE, preprocess_reference

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "requests"


def red_image() -> np.ndarray:
    """A [1, 32, 32, 3] UINT8 image, all red."""
    image = np.zeros((1, *IMAGE_SHAPE), dtype=np.uint8)
    image[..., 0] = 255
    return image


def pipeline_request() -> dict[str, Any]:
    image = red_image()
    return {
        "inputs": [
            {
                "name": "IMAGE",
                "shape": list(image.shape),
                "datatype": "UINT8",
                "data": image.flatten().tolist(),
            }
        ]
    }


def classifier_request() -> dict[str, Any]:
    pixels = preprocess_reference(red_image())
    return {
        "inputs": [
            {
                "name": "INPUT",
                "shape": list(pixels.shape),
                "datatype": "FP32",
                "data": [float(value) for value in pixels.flatten()],
            }
        ],
        "outputs": [{"name": "PROBABILITIES", "parameters": {"classification": 3}}],
    }


REQUEST_FILES = {
    "red_image_pipeline.json": pipeline_request,
    "red_image_classifier.json": classifier_request,
}


def write_request_files(output: Path = DEFAULT_OUTPUT) -> list[Path]:
    """Write every request file under `output` (created if missing); returns their paths."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, body in REQUEST_FILES.items():
        path = output / name
        path.write_text(json.dumps(body(), separators=(",", ":")) + "\n")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    output_folder = parse_output_folder(argv, __doc__, DEFAULT_OUTPUT, "request files folder")
    paths = write_request_files(output_folder)
    print(f"wrote {', '.join(str(path) for path in paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
