"""The one command-line shape every example builder shares: `--output FOLDER` with a default.

A module of its own (standard library only) so that the request-file writer, which needs no ONNX,
can use it without importing the model builders' helpers."""

from __future__ import annotations

import argparse
from pathlib import Path


def parse_output_folder(argv: list[str] | None, doc: str | None, default: Path, what: str) -> Path:
    """The `--output` folder from `argv`; `doc`'s first paragraph is the command's description."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=default, help=f"{what} (default: {default})")
    output: Path = parser.parse_args(argv).output
    return output
