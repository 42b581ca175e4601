"""Stand-in `.om` files and model repositories for the pyACL emulator.

Used by tests/npu and, later, by the end-to-end tests: `write_model_repository` lays out a
model directory (`config.pbtxt` with `backend: "ascend"`, `1/model.om`), and `emulator_env`
gives a server subprocess the emulator as its `acl` (tests/npu/emulator first on PYTHONPATH).
The file format is documented in tests/npu/emulator/acl/_om.py, which reads it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

EMULATOR_PATH = Path(__file__).resolve().parents[1] / "npu" / "emulator"

# Triton wire names -> aclDataType numbers.
ACL_TYPE = {
    "FP32": 0,
    "FP16": 1,
    "INT8": 2,
    "INT32": 3,
    "UINT8": 4,
    "INT16": 6,
    "UINT16": 7,
    "UINT32": 8,
    "INT64": 9,
    "UINT64": 10,
    "FP64": 11,
    "BOOL": 12,
    "BF16": 27,
}
FORMAT_ND = 2


def tensor(name: str, dtype: str = "FP32", dims: Sequence[int] = (-1, 4)) -> dict:
    return {"name": name, "dtype": ACL_TYPE[dtype], "format": FORMAT_ND, "dims": list(dims)}


def atc_output_name(name: str, index: int) -> str:
    """How ATC names an output converted from ONNX: `op:edge:name`."""
    return f"PartitionedCall_{name}_{index}:0:{name}"


def write_om(
    path: Path | str,
    inputs: Sequence[dict],
    outputs: Sequence[dict],
    *,
    gears: Iterable[int] | None = None,
    compute: Sequence[dict] = (),
    weight_size: int = 4096,
    work_size: int = 4096,
    latency_ms: Mapping[str, float] | None = None,
    poison: Mapping[str, Any] | None = None,
    atc_names: bool = True,
) -> Path:
    """Write a stand-in model. Outputs and `compute` use plain names; with `atc_names` the
    file carries ATC-style `op:0:name` output names, as real OM files do."""
    path = Path(path)
    rename = {
        o["name"]: atc_output_name(o["name"], i) if atc_names else o["name"]
        for i, o in enumerate(outputs)
    }
    manifest: dict[str, Any] = {
        "format": "acl-emulator-om",
        "version": 1,
        "inputs": list(inputs),
        "outputs": [dict(o, name=rename[o["name"]]) for o in outputs],
        "weight_size": weight_size,
        "work_size": work_size,
        "compute": [dict(op, output=rename[op["output"]]) for op in compute],
    }
    if gears:
        manifest["dynamic_batch"] = list(gears)
    if latency_ms:
        manifest["latency_ms"] = dict(latency_ms)
    if poison:
        manifest["poison"] = dict(poison)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=1))
    return path


def scale_model(
    path: Path | str,
    *,
    gears: Iterable[int] | None = (4, 1, 8, 2),
    features: int = 4,
    scale: float = 2.0,
    bias: float = 1.0,
    static_batch: int = 0,
    dtype: str = "FP32",
    **kwargs: Any,
) -> Path:
    """INPUT0 [-1, features] -> OUTPUT0 = INPUT0 * scale + bias, OUTPUT1 = row sums.
    Gears unsorted on purpose; `gears=None, static_batch=N` makes a static model of batch N."""
    first = -1 if gears else (static_batch or 1)
    return write_om(
        path,
        inputs=[tensor("INPUT0", dtype, (first, features))],
        outputs=[
            tensor("OUTPUT0", dtype, (first, features)),
            tensor("OUTPUT1", "FP32", (first, 1)),
        ],
        gears=gears,
        compute=[
            {
                "op": "scale_add",
                "inputs": ["INPUT0"],
                "output": "OUTPUT0",
                "scale": scale,
                "bias": bias,
            },
            {"op": "row_sum", "inputs": ["INPUT0"], "output": "OUTPUT1"},
        ],
        **kwargs,
    )


def write_model_repository(
    root: Path | str,
    name: str = "npu_scale",
    *,
    max_batch_size: int | None = None,
    gpus: Sequence[int] = (0,),
    count: int = 1,
    dynamic_batching: bool = True,
    max_queue_delay_us: int = 2000,
    extra_config: str = "",
    om_writer=scale_model,
    **om_kwargs: Any,
) -> Path:
    """<root>/<name>/config.pbtxt (backend "ascend") and <root>/<name>/1/model.om.
    Inputs and outputs are left to auto-complete unless `extra_config` declares them."""
    model_dir = Path(root) / name
    om_writer(model_dir / "1" / "model.om", **om_kwargs)
    lines = [f'name: "{name}"', 'backend: "ascend"']
    if max_batch_size is not None:
        lines.append(f"max_batch_size: {max_batch_size}")
    lines.append(
        f"instance_group [ {{ kind: KIND_GPU, count: {count}, "
        f"gpus: [ {', '.join(str(g) for g in gpus)} ] }} ]"
    )
    if dynamic_batching:
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}")
    if extra_config:
        lines.append(extra_config)
    (model_dir / "config.pbtxt").write_text("\n".join(lines) + "\n")
    return model_dir


def emulator_env(
    base: Mapping[str, str] | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    report_path: Path | str | None = None,
) -> dict[str, str]:
    """Environment for a server subprocess whose `import acl` gets the emulator. `config` is
    the emulator's settings (device_count, memory_bytes, faults=[{fn, ret, count, after}] ...);
    `report_path` makes it write its leak and misuse report there at exit. Unless `config`
    names a `timeline_dir`, a fresh one is made, so the server's executor processes share
    each emulated device (one execution at a time on it, as on a card)."""
    env = dict(os.environ if base is None else base)
    settings = dict(config or {})
    settings.setdefault("timeline_dir", tempfile.mkdtemp(prefix="acl-emu-devices-"))
    env["PYTHONPATH"] = os.pathsep.join(
        [str(EMULATOR_PATH)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["ACL_EMU_CONFIG"] = json.dumps(settings)
    if report_path:
        env["ACL_EMU_REPORT"] = str(report_path)
    return env


# -- the .om kinds people compile --------------------------------------------------------------
def side_input_model(
    path: Path | str,
    *,
    gears: Iterable[int] | None = (1, 2, 4, 8),
    features: int = 4,
    side_dims: Sequence[int] = (1, 3),
    **kwargs: Any,
) -> Path:
    """A detector-style dynamic-batch model: `images` [-1, features] beside a static side input
    `im_info` (e.g. [1, 3], as ATC leaves it). `boxes` = images * im_info[0], `score` = row
    sums of images. Outputs are [-1, ...]; the emulator reports them at the largest gear."""
    return write_om(
        path,
        inputs=[tensor("images", "FP32", (-1, features)), tensor("im_info", "FP32", side_dims)],
        outputs=[tensor("boxes", "FP32", (-1, features)), tensor("score", "FP32", (-1, 1))],
        gears=gears,
        compute=[
            {"op": "scale_by", "inputs": ["images", "im_info"], "output": "boxes", "index": 0},
            {"op": "row_sum", "inputs": ["images"], "output": "score"},
        ],
        **kwargs,
    )


PRIORS = [[float(r), float(r) + 0.5] for r in range(8)]


def static_output_model(
    path: Path | str, *, gears: Iterable[int] | None = (1, 2, 4, 8), **kwargs: Any
) -> Path:
    """A dynamic-batch model with a static output whose first dim equals the largest gear:
    `boxes` [-1, 4] = images + 1 beside `priors` [8, 2], a constant of the model. The desc
    reports both at the largest gear ([8, 4] and [8, 2]); only the per-gear output dims tell
    them apart."""
    return write_om(
        path,
        inputs=[tensor("images", "FP32", (-1, 4))],
        outputs=[tensor("boxes", "FP32", (-1, 4)), tensor("priors", "FP32", (8, 2))],
        gears=gears,
        compute=[
            {"op": "scale_add", "inputs": ["images"], "output": "boxes", "bias": 1.0},
            {"op": "constant", "inputs": [], "output": "priors", "value": PRIORS},
        ],
        **kwargs,
    )


def aipp_model(
    path: Path | str,
    *,
    mode: str = "static",
    height: int = 16,
    width: int = 16,
    fmt: int = 1,
    gears: Iterable[int] | None = (1, 2, 4),
    max_size: Sequence[int] = (16, 16),
    max_src_image_size: int = 0,
    **kwargs: Any,
) -> Path:
    """A classifier compiled with AIPP on input `image` (declared uint8 [n, 3, height, width],
    what the model itself takes). Static AIPP converts a `height` x `width` source image of
    aclAippInputFormat `fmt` (1 = YUV420SP). Dynamic AIPP takes its parameters at run time;
    aipp.cfg's `max_src_image_size` (bytes of the batch's source images) defaults to room for
    RGB888 sources of `max_size` (h, w). `total` is the sum of the pre-processed image (source
    bytes, less mean, times var_reci)."""
    first = -1 if gears else 1
    src = (height, width) if mode == "static" else tuple(max_size)
    aipp: dict[str, Any] = {"mode": mode, "input": "image", "format": fmt, "src": list(src)}
    if max_src_image_size:
        aipp["max_src_image_size"] = max_src_image_size
    return _write_raw(
        path,
        write_om(
            path,
            inputs=[tensor("image", "UINT8", (first, 3, height, width))],
            outputs=[tensor("total", "FP32", (first, 1))],
            gears=gears,
            compute=[{"op": "row_sum", "inputs": ["image"], "output": "total"}],
            **kwargs,
        ),
        aipp=aipp,
    )


def yuv_hw_model(
    path: Path | str,
    *,
    gears: Sequence[Sequence[int]] = ((16, 16), (32, 24)),
    fmt: int = 1,
    **kwargs: Any,
) -> Path:
    """A detector compiled with --dynamic_image_size and static AIPP (aclAippInputFormat `fmt`,
    1 = YUV420SP from DVPP; ATC wants src_image_size 0 there: the source follows the gear).
    `image` [1, 3, -1, -1]; `total` is the sum of the source image's bytes at the gear."""
    return _write_raw(
        path,
        write_om(
            path,
            inputs=[tensor("image", "UINT8", (1, 3, -1, -1))],
            outputs=[tensor("total", "FP32", (1, 1))],
            compute=[{"op": "row_sum", "inputs": ["image"], "output": "total"}],
            **kwargs,
        ),
        dynamic_hw=[list(g) for g in gears],
        aipp={"mode": "static", "input": "image", "format": fmt, "src": [0, 0]},
    )


def hw_model(
    path: Path | str,
    *,
    gears: Sequence[Sequence[int]] = ((16, 16), (32, 24)),
    batch: int = 1,
    stride: int = 4,
    **kwargs: Any,
) -> Path:
    """A YOLO-style model compiled with --dynamic_image_size: `image` [batch, 3, -1, -1];
    `grid` = sums over stride x stride cells (its dims follow the gear), `total` = image sums."""
    return _write_raw(
        path,
        write_om(
            path,
            inputs=[tensor("image", "FP32", (batch, 3, -1, -1))],
            outputs=[
                tensor("grid", "FP32", (batch, 3, -1, -1)),
                tensor("total", "FP32", (batch, 1)),
            ],
            compute=[
                {"op": "pool", "inputs": ["image"], "output": "grid", "stride": stride},
                {"op": "row_sum", "inputs": ["image"], "output": "total"},
            ],
            **kwargs,
        ),
        dynamic_hw=[list(g) for g in gears],
    )


def dims_model(
    path: Path | str, *, gears: Sequence[Sequence[int]] = ((8,), (16,), (32,)), **kwargs: Any
) -> Path:
    """An NLP-style model compiled with --dynamic_dims: `tokens` [1, -1] (float), `echo` is the
    padded input and `total` its sum."""
    return _write_raw(
        path,
        write_om(
            path,
            inputs=[tensor("tokens", "FP32", (1, -1))],
            outputs=[tensor("echo", "FP32", (1, -1)), tensor("total", "FP32", (1, 1))],
            compute=[
                {"op": "identity", "inputs": ["tokens"], "output": "echo"},
                {"op": "row_sum", "inputs": ["tokens"], "output": "total"},
            ],
            **kwargs,
        ),
        dynamic_dims=[list(g) for g in gears],
    )


def dims_pair_model(
    path: Path | str,
    *,
    input_shape: Sequence[str] = ("weights", "tokens"),
    gears: Sequence[Sequence[int]] = ((2, 8), (4, 16)),
    **kwargs: Any,
) -> Path:
    """A --dynamic_dims model whose inputs ATC's --input_shape lists in another order than the
    model's: `tokens` [1, -1], `weights` [-1, 2] and a static `bias` [3] it leaves out
    (`--input_shape="weights:-1,2;tokens:1,-1"`). Each gear's -1 values follow that order, as
    GE's gears do. Outputs: `echo` (tokens), `wsum` (row sums of weights), `bias_out`."""
    return _write_raw(
        path,
        write_om(
            path,
            inputs=[
                tensor("tokens", "FP32", (1, -1)),
                tensor("weights", "FP32", (-1, 2)),
                tensor("bias", "FP32", (3,)),
            ],
            outputs=[
                tensor("echo", "FP32", (1, -1)),
                tensor("wsum", "FP32", (-1, 1)),
                tensor("bias_out", "FP32", (3,)),
            ],
            compute=[
                {"op": "identity", "inputs": ["tokens"], "output": "echo"},
                {"op": "row_sum", "inputs": ["weights"], "output": "wsum"},
                {"op": "identity", "inputs": ["bias"], "output": "bias_out"},
            ],
            **kwargs,
        ),
        dynamic_dims=[list(g) for g in gears],
        input_shape=list(input_shape),
    )


def dims_twin_model(
    path: Path | str,
    *,
    input_shape: Sequence[str] = ("b", "a"),
    gears: Sequence[Sequence[int]] = ((8, 4), (16, 8)),
    **kwargs: Any,
) -> Path:
    """Two inputs of the same dims, `a` and `b` [1, -1], listed b first: the gears fit either
    order with different shapes, so only ATC's --input_shape can say which is which."""
    return _write_raw(
        path,
        write_om(
            path,
            inputs=[tensor("a", "FP32", (1, -1)), tensor("b", "FP32", (1, -1))],
            outputs=[tensor("a_echo", "FP32", (1, -1)), tensor("b_echo", "FP32", (1, -1))],
            compute=[
                {"op": "identity", "inputs": ["a"], "output": "a_echo"},
                {"op": "identity", "inputs": ["b"], "output": "b_echo"},
            ],
            **kwargs,
        ),
        dynamic_dims=[list(g) for g in gears],
        input_shape=list(input_shape),
    )


def _write_raw(path: Path | str, written: Path, **fields: Any) -> Path:
    """Add manifest fields write_om does not know (aipp, dynamic_hw, dynamic_dims, soc, load_ms)."""
    manifest = json.loads(Path(written).read_text())
    manifest.update(fields)
    Path(written).write_text(json.dumps(manifest, indent=1))
    return Path(written)


def with_fields(writer, **fields: Any):
    """An om writer that also sets raw manifest fields (e.g. soc, load_ms)."""

    def write(path: Path | str, **kwargs: Any) -> Path:
        return _write_raw(path, writer(path, **kwargs), **fields)

    return write
