"""acl.mdl's AIPP calls: the aclmdlAIPP parameter set of a dynamic-AIPP model, written into the
`ascend_dynamic_aipp_data` input by set_input_aipp, and the AIPP type of an input.

Argument formats and returns as the binding has them (hicann/runtime python/pyACL/mdl/
mdl_wrap.cpp): create_aipp("K") -> handle (0 on failure), set_aipp_input_format("kI"),
set_aipp_src_image_size("kii": w, h), set_aipp_csc_params("kbhhhhhhhhhBBBBBB"),
set_aipp_rbuv_swap_switch / ax_swap_switch("kb"), crop / padding ("kbiiiiK"),
dtc_pixel_mean("khhhhK"), dtc_pixel_min / pixel_var_reci ("kffffK"),
set_input_aipp("Ikkk"), destroy_aipp("k"), get_aipp_type("Ik") -> (type, attached, ret).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _codes as C
from . import _om
from ._runtime import RT, AclFail, entry, ret_only

MAGIC = 0x41495050  # "AIPP": marks a parameter block that set_input_aipp wrote
WITHOUT_AIPP, STATIC_AIPP, DYNAMIC_AIPP, DYNAMIC_AIPP_NODE = 0, 1, 2, 3


@dataclass(eq=False)
class AippSet:
    handle: int
    batch: int
    fmt: int = 0
    src: tuple[int, int] = (0, 0)  # (w, h), as set_aipp_src_image_size takes them
    mean: dict = field(default_factory=dict)  # batch index -> 4 channel values
    minimum: dict = field(default_factory=dict)
    var_reci: dict = field(default_factory=dict)
    csc: tuple | None = None
    crop: dict = field(default_factory=dict)  # batch index -> (switch, start w, start h, w, h)
    padding: dict = field(default_factory=dict)  # batch index -> (switch, top, bottom, l, r)

    def output_hw(self, image: int = 0) -> tuple[int, int]:
        """(w, h) the AIPP hands the model: the source, cropped, then padded (GE
        aipp_param_check.cpp GetAippOutputHW; scf resizing is not emulated)."""
        w, h = self.src
        crop = self.crop.get(image)
        if crop and crop[0]:
            w, h = crop[3], crop[4]
        pad = self.padding.get(image)
        if pad and pad[0]:
            w, h = w + pad[3] + pad[4], h + pad[1] + pad[2]
        return w, h


def _aipp(handle: int) -> AippSet:
    return RT.find(RT.aipps, handle, "aipp set")


def _batch_index(found: AippSet, index: int) -> None:
    if not 0 <= index < found.batch:
        raise AclFail(
            C.INVALID_PARAM, f"batch index {index} outside the aipp set's batch {found.batch}"
        )


@entry("mdl.create_aipp", "K")
def create_aipp(batch: int) -> int:
    with RT.lock:
        if batch <= 0:
            return 0
        found = AippSet(RT.new_handle("aipp"), batch)
        RT.aipps[found.handle] = found
        return found.handle


@entry("mdl.destroy_aipp", "k", ret_only)
def destroy_aipp(handle: int) -> int:
    with RT.lock:
        _aipp(handle)
        del RT.aipps[handle]
        RT.retired.add(handle)
        return C.SUCCESS


@entry("mdl.set_aipp_input_format", "kI", ret_only)
def set_aipp_input_format(handle: int, fmt: int) -> int:
    with RT.lock:
        found = _aipp(handle)
        if fmt not in _om.AIPP_SOURCE:  # dynamic AIPP takes formats 1-4 only
            raise AclFail(C.INVALID_PARAM, f"aipp input format {fmt} is not supported")
        found.fmt = fmt
        return C.SUCCESS


@entry("mdl.set_aipp_src_image_size", "kii", ret_only)
def set_aipp_src_image_size(handle: int, width: int, height: int) -> int:
    with RT.lock:
        found = _aipp(handle)
        if width <= 0 or height <= 0:
            raise AclFail(C.INVALID_PARAM, f"source image size {width}x{height}")
        found.src = (width, height)
        return C.SUCCESS


@entry("mdl.set_aipp_csc_params", "kbhhhhhhhhhBBBBBB", ret_only)
def set_aipp_csc_params(handle: int, *values: int) -> int:
    with RT.lock:
        _aipp(handle).csc = tuple(values)
        return C.SUCCESS


@entry("mdl.set_aipp_rbuv_swap_switch", "kb", ret_only)
def set_aipp_rbuv_swap_switch(handle: int, switch: int) -> int:
    with RT.lock:
        _aipp(handle)
        return C.SUCCESS


@entry("mdl.set_aipp_ax_swap_switch", "kb", ret_only)
def set_aipp_ax_swap_switch(handle: int, switch: int) -> int:
    with RT.lock:
        _aipp(handle)
        return C.SUCCESS


@entry("mdl.set_aipp_crop_params", "kbiiiiK", ret_only)
def set_aipp_crop_params(
    handle: int, switch: int, start_w: int, start_h: int, width: int, height: int, batch_index: int
) -> int:
    with RT.lock:
        found = _aipp(handle)
        _batch_index(found, batch_index)
        found.crop[batch_index] = (switch, start_w, start_h, width, height)
        return C.SUCCESS


@entry("mdl.set_aipp_padding_params", "kbiiiiK", ret_only)
def set_aipp_padding_params(
    handle: int, switch: int, top: int, bottom: int, left: int, right: int, batch_index: int
) -> int:
    with RT.lock:
        found = _aipp(handle)
        _batch_index(found, batch_index)
        found.padding[batch_index] = (switch, top, bottom, left, right)
        return C.SUCCESS


def _channels(name: str, handle: int, values: tuple, batch_index: int) -> int:
    with RT.lock:
        found = _aipp(handle)
        _batch_index(found, batch_index)
        getattr(found, name)[batch_index] = tuple(float(v) for v in values)
        return C.SUCCESS


@entry("mdl.set_aipp_dtc_pixel_mean", "khhhhK", ret_only)
def set_aipp_dtc_pixel_mean(
    handle: int, c0: int, c1: int, c2: int, c3: int, batch_index: int
) -> int:
    return _channels("mean", handle, (c0, c1, c2, c3), batch_index)


@entry("mdl.set_aipp_dtc_pixel_min", "kffffK", ret_only)
def set_aipp_dtc_pixel_min(
    handle: int, c0: float, c1: float, c2: float, c3: float, batch_index: int
) -> int:
    return _channels("minimum", handle, (c0, c1, c2, c3), batch_index)


@entry("mdl.set_aipp_pixel_var_reci", "kffffK", ret_only)
def set_aipp_pixel_var_reci(
    handle: int, c0: float, c1: float, c2: float, c3: float, batch_index: int
) -> int:
    return _channels("var_reci", handle, (c0, c1, c2, c3), batch_index)


@entry("mdl.set_input_aipp", "Ikkk", ret_only)
def set_input_aipp(model_id: int, dataset: int, index: int, handle: int) -> int:
    """Write the parameter set into the buffer at `index` (the ascend_dynamic_aipp_data input)."""
    from ._mdl_dynamic import _target

    with RT.lock:
        model, _, buffer = _target(model_id, dataset, index)
        found = _aipp(handle)
        if model.spec.aipp is None or model.spec.aipp.mode != "dynamic":
            raise AclFail(C.GE_PARAM_INVALID, f"model {model_id} has no dynamic AIPP input")
        if found.src == (0, 0) or not found.fmt:
            raise AclFail(
                C.INVALID_PARAM,
                "set_aipp_src_image_size and set_aipp_input_format are required for dynamic AIPP",
            )
        _check_against_model(model.spec, found)
        mean = found.mean.get(0, (0.0,) * 4)
        var = found.var_reci.get(0, (1.0,) * 4)
        block = np.array(
            [MAGIC, found.fmt, found.src[0], found.src[1], found.batch, *mean, *var],
            dtype=np.float64,
        )
        if buffer.size < block.nbytes:
            raise AclFail(C.GE_PARAM_INVALID, "dynamic AIPP buffer too small")
        RT.memory.write_device(buffer.addr, block)
        return C.SUCCESS


def _check_against_model(spec: _om.OmSpec, found: AippSet) -> None:
    """GE's checks at aclmdlSetInputAIPP (acl_aipp.cpp GetAndCheckAippParams,
    aipp_param_check.cpp): the source images within max_src_image_size, the batch and the AIPP
    output W x H equal to the model's, a YUV420SP source of even width and height."""
    aipp = spec.aipp
    assert aipp is not None
    size = aipp.source_bytes(found.batch, found.fmt, (found.src[1], found.src[0]))
    if size > aipp.max_src:
        raise AclFail(
            C.INVALID_PARAM,
            f"the dynamic aipp size[{size}] is bigger than max_src_image_size[{aipp.max_src}]",
        )
    n, h, w = spec.model_hw()
    out_w, out_h = found.output_hw()
    if (found.batch, out_w, out_h) != (n, w, h):
        raise AclFail(
            C.INVALID_PARAM,
            "aipp output shape set by ACL must be equal to aipp output shape in the model! "
            f"AclAippBatchSize = {found.batch}, AclAippOutputW = {out_w}, "
            f"AclAippOutputH = {out_h}, ModelAippBatchSize = {n}, ModelAippOutputW = {w}, "
            f"ModelAippOutputH = {h}.",
        )
    if found.fmt == 1 and (found.src[0] % 2 or found.src[1] % 2):
        raise AclFail(
            C.INVALID_PARAM,
            f"srcImageSizeH[{found.src[1]}] and srcImageSizeW[{found.src[0]}] must be even "
            "for YUV420SP_U8!",
        )


def read_block(addr: int) -> dict | None:
    """The parameters set_input_aipp left in a buffer, or None when it never ran."""
    raw = RT.memory.read_device(addr, 13 * 8).view(np.float64)
    if raw[0] != MAGIC:
        return None
    return {
        "fmt": int(raw[1]),
        "src": (int(raw[3]), int(raw[2])),  # (h, w)
        "mean": float(raw[5]),
        "var_reci": float(raw[9]),
    }


@entry("mdl.get_aipp_type", "Ik", lambda code: (0, 0, code))
def get_aipp_type(model_id: int, index: int) -> tuple[int, int, int]:
    from .mdl import _model

    with RT.lock:
        spec = _model(model_id).spec
        names = [t.name for t in spec.desc_inputs()]
        if not 0 <= index < len(names):
            raise AclFail(C.INVALID_PARAM, f"input index {index} out of range")
        aipp = spec.aipp
        if names[index] == C.DYNAMIC_AIPP_NAME:
            return DYNAMIC_AIPP_NODE, 0, C.SUCCESS
        if aipp is None or names[index] != aipp.input:
            return WITHOUT_AIPP, 0, C.SUCCESS
        if aipp.mode == "static":
            return STATIC_AIPP, 0, C.SUCCESS
        return DYNAMIC_AIPP, names.index(C.DYNAMIC_AIPP_NAME), C.SUCCESS
