"""The stand-in `.om` file: a JSON manifest instead of a compiled graph.

Format (written by tests/npu/om_fixtures.py, read here)::

    {"format": "acl-emulator-om", "version": 1,
     "inputs":  [{"name": "x", "dtype": 0, "format": 2, "dims": [-1, 4]}],
     "outputs": [{"name": "Mul_3:0:y", "dtype": 0, "format": 2, "dims": [-1, 4]}],
     "dynamic_batch": [4, 1, 8],            # optional gears, unsorted on purpose
     "weight_size": 4096, "work_size": 4096, # charged to device memory at load
     "compute": [{"op": "scale_add", "inputs": ["x"], "output": "Mul_3:0:y",
                  "scale": 2.0, "bias": 1.0}],
     "latency_ms": {"fixed": 0, "per_sample": 0},
     "poison": {"value": -7.0, "code": 507011}}  # an input holding `value` fails execute

`dtype` and `format` are aclDataType / aclFormat numbers. With `dynamic_batch`, every input
and output has -1 as its first dimension; without it every dimension is fixed.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

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

    def shape(self, batch: Optional[int]) -> tuple[int, ...]:
        return (batch,) + self.dims[1:] if batch is not None else self.dims

    def nbytes(self, batch: Optional[int]) -> int:
        return int(np.prod(self.shape(batch), dtype=np.int64)) * self.np_dtype.itemsize


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
    poison: Optional[dict]

    @property
    def dynamic(self) -> bool:
        return bool(self.gears)

    @property
    def max_gear(self) -> Optional[int]:
        return max(self.gears) if self.gears else None

    def desc_inputs(self) -> tuple[TensorSpec, ...]:
        """Inputs as the desc shows them: the gear tensor is an extra, last input."""
        if not self.dynamic:
            return self.inputs
        return self.inputs + (TensorSpec(C.DYNAMIC_TENSOR_NAME, 9, ND, (1,)),)


def _tensor(raw: Any, dynamic: bool, path: str) -> TensorSpec:
    try:
        spec = TensorSpec(str(raw["name"]), int(raw["dtype"]), int(raw.get("format", ND)),
                          tuple(int(d) for d in raw["dims"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise AclFail(C.GE_PARAM_INVALID, f"{path}: bad tensor entry {raw!r}: {exc}") from None
    if spec.dtype not in C.DTYPES:
        raise AclFail(C.GE_PARAM_INVALID, f"{path}: unsupported dtype {spec.dtype}")
    if dynamic:
        ok = spec.dims and spec.dims[0] == -1 and all(d > 0 for d in spec.dims[1:])
    else:
        ok = all(d > 0 for d in spec.dims)
    if not ok:
        raise AclFail(C.GE_PARAM_INVALID, f"{path}: tensor {spec.name} has dims {list(spec.dims)}")
    return spec


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
    if gears and (len(gears) < 2 or min(gears) <= 0 or len(set(gears)) != len(gears)):
        raise AclFail(C.GE_PARAM_INVALID, f"{path}: bad dynamic_batch gears {list(gears)}")
    latency = raw.get("latency_ms", {})
    return OmSpec(
        path=path,
        inputs=tuple(_tensor(t, bool(gears), path) for t in raw.get("inputs", [])),
        outputs=tuple(_tensor(t, bool(gears), path) for t in raw.get("outputs", [])),
        gears=gears,
        weight_size=int(raw.get("weight_size", 0)),
        work_size=int(raw.get("work_size", 0)),
        compute=tuple(raw.get("compute", ())),
        latency_fixed_s=float(latency.get("fixed", 0.0)) / 1000.0,
        latency_per_sample_s=float(latency.get("per_sample", 0.0)) / 1000.0,
        poison=raw.get("poison"),
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


OPS: dict[str, Callable[[list[np.ndarray], dict], np.ndarray]] = {
    "identity": _identity, "scale_add": _scale_add, "add": _add, "matmul": _matmul,
    "row_sum": _row_sum,
}


def run(spec: OmSpec, inputs: dict[str, np.ndarray], batch: Optional[int]) -> dict[str, np.ndarray]:
    """Outputs for one execution, cast and shaped as the model's outputs at this batch."""
    ops = spec.compute or tuple(
        {"op": "identity", "inputs": [i.name], "output": o.name}
        for i, o in zip(spec.inputs, spec.outputs))
    results: dict[str, np.ndarray] = {}
    for op in ops:
        fn = OPS.get(op.get("op", ""))
        if fn is None:
            raise AclFail(C.RT_MODEL_EXECUTE, f"unknown emulated op {op.get('op')!r}")
        results[op["output"]] = fn([inputs[name] for name in op["inputs"]], op)
    outputs = {}
    for out in spec.outputs:
        value = results.get(out.name)
        shape = out.shape(batch)
        if value is None or int(np.prod(np.shape(value))) != int(np.prod(shape)):
            raise AclFail(C.RT_MODEL_EXECUTE, f"emulated compute gave no fitting value for {out.name}")
        outputs[out.name] = np.asarray(value).astype(out.np_dtype).reshape(shape)
    return outputs


def poisoned(spec: OmSpec, inputs: dict[str, np.ndarray]) -> Optional[int]:
    if not spec.poison:
        return None
    value = spec.poison["value"]
    if any(np.any(array == value) for array in inputs.values()):
        return int(spec.poison.get("code", C.RT_MODEL_EXECUTE))
    return None
