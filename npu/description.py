"""A model desc read into plain data: tensors (names normalised, dims, dtypes, which axis is the
batch), the compiled gears (batch sizes, or image sizes / dims), and the hidden inputs ATC adds.

Which `.om` kinds this understands, and the pyACL calls behind each (names, argument order and
return shapes checked against hicann/runtime python/pyACL/mdl/mdl_wrap.cpp):
- static shapes; `--dynamic_batch_size` (`get_dynamic_batch(desc)` -> ({"batchCount", "batch"},
  ret)), where only the inputs whose first axis is -1 are batched and side inputs such as
  `im_info [1, 3]` keep their own static dims; outputs are reported at the largest gear, so
  here one whose first dim is the largest gear counts as batched, until a loaded copy reads
  each gear's output dims (om_model.py: set_dynamic_batch_size, then get_cur_output_dims);
- `--dynamic_image_size` (`get_dynamic_hw(desc, -1)` -> ({"hwCount", "hw"}, ret)) and
  `--dynamic_dims` (`get_input_dynamic_gear_count(desc, -1)` -> (n, ret),
  `get_input_dynamic_dims(desc, -1, n)` -> ([{"name", "dimCount", "dims"}], ret), each gear being
  the dims of the inputs ATC's --input_shape lists, in its order, concatenated: npu/dims.py);
- static AIPP (`get_input_dims_v2(desc, i)` gives the source-image dims whose product is
  `get_input_size_by_index`, where `get_input_dims` follows the image) and dynamic AIPP (an
  extra `ascend_dynamic_aipp_data` input, hidden like the gear input; the image input reads
  `[N, -1, -1, -1]` from both dims calls, GE's aipp_op.cc CreateAippData, and takes its
  shape from the config's AIPP parameters, npu/aipp.py);
- static AIPP under `--dynamic_image_size`: the v2 dims hold -1 for H and W, and a YUV420SP
  source (v2 channels 1 where get_input_dims shows 3) has 1.5 x H rows (H of Y, H/2 of UV)
  where the gear says H, so its gears are written in that layout (`source_rows`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from backends.base import BackendError
from npu import constants as K
from npu import dims as npu_dims
from npu.errors import unwrap

HIDDEN_INPUTS = (K.DYNAMIC_TENSOR_NAME, K.DYNAMIC_AIPP_NAME)


def normalise_output_name(raw: str) -> str:
    """ATC names outputs `op:edge:name` (from ONNX) or `op:edge` (from TF); keep `name` / `op`."""
    parts = raw.split(":")
    if len(parts) >= 3 and parts[1].isdigit():
        return ":".join(parts[2:])
    if len(parts) == 2 and parts[1].isdigit():
        return parts[0]
    return raw


@dataclass(frozen=True)
class TensorInfo:
    index: int  # position among the model's inputs (hidden inputs counted) or outputs
    name: str  # the name a config uses (outputs normalised)
    raw_name: str  # the name the model reports
    acl_type: K.AclType
    dims: tuple[int, ...]  # -1 on the batch axis when batched, and on dynamic HW / dims axes
    size: int  # bytes the model reports (at the largest gear)
    batched: bool = False  # axis 0 is the batch the gears (or the static batch) count
    aipp: str = ""  # "static" or "dynamic" for an input that AIPP converts
    source_rows: float = 1.0  # source rows per image row on the H axis (YUV420SP: 1.5)

    @property
    def row_dims(self) -> tuple[int, ...]:
        return self.dims[1:]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_dims, dtype=np.int64)) * self.acl_type.numpy.itemsize

    @property
    def static_bytes(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64)) * self.acl_type.numpy.itemsize


@dataclass(frozen=True)
class ModelDescription:
    inputs: tuple[TensorInfo, ...]  # the model's own inputs (hidden ones left out)
    outputs: tuple[TensorInfo, ...]
    gears: tuple[int, ...] = ()  # dynamic batch gears, ascending; empty otherwise
    gear_index: int | None = None  # index of ascend_mbatch_shape_data among the inputs
    num_inputs: int = 0  # as the desc counts them (hidden inputs included)
    shape_kind: str = ""  # "hw" (--dynamic_image_size) or "dims" (--dynamic_dims)
    shape_gears: tuple[tuple[tuple[int, ...], ...], ...] = ()  # per gear, every input's dims
    aipp_index: int | None = None  # index of ascend_dynamic_aipp_data
    static_batch_size: int | None = None  # compiled batch of the batched tensors
    dims_flat: tuple[tuple[int, ...], ...] = ()  # per dims gear, as GE reports and takes it

    @property
    def dynamic(self) -> bool:
        return bool(self.gears)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Batch sizes the device accepts: the gears, or the one compiled batch."""
        if self.gears:
            return self.gears
        return (self.static_batch_size,) if self.static_batch_size else ()

    @property
    def side_inputs(self) -> tuple[TensorInfo, ...]:
        """Inputs without the batch axis in a model that batches (e.g. im_info [1, 3])."""
        return tuple(t for t in self.inputs if not t.batched) if self.batch_sizes else ()

    @property
    def stackable(self) -> bool:
        """Requests can be stacked on axis 0: every output is batched and every side input has
        a leading 1 that can carry one copy per request."""
        return (
            bool(self.batch_sizes)
            and all(t.batched for t in self.outputs)
            and all(t.dims[:1] == (1,) for t in self.side_inputs)
        )

    def gear_names(self) -> str:
        """The compiled gears, as an error message lists them."""
        if self.shape_kind == "hw":
            return ", ".join(f"{h}x{w}" for h, w in self._hw_list())
        if self.shape_kind == "dims":
            return "; ".join(" ".join(str(list(s)) for s in gear) for gear in self.shape_gears)
        return ", ".join(str(g) for g in self.batch_sizes)

    def _hw_list(self) -> list[tuple[int, int]]:
        pairs = []
        for gear in self.shape_gears:
            for tensor, shape in zip(self.inputs, gear, strict=False):
                holes = [i for i, d in enumerate(tensor.dims) if d == -1]
                if len(holes) == 2:
                    pairs.append((image_rows(shape[holes[0]], tensor.source_rows), shape[holes[1]]))
                    break
        return pairs


def image_rows(rows: int, factor: float) -> int:
    """The image's H from the rows of its source (a YUV420SP source has 1.5 x H)."""
    return rows if factor == 1.0 else int(round(rows / factor))


def source_rows(image_h: int, factor: float) -> int:
    """The rows of the source of an image H rows high."""
    return image_h if factor == 1.0 else int(round(image_h * factor))


def _dims(acl: ModuleType, result: tuple, call: str) -> tuple[int, ...]:
    info = unwrap(acl, result, call)
    return tuple(int(d) for d in info["dims"][: info.get("dimCount", len(info["dims"]))])


def _acl_type(acl_dtype: int, what: str) -> K.AclType:
    if acl_dtype not in K.ACL_TYPES:
        raise BackendError(
            f"{what} has aclDataType {acl_dtype}, which the Ascend backend does not support"
        )
    return K.ACL_TYPES[acl_dtype]


def _input_dims(acl: ModuleType, desc: int, i: int) -> tuple[tuple[int, ...], str, float]:
    """(dims whose product is the buffer size, "static" when static AIPP changed them, source
    rows per image row: 1.5 for a YUV420SP source, whose v2 dims show 1 channel where
    get_input_dims shows the image's 3 (CANN docs, aclmdlGetInputDimsV2 table 1))."""
    mdl = acl.mdl
    plain = _dims(acl, mdl.get_input_dims(desc, i), f"acl.mdl.get_input_dims({i})")
    if not hasattr(mdl, "get_input_dims_v2"):  # bindings older than static AIPP support
        return plain, "", 1.0
    v2 = _dims(acl, mdl.get_input_dims_v2(desc, i), f"acl.mdl.get_input_dims_v2({i})")
    if v2 == plain:
        return v2, "", 1.0
    yuv = len(v2) == len(plain) == 4 and v2[3] == 1 and plain[3] == 3
    return v2, "static", 1.5 if yuv else 1.0


def _dynamic_aipp_target(inputs: list[TensorInfo]) -> TensorInfo | None:
    """The input dynamic AIPP feeds: the one GE reports as [N, -1, -1, -1], else the first
    UINT8 input, else the first."""
    shaped = [t for t in inputs if len(t.dims) == 4 and t.dims[1:] == (-1, -1, -1)]
    if shaped:
        return shaped[0]
    return next((t for t in inputs if t.acl_type.acl == 4), inputs[0] if inputs else None)


def _shape_gears(
    acl: ModuleType, desc: int, kind: str, inputs: list[TensorInfo], input_shape: str | None
) -> tuple[tuple[tuple[tuple[int, ...], ...], ...], tuple[tuple[int, ...], ...]]:
    """Every gear as the full dims of each data input, smallest first; with dims gears, also
    each gear as GE reports it (what set_input_dynamic_dims takes back)."""
    mdl = acl.mdl
    gears: list[tuple[tuple[int, ...], ...]] = []
    flats: list[tuple[int, ...]] = []
    if kind == "hw":
        hw = unwrap(acl, mdl.get_dynamic_hw(desc, -1), "acl.mdl.get_dynamic_hw")
        for h, w in hw["hw"][: hw["hwCount"]]:
            gear = []
            for tensor in inputs:
                dims = list(tensor.dims)
                holes = [i for i, d in enumerate(dims) if d == -1]
                if len(holes) == 2:
                    dims[holes[0]] = source_rows(int(h), tensor.source_rows)
                    dims[holes[1]] = int(w)
                gear.append(tuple(dims))
            gears.append(tuple(gear))
    else:
        count = unwrap(
            acl, mdl.get_input_dynamic_gear_count(desc, -1), "acl.mdl.get_input_dynamic_gear_count"
        )
        entries = unwrap(
            acl, mdl.get_input_dynamic_dims(desc, -1, count), "acl.mdl.get_input_dynamic_dims"
        )
        flats = [tuple(int(d) for d in e["dims"][: e["dimCount"]]) for e in entries]
        gears = npu_dims.split([(t.name, t.dims) for t in inputs], flats, input_shape)
    if not flats:
        flats = [()] * len(gears)
    ranked = sorted(
        zip(gears, flats, strict=True), key=lambda p: sum(int(np.prod(s)) for s in p[0])
    )
    return tuple(g for g, _ in ranked), (tuple(f for _, f in ranked) if kind == "dims" else ())


def _static_batch(inputs: list[TensorInfo], outputs: list[TensorInfo]) -> int | None:
    """The compiled batch of a static model: the first dim every tensor shares."""
    firsts = {t.dims[0] if t.dims else None for t in inputs + outputs}
    first = firsts.pop() if len(firsts) == 1 else None
    return first if first is not None and first > 0 else None


def read_description(
    acl: ModuleType, desc: int, input_shape: str | None = None
) -> ModelDescription:
    """Everything the backend needs from a filled model desc. `input_shape` is the config's
    parameter of that name (ATC's --input_shape), for dims gears the gears cannot place."""
    mdl = acl.mdl
    num_inputs, num_outputs = mdl.get_num_inputs(desc), mdl.get_num_outputs(desc)
    # Scan the names for the hidden inputs (asking by name logs an error when one is absent).
    names = [mdl.get_input_name_by_index(desc, i) for i in range(num_inputs)]
    gear_index = names.index(K.DYNAMIC_TENSOR_NAME) if K.DYNAMIC_TENSOR_NAME in names else None
    aipp_index = names.index(K.DYNAMIC_AIPP_NAME) if K.DYNAMIC_AIPP_NAME in names else None
    gears: tuple[int, ...] = ()
    kind = ""
    if gear_index is not None:
        batch = unwrap(acl, mdl.get_dynamic_batch(desc), "acl.mdl.get_dynamic_batch")
        gears = tuple(sorted({int(g) for g in batch["batch"][: batch["batchCount"]]}))
        if not gears:
            hw = unwrap(acl, mdl.get_dynamic_hw(desc, -1), "acl.mdl.get_dynamic_hw")
            kind = "hw" if hw["hwCount"] else "dims"
    top = max(gears, default=0)
    read = {
        i: _input_dims(acl, desc, i) for i, name in enumerate(names) if name not in HIDDEN_INPUTS
    }
    # GE reports a dynamic-batch input at -1 (its ATTR_MBATCH_ORIGIN_INPUT_DIMS) and a static
    # side input at its own dims, so -1 alone says batched. Only a binding that shows no -1 at
    # all (inputs at the largest gear) leaves the guess that a first dim equal to it is the batch.
    shows_minus = any(d[:1] == (-1,) for d, _, _ in read.values())
    inputs: list[TensorInfo] = []
    for i, (dims, aipp, rows) in read.items():
        name = names[i]
        acl_type = _acl_type(mdl.get_input_data_type(desc, i), f"input '{name}'")
        batched = bool(gears) and bool(dims) and dims[0] in ((-1,) if shows_minus else (top,))
        if batched:
            dims = (-1,) + dims[1:]
        size = mdl.get_input_size_by_index(desc, i)
        inputs.append(TensorInfo(i, name, name, acl_type, dims, size, batched, aipp, rows))
    if aipp_index is not None:
        if kind:
            raise BackendError(
                "dynamic AIPP in a model compiled with --dynamic_image_size or --dynamic_dims "
                "is not supported (use static AIPP, or dynamic AIPP with --dynamic_batch_size)"
            )
        target = _dynamic_aipp_target(inputs)
        inputs = [dataclasses.replace(t, aipp="dynamic") if t is target else t for t in inputs]
    raw_outputs = [mdl.get_output_name_by_index(desc, i) for i in range(num_outputs)]
    short = [normalise_output_name(n) for n in raw_outputs]
    outputs: list[TensorInfo] = []
    for i, raw in enumerate(raw_outputs):
        name = short[i] if short.count(short[i]) == 1 else raw  # keep raw names on a clash
        dims = _dims(acl, mdl.get_output_dims(desc, i), f"acl.mdl.get_output_dims({i})")
        if kind:  # reported at the largest gear; each execution's come from get_cur_output_dims
            dims = (-1,) * len(dims)
        batched = bool(gears) and bool(dims) and dims[0] in (-1, top)
        if batched:
            dims = (-1,) + dims[1:]
        outputs.append(
            TensorInfo(
                i,
                name,
                raw,
                _acl_type(mdl.get_output_data_type(desc, i), f"output '{name}'"),
                dims,
                mdl.get_output_size_by_index(desc, i),
                batched,
            )
        )
    shape_gears, dims_flat = (
        _shape_gears(acl, desc, kind, inputs, input_shape) if kind else ((), ())
    )
    static = None
    if not gears:
        static = _static_batch(inputs, [] if kind else outputs)
        if static and kind and any(-1 in t.dims[:1] for t in inputs):
            static = None  # dims gears vary axis 0 itself: served unbatched
        if static:
            inputs = [dataclasses.replace(t, batched=True) for t in inputs]
            outputs = [dataclasses.replace(t, batched=True) for t in outputs]
    elif not any(t.batched for t in inputs):
        raise BackendError("a dynamic-batch model without an input whose first axis is -1")
    if not kind:
        for tensor in inputs + outputs:
            rest = tensor.dims[1:] if tensor.batched else tensor.dims
            if tensor.aipp == "dynamic":
                continue  # its H, W and C come from the AIPP parameters (npu/aipp.py)
            if any(d < 0 for d in rest):
                raise BackendError(
                    f"tensor '{tensor.raw_name}' has dynamic dims "
                    f"{list(tensor.dims)} but the model has no gears for them"
                )
    return ModelDescription(
        tuple(inputs),
        tuple(outputs),
        gears,
        gear_index,
        num_inputs,
        kind,
        shape_gears,
        aipp_index,
        static,
        dims_flat=dims_flat,
    )
