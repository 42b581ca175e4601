"""What the example builders share: the ONNX opset, the classifier's labels, atomic file writes and
config.pbtxt text. A module of its own so that each builder imports it and none imports another."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import helper

#: Opset and IR version that onnxruntime >= 1.17 loads.
OPSET = 17
IR_VERSION = 8

CLASSIFIER_LABELS = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)


# --------------------------------------------------------------------------------------------
# file helpers


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file in the same folder, then rename).
    The file gets the mode the umask gives a new file (0644 under 022), not mkstemp's 0600: the
    image's server runs as uid 1000 and must read a repository mounted from the host."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_model_dir(
    repo: Path, name: str, model: onnx.ModelProto, config: str, version: int = 1
) -> Path:
    model_dir = Path(repo) / name
    write_bytes(model_dir / str(version) / "model.onnx", model.SerializeToString())
    write_text(model_dir / "config.pbtxt", config)
    return model_dir


def finish_model(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="ascend-serve-examples",
        producer_version="1",
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


# --------------------------------------------------------------------------------------------
# config.pbtxt text


def dims_text(dims: tuple[int, ...] | list[int]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def tensor_block(
    name: str, data_type: str, dims: tuple[int, ...], label_filename: str | None = None
) -> str:
    lines = [
        "  {",
        f'    name: "{name}"',
        f"    data_type: {data_type}",
        f"    dims: {dims_text(dims)}",
    ]
    if label_filename is not None:
        lines.append(f'    label_filename: "{label_filename}"')
    lines.append("  }")
    return "\n".join(lines)


def onnx_config(
    name: str,
    max_batch_size: int,
    inputs: list[str],
    outputs: list[str],
    extra: Sequence[str] = (),
) -> str:
    parts = [
        f'name: "{name}"',
        'platform: "onnxruntime_onnx"',
        f"max_batch_size: {max_batch_size}",
        "input [\n" + ",\n".join(inputs) + "\n]",
        "output [\n" + ",\n".join(outputs) + "\n]",
        *extra,
    ]
    return "\n".join(parts) + "\n"


def dynamic_batching_block(max_queue_delay_us: int, preferred: Sequence[int] = ()) -> str:
    sizes = f"  preferred_batch_size: {dims_text(list(preferred))}\n" if preferred else ""
    return f"dynamic_batching {{\n{sizes}  max_queue_delay_microseconds: {max_queue_delay_us}\n}}"
