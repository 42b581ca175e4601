"""The stand-in `.om` file: a JSON manifest instead of a compiled graph.

Format (written by tests/support/om_fixtures.py, read here)::

    {"format": "acl-emulator-om", "version": 1,
     "inputs":  [{"name": "x", "dtype": 0, "format": 2, "dims": [-1, 4]}],
     "outputs": [{"name": "Mul_3:0:y", "dtype": 0, "format": 2, "dims": [-1, 4]}],
     "dynamic_batch": [4, 1, 8],            # optional gears, unsorted on purpose
     "dynamic_hw": [[32, 32], [64, 48]],    # or: --dynamic_image_size gears (h, w)
     "dynamic_dims": [[1, 16], [4, 32]],    # or: --dynamic_dims, the -1 axes' values per gear
     "input_shape": ["y", "x"],             # the inputs ATC's --input_shape lists, in its order
     "aipp": {"mode": "static" | "dynamic", "input": "x", "format": 1, "src": [h, w],
              "max_src_image_size": 1536},  # dynamic: bytes of the batch's source images
     "soc": "Ascend310P3",                   # the --soc_version it was compiled for
     "load_ms": 0,                           # how long load_from_file takes
     "weight_size": 4096, "work_size": 4096, # charged to device memory at load
     "compute": [{"op": "scale_add", "inputs": ["x"], "output": "Mul_3:0:y",
                  "scale": 2.0, "bias": 1.0}],
     "latency_ms": {"fixed": 0, "per_sample": 0},
     "poison": {"value": -7.0, "code": 507011}}  # an input holding `value` fails execute
                                            # ({"value": v, "hang": true}: it never finishes)

`dtype` and `format` are aclDataType / aclFormat numbers. A dynamic-batch model has -1 as the
first dimension of its batched tensors (at least one input, as ATC demands: E10031); other
tensors (side inputs such as `im_info`) keep their static dims. With dynamic HW or dims the
inputs carry -1 on their dynamic axes and outputs take whatever shape the compute gives at the
gear. With dynamic dims, GE concatenates each gear over the inputs `--input_shape` lists and in
its order (the model's user_designate_shape_order; default: every input in model order), and
the -1 values of a gear follow that order too. An AIPP input is seen by the compute as float32
[n, source bytes]: the emulated AIPP subtracts channel-0 mean and multiplies by channel-0
var_reci (dynamic AIPP) byte by byte.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import _codes as C
from ._runtime import AclFail

FORMAT_TAG = "acl-emulator-om"
ND = 2


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: int
    fmt: int
    dims: tuple[int, ...]

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(C.DTYPES[self.dtype])

    @property
    def batched(self) -> bool:
        return bool(self.dims) and self.dims[0] == -1

    def shape(self, batch: int | None) -> tuple[int, ...]:
        return (batch,) + self.dims[1:] if batch is not None and self.batched else self.dims

    def nbytes(self, batch: int | None) -> int:
        return int(np.prod(self.shape(batch), dtype=np.int64)) * self.np_dtype.itemsize


# aclAippInputFormat -> (height factor, channels) of the source image as get_input_dims_v2
# shows it (CANN docs, aclmdlGetInputDimsV2 table 1), and the channels get_input_dims shows.
AIPP_SOURCE = {1: (1.5, 1, 3), 2: (1, 4, 4), 3: (1, 3, 3), 4: (1, 1, 1)}


@dataclass(frozen=True)
class Aipp:
    """The AIPP an input was compiled with. Static: `src` is the source image size compiled in,
    (0, 0) with --dynamic_image_size (ATC demands it: the source follows the gear). Dynamic:
    `max_src` is aipp.cfg's max_src_image_size, the bytes of all the batch's source images
    together, which is what GE gives the input's buffer (`src` is then only the largest source
    image the fixture was written for)."""

    mode: str  # "static" or "dynamic"
    input: str
    fmt: int = 1
    src: tuple[int, int] = (0, 0)  # (h, w)
    max_src: int = 0  # max_src_image_size (dynamic)

    def v2_dims(
        self, batch: int, fmt: int | None = None, src: tuple[int, int] | None = None
    ) -> tuple[int, ...]:
        factor, channels, _ = AIPP_SOURCE[fmt or self.fmt]
        h, w = src or self.src
        return (batch, int(h * factor), w, channels)

    def hw_dims(self, batch: int, v2: bool) -> tuple[int, ...]:
        """A static AIPP input of a --dynamic_image_size model: H and W at -1; get_input_dims
        shows the image's channels, get_input_dims_v2 the source's (YUV420SP: 1, its H being
        1.5x the gear's, which the dims cannot show) [GE: ATTR_NAME_INPUT_DIMS with -1 where the
        origin dims have it, insert_aipp_op_util.cc SetModelInputDims]."""
        _, v2_channels, channels = AIPP_SOURCE[self.fmt]
        return (batch, -1, -1, v2_channels if v2 else channels)

    def source_bytes(
        self, batch: int, fmt: int | None = None, src: tuple[int, int] | None = None
    ) -> int:
        return int(np.prod(self.v2_dims(batch, fmt, src)))


@dataclass(frozen=True)
class OmSpec:
    path: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    gears: tuple[int, ...]  # as compiled (unsorted); empty for a static model
    weight_size: int
    work_size: int
    compute: tuple[dict, ...]
    latency_fixed_s: float
    latency_per_sample_s: float
    poison: dict | None
    hw_gears: tuple[tuple[int, int], ...] = ()
    dims_gears: tuple[tuple[int, ...], ...] = ()  # values of the -1 axes, per gear
    aipp: Aipp | None = None
    soc: str = ""
    load_s: float = 0.0
    shape_order: tuple[str, ...] = ()  # ATC's --input_shape names, in order (empty: all inputs)
    _max_outputs: dict = field(default_factory=dict, compare=False)

    @property
    def dynamic(self) -> bool:
        return bool(self.gears)

    @property
    def shape_dynamic(self) -> bool:
        return bool(self.hw_gears or self.dims_gears)

    @property
    def gear_tensor_len(self) -> int:
        if self.gears:
            return 1
        if self.hw_gears:
            return 2
        return len(self.dims_gears[0]) if self.dims_gears else 0

    @property
    def max_gear(self) -> int | None:
        return max(self.gears) if self.gears else None

    def desc_inputs(self) -> tuple[TensorSpec, ...]:
        """Inputs as the desc shows them: the gear tensor (INT32 [k], as GE creates it) and the
        dynamic AIPP data are extra inputs after the model's own."""
        extra: tuple[TensorSpec, ...] = ()
        if self.gear_tensor_len:
            extra += (TensorSpec(C.DYNAMIC_TENSOR_NAME, 3, ND, (self.gear_tensor_len,)),)
        if self.aipp is not None and self.aipp.mode == "dynamic":
            extra += (TensorSpec(C.DYNAMIC_AIPP_NAME, 4, ND, (C.AIPP_DATA_SIZE,)),)
        return self.inputs + extra

    def listed_inputs(self) -> tuple[TensorSpec, ...]:
        """The inputs a dims gear covers, in GE's order: those --input_shape lists, as listed."""
        if not self.shape_order:
            return self.inputs
        by_name = {t.name: t for t in self.inputs}
        return tuple(by_name[name] for name in self.shape_order)

    def gear_shapes(self, gear: Any) -> dict[str, tuple[int, ...]]:
        """Each data input's shape at a shape gear: (h, w) or a dims tuple."""
        shapes: dict[str, tuple[int, ...]] = {}
        if self.hw_gears:
            for t in self.inputs:
                dims = list(t.dims)
                holes = [i for i, d in enumerate(dims) if d == -1]
                for axis, value in zip(holes, gear, strict=False):
                    dims[axis] = value
                shapes[t.name] = tuple(dims)
        else:
            shapes = {t.name: t.dims for t in self.inputs}
            values = iter(gear)
            for t in self.listed_inputs():
                shapes[t.name] = tuple(next(values) if d == -1 else d for d in t.dims)
        return shapes

    def full_dims_gears(self) -> list[list[int]]:
        """The dims gears as aclmdlGetInputDynamicDims gives them: the dims of the inputs
        --input_shape lists, in its order, in a row (model_om2.cpp: over dataNameOrder)."""
        return [
            [d for t in self.listed_inputs() for d in self.gear_shapes(g)[t.name]]
            for g in self.dims_gears
        ]

    def aipp_source(self, gear: Any = None) -> tuple[int, int] | None:
        """The (h, w) of a static AIPP source image at an image-size gear (the gear's own size),
        None where the compiled-in size holds."""
        if self.aipp is not None and self.aipp.mode == "static" and self.hw_gears:
            return tuple(gear or self.max_shape_gear())
        return None

    def model_hw(self) -> tuple[int, int, int]:
        """(N, H, W) the AIPP input feeds the model (NCHW as declared; N at the largest gear):
        what GE compares the dynamic AIPP output with at set_input_aipp."""
        dims = next(t for t in self.inputs if self.aipp and t.name == self.aipp.input).dims
        n = self.max_gear if dims[0] == -1 and self.max_gear else dims[0]
        return n, dims[2], dims[3]

    def all_data_dims(self) -> list[int]:
        """The listed inputs' dims with -1, concatenated (GE's all_data_dims)."""
        return [d for t in self.listed_inputs() for d in t.dims]

    def max_shape_gear(self) -> Any:
        gears = self.hw_gears or self.dims_gears
        return max(gears, key=lambda g: int(np.prod(g))) if gears else None


def _tensor(raw: Any, path: str) -> TensorSpec:
    try:
        spec = TensorSpec(
            str(raw["name"]),
            int(raw["dtype"]),
            int(raw.get("format", ND)),
            tuple(int(d) for d in raw["dims"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise AclFail(C.GE_PARAM_INVALID, f"{path}: bad tensor entry {raw!r}: {exc}") from None
    if spec.dtype not in C.DTYPES:
        raise AclFail(C.GE_PARAM_INVALID, f"{path}: unsupported dtype {spec.dtype}")
    if not all(d > 0 or d == -1 for d in spec.dims):
        raise AclFail(C.GE_PARAM_INVALID, f"{path}: tensor {spec.name} has dims {list(spec.dims)}")
    return spec


def _check_dynamic(
    path: str,
    gears: tuple,
    hw: tuple,
    dims: tuple,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    order: tuple[str, ...] = (),
) -> None:
    if sum(1 for kind in (gears, hw, dims) if kind) > 1:
        raise AclFail(
            C.GE_PARAM_INVALID, f"{path}: dynamic batch, image size and dims exclude each other"
        )
    holes = [d for t in inputs for d in t.dims[1 if gears else 0 :] if d == -1]
    if gears:
        if len(gears) < 2 or min(gears) <= 0 or len(set(gears)) != len(gears):
            raise AclFail(C.GE_PARAM_INVALID, f"{path}: bad dynamic_batch gears {list(gears)}")
        if not any(t.batched for t in inputs) or holes:
            raise AclFail(
                C.GE_PARAM_INVALID,
                f"{path}: E10031: with --dynamic_batch_size one "
                "input must have -1 as its first axis, and only there",
            )
        if any(d == -1 for t in outputs for d in t.dims[1:]):
            raise AclFail(C.GE_PARAM_INVALID, f"{path}: an output has -1 past its batch axis")
    elif hw:
        if any(sum(1 for d in t.dims if d == -1) not in (0, 2) for t in inputs) or not holes:
            raise AclFail(C.GE_PARAM_INVALID, f"{path}: dynamic image size needs H and W at -1")
    elif dims:
        names = [t.name for t in inputs]
        if order and (len(set(order)) != len(order) or any(n not in names for n in order)):
            raise AclFail(C.GE_PARAM_INVALID, f"{path}: input_shape {list(order)} vs {names}")
        unlisted = [t for t in inputs if order and t.name not in order and -1 in t.dims]
        if unlisted:
            raise AclFail(
                C.GE_PARAM_INVALID, f"{path}: input {unlisted[0].name} has -1 but is not listed"
            )
        if any(len(g) != len(holes) for g in dims) or not holes:
            raise AclFail(
                C.GE_PARAM_INVALID, f"{path}: each dynamic_dims gear needs {len(holes)} values"
            )
    elif holes or any(-1 in t.dims for t in outputs):
        raise AclFail(C.GE_PARAM_INVALID, f"{path}: -1 dims in a static model")


def parse(path: str) -> OmSpec:
    if not os.path.isfile(path):
        raise AclFail(C.GE_EXEC_MODEL_PATH_INVALID, f"model file {path} does not exist")
    try:
        with open(path, "rb") as handle:
            raw = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise AclFail(C.GE_PARAM_INVALID, f"{path} is not a valid om file: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_TAG:
        raise AclFail(C.GE_PARAM_INVALID, f"{path} is not a valid om file (bad header)")
    gears = tuple(int(g) for g in raw.get("dynamic_batch", ()))
    hw = tuple((int(h), int(w)) for h, w in raw.get("dynamic_hw", ()))
    dims = tuple(tuple(int(d) for d in g) for g in raw.get("dynamic_dims", ()))
    inputs = tuple(_tensor(t, path) for t in raw.get("inputs", []))
    outputs = tuple(_tensor(t, path) for t in raw.get("outputs", []))
    order = tuple(str(n) for n in raw.get("input_shape", ()))
    _check_dynamic(path, gears, hw, dims, inputs, outputs, order)
    aipp = None
    if raw.get("aipp"):
        a = raw["aipp"]
        aipp = Aipp(
            str(a["mode"]),
            str(a["input"]),
            int(a.get("format", 1)),
            tuple(int(v) for v in a.get("src", (0, 0))),
            int(a.get("max_src_image_size", 0)),
        )
        if aipp.input not in {t.name for t in inputs} or aipp.fmt not in AIPP_SOURCE:
            raise AclFail(C.GE_PARAM_INVALID, f"{path}: bad aipp section {a!r}")
        if aipp.mode == "dynamic" and aipp.max_src <= 0:  # ATC refuses such an aipp.cfg
            n = max(gears) if gears else next(t for t in inputs if t.name == aipp.input).dims[0]
            aipp = replace(aipp, max_src=aipp.source_bytes(n, 3))  # room for RGB888 at src
        if aipp.mode == "static" and hw and aipp.src != (0, 0):
            raise AclFail(
                C.GE_PARAM_INVALID,
                f"{path}: E10052: when --dynamic_image_size is set, src_image_size_w and "
                "src_image_size_h must be set to '0'",
            )
    latency = raw.get("latency_ms", {})
    return OmSpec(
        path=path,
        inputs=inputs,
        outputs=outputs,
        gears=gears,
        weight_size=int(raw.get("weight_size", 0)),
        work_size=int(raw.get("work_size", 0)),
        compute=tuple(raw.get("compute", ())),
        latency_fixed_s=float(latency.get("fixed", 0.0)) / 1000.0,
        latency_per_sample_s=float(latency.get("per_sample", 0.0)) / 1000.0,
        poison=raw.get("poison"),
        hw_gears=hw,
        dims_gears=dims,
        aipp=aipp,
        soc=str(raw.get("soc", "")),
        load_s=float(raw.get("load_ms", 0.0)) / 1000.0,
        shape_order=order,
    )


# -- compute: named numpy operations, enough to check routing, padding and dtypes -------------
def _identity(args: list[np.ndarray], op: dict) -> np.ndarray:
    return args[0]


def _scale_add(args: list[np.ndarray], op: dict) -> np.ndarray:
    return args[0] * op.get("scale", 1.0) + op.get("bias", 0.0)


def _add(args: list[np.ndarray], op: dict) -> np.ndarray:
    return args[0] + args[1]


def _matmul(args: list[np.ndarray], op: dict) -> np.ndarray:
    weight = np.asarray(op["weight"], dtype=np.float64)
    return args[0] @ weight + np.asarray(op.get("bias", 0.0))


def _row_sum(args: list[np.ndarray], op: dict) -> np.ndarray:
    return args[0].reshape(args[0].shape[0], -1).sum(axis=1, keepdims=True)


def _scale_by(args: list[np.ndarray], op: dict) -> np.ndarray:
    """x * side[..., k]: a batched input scaled by one value of a static side input."""
    factor = float(args[1].reshape(-1)[int(op.get("index", 0))])
    return args[0] * factor


def _pool(args: list[np.ndarray], op: dict) -> np.ndarray:
    """Sum over the last two axes keeping them as 1/stride of their size: output dims follow
    the gear, as a detector's grid does."""
    x, stride = args[0], int(op.get("stride", 4))
    *lead, h, w = x.shape
    trimmed = x[..., : h // stride * stride, : w // stride * stride]
    return trimmed.reshape(*lead, h // stride, stride, w // stride, stride).sum(axis=(-1, -3))


def _constant(args: list[np.ndarray], op: dict) -> np.ndarray:
    """A value compiled into the model (anchors, priors): the same at every gear."""
    return np.asarray(op["value"], dtype=np.float64)


OPS: dict[str, Callable[[list[np.ndarray], dict], np.ndarray]] = {
    "constant": _constant,
    "identity": _identity,
    "scale_add": _scale_add,
    "add": _add,
    "matmul": _matmul,
    "row_sum": _row_sum,
    "scale_by": _scale_by,
    "pool": _pool,
}


def run(
    spec: OmSpec, inputs: dict[str, np.ndarray], batch: int | None, free_shapes: bool = False
) -> dict[str, np.ndarray]:
    """Outputs for one execution, cast and shaped as the model's outputs at this batch (or, for
    dynamic HW / dims, whatever shape the compute gives)."""
    ops = spec.compute or tuple(
        {"op": "identity", "inputs": [i.name], "output": o.name}
        for i, o in zip(spec.inputs, spec.outputs, strict=False)
    )
    results: dict[str, np.ndarray] = {}
    for op in ops:
        fn = OPS.get(op.get("op", ""))
        if fn is None:
            raise AclFail(C.RT_MODEL_EXECUTE, f"unknown emulated op {op.get('op')!r}")
        results[op["output"]] = fn([inputs[name] for name in op["inputs"]], op)
    outputs = {}
    for out in spec.outputs:
        value = results.get(out.name)
        if value is None:
            raise AclFail(C.RT_MODEL_EXECUTE, f"emulated compute gave no value for {out.name}")
        shape = np.shape(value) if free_shapes else out.shape(batch)
        if int(np.prod(np.shape(value))) != int(np.prod(shape)):
            raise AclFail(
                C.RT_MODEL_EXECUTE, f"emulated compute gave no fitting value for {out.name}"
            )
        outputs[out.name] = np.asarray(value).astype(out.np_dtype).reshape(shape)
    return outputs


def max_output_shapes(spec: OmSpec) -> dict[str, tuple[int, ...]]:
    """Output dims at the largest shape gear (what the desc reports for dynamic HW / dims)."""
    if not spec._max_outputs:
        shapes = spec.gear_shapes(spec.max_shape_gear())
        zeros = {t.name: np.zeros(shapes[t.name], dtype=np.float64) for t in spec.inputs}
        if spec.aipp is not None:
            n = shapes[spec.aipp.input][0]
            src = spec.aipp_source(spec.max_shape_gear())
            zeros[spec.aipp.input] = np.zeros((n, spec.aipp.source_bytes(1, src=src)))
        for name, value in run(spec, zeros, None, free_shapes=True).items():
            spec._max_outputs[name] = value.shape
    return spec._max_outputs


def hangs(spec: OmSpec, inputs: dict[str, np.ndarray]) -> bool:
    """A hang poison: the execution never finishes (a hung device), holding its device. Only
    work queued on a stream hangs (what the backend runs); a synchronous execute, which would
    hang holding the GIL, computes as if unpoisoned."""
    if not spec.poison or not spec.poison.get("hang"):
        return False
    value = spec.poison["value"]
    return any(np.any(array == value) for array in inputs.values())


def poisoned(spec: OmSpec, inputs: dict[str, np.ndarray]) -> int | None:
    if not spec.poison or spec.poison.get("hang"):
        return None
    value = spec.poison["value"]
    if any(np.any(array == value) for array in inputs.values()):
        return int(spec.poison.get("code", C.RT_MODEL_EXECUTE))
    return None
