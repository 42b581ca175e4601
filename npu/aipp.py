"""Dynamic AIPP: the image pre-processing a model compiled with `aipp_mode: dynamic` takes at run
time, read from the model config's `parameters` and set once per loaded copy.

GE reports the image input of such a model as `[N, -1, -1, -1]` (N the static batch, or -1
with --dynamic_batch_size) and sizes its buffer by aipp.cfg's `max_src_image_size`; the client
sends the source image whose size and format the config names, so that is the shape shown.
GE checks the set at `set_input_aipp` (hicann/ge acl_aipp.cpp, aipp_param_check.cpp): the
sources within max_src_image_size, the batch equal to the model's N (the largest gear), the
AIPP output (the source, cropped, padded) equal to the model's own H x W, a YUV420SP source of
even size. The first and last are checked here with the numbers; the other two only GE can
check (the model's own H x W is not in the description), and its refusal is explained.

The parameter set goes through `acl.mdl.create_aipp(batch)`, the `set_aipp_*` setters and
`acl.mdl.set_input_aipp(model_id, dataset, index, aipp)` with the index of the hidden
`ascend_dynamic_aipp_data` input, then `destroy_aipp` (argument formats checked against
hicann/runtime python/pyACL/mdl/mdl_wrap.cpp; the call order follows the CANN pyACL dynamic
AIPP sample). set_input_aipp writes the parameters into that input's device buffer, which the
backend makes once at load and never rewrites, so once is enough.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from backends.base import BackendError
from npu import constants as K
from npu.description import ModelDescription, TensorInfo
from npu.errors import AclError, check, recent_message

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig

PREFIX = "aipp_"
# parameter -> (setter, how many numbers, takes a trailing batch index)
_SETTERS = {
    "csc_params": ("set_aipp_csc_params", 16, False),
    "rbuv_swap_switch": ("set_aipp_rbuv_swap_switch", 1, False),
    "ax_swap_switch": ("set_aipp_ax_swap_switch", 1, False),
    "crop_params": ("set_aipp_crop_params", 5, True),
    "padding_params": ("set_aipp_padding_params", 5, True),
    "dtc_pixel_mean": ("set_aipp_dtc_pixel_mean", 4, True),
    "dtc_pixel_min": ("set_aipp_dtc_pixel_min", 4, True),
    "pixel_var_reci": ("set_aipp_pixel_var_reci", 4, True),
}
_FLOATS = {"dtc_pixel_min", "pixel_var_reci"}
KNOWN = {"input_format", "src_image_size_w", "src_image_size_h", *_SETTERS}


@dataclass(frozen=True)
class AippSettings:
    """What config.pbtxt says about dynamic AIPP (parameters named aipp_<setting>)."""

    input_format: str
    width: int
    height: int
    extra: tuple[tuple[str, tuple[float, ...]], ...] = ()

    @property
    def format_code(self) -> int:
        return K.AIPP_FORMATS[self.input_format][0]

    def output_size(self) -> tuple[int, int]:
        """(w, h) of the image AIPP hands the model: the source, cropped, then padded (CANN,
        aclmdlSetInputAIPP table 1; resizing is not configurable here)."""
        given = dict(self.extra)
        w, h = self.width, self.height
        crop = given.get("crop_params")
        if crop and crop[0]:
            w, h = int(crop[3]), int(crop[4])
        pad = given.get("padding_params")
        if pad and pad[0]:
            w, h = w + int(pad[3] + pad[4]), h + int(pad[1] + pad[2])
        return w, h

    def row_dims(self) -> tuple[int, int, int]:
        """One source image as the client sends it (NHWC without N), uint8."""
        _, factor, channels = K.AIPP_FORMATS[self.input_format]
        return int(self.height * factor), self.width, channels


def _numbers(key: str, text: str, count: int, floats: bool) -> tuple[float, ...]:
    try:
        values = tuple((float if floats else int)(v) for v in text.replace(" ", "").split(","))
    except ValueError:
        values = ()
    if len(values) != count:
        raise BackendError(
            f"parameter '{PREFIX}{key}' must be {count} comma-separated "
            f"{'numbers' if floats else 'integers'}, not '{text}'"
        )
    return values


def settings_from_config(config: ModelConfig) -> AippSettings | None:
    """The dynamic AIPP settings, or None when the config has no aipp_* parameter."""
    given = {
        k[len(PREFIX) :]: v.string_value
        for k, v in config.parameters.items()
        if k.startswith(PREFIX)
    }
    if not given:
        return None
    unknown = sorted(set(given) - KNOWN)
    if unknown:
        raise BackendError(
            f"unknown AIPP parameter(s) {', '.join(PREFIX + u for u in unknown)}; "
            f"known: {', '.join(PREFIX + k for k in sorted(KNOWN))}"
        )
    fmt = given.get("input_format", "")
    if fmt not in K.AIPP_FORMATS:
        raise BackendError(
            f"parameter '{PREFIX}input_format' must be one of "
            f"{', '.join(K.AIPP_FORMATS)} (dynamic AIPP), not '{fmt}'"
        )
    size = [
        _numbers(k, given.get(k, ""), 1, False)[0] for k in ("src_image_size_w", "src_image_size_h")
    ]
    if min(size) <= 0:
        raise BackendError("AIPP source image size must be positive")
    if fmt == "YUV420SP_U8" and (size[0] % 2 or size[1] % 2):
        raise BackendError(
            f"a YUV420SP_U8 source must have an even width and height, not "
            f"{size[0]}x{size[1]} ({PREFIX}src_image_size_w x {PREFIX}src_image_size_h)"
        )
    extra = tuple(
        (key, _numbers(key, given[key], count, key in _FLOATS))
        for key, (_, count, _) in _SETTERS.items()
        if key in given
    )
    return AippSettings(fmt, int(size[0]), int(size[1]), extra)


def describe_with(info: ModelDescription, settings: AippSettings | None) -> ModelDescription:
    """The description with the dynamic-AIPP input shown as the source image the client sends."""
    target = next((t for t in info.inputs if t.aipp == "dynamic"), None)
    if target is None:
        return info
    if settings is None:
        raise BackendError(
            f"input '{target.name}' takes dynamic AIPP: set the model config "
            f"parameters {PREFIX}input_format, {PREFIX}src_image_size_w and "
            f"{PREFIX}src_image_size_h (see the README's NPU section)"
        )
    first = -1 if target.batched else (target.dims[0] if target.dims else 1)
    dims = (first,) + settings.row_dims()
    shown = dataclasses.replace(target, dims=dims, acl_type=K.ACL_TYPES[4])
    rows = max(info.batch_sizes, default=first if first > 0 else 1)
    if shown.row_bytes * rows > target.size:
        raise BackendError(
            f"input '{target.name}': {rows} {settings.width}x{settings.height} "
            f"{settings.input_format} source image(s) take {shown.row_bytes * rows} bytes, "
            f"more than the model's max_src_image_size of {target.size} (aipp.cfg, compiled "
            "in): send smaller images or compile with a larger max_src_image_size"
        )
    inputs = tuple(shown if t is target else t for t in info.inputs)
    return dataclasses.replace(info, inputs=inputs)


def apply(
    acl: ModuleType, model_id: int, dataset: int, index: int, batch: int, settings: AippSettings
) -> None:
    """One parameter set for `batch` images, written into the dynamic AIPP input."""
    mdl = acl.mdl
    handle = mdl.create_aipp(batch)
    if not handle:
        raise BackendError(f"acl.mdl.create_aipp({batch}) returned a null handle")
    try:
        check(
            acl,
            mdl.set_aipp_input_format(handle, settings.format_code),
            "acl.mdl.set_aipp_input_format",
        )
        check(
            acl,
            mdl.set_aipp_src_image_size(handle, settings.width, settings.height),
            "acl.mdl.set_aipp_src_image_size",
        )
        for key, values in settings.extra:
            name, _, per_image = _SETTERS[key]
            setter = getattr(mdl, name)
            args = [float(v) if key in _FLOATS else int(v) for v in values]
            for image in range(batch if per_image else 1):
                extra = [image] if per_image else []
                check(acl, setter(handle, *args, *extra), f"acl.mdl.{name}")
        ret = mdl.set_input_aipp(model_id, dataset, index, handle)
        if ret != K.SUCCESS:
            raise AclError("acl.mdl.set_input_aipp", ret, _refusal(acl, batch, settings))
    finally:
        check(acl, mdl.destroy_aipp(handle), "acl.mdl.destroy_aipp")


def _refusal(acl: ModuleType, batch: int, settings: AippSettings) -> str:
    """What GE checks at set_input_aipp, with what this config asked, then pyACL's own text."""
    w, h = settings.output_size()
    asked = (
        f"GE refuses dynamic AIPP parameters unless the batch equals the model's N, the "
        f"AIPP output (source, cropped, padded) equals the model's input W x H and the "
        f"sources fit max_src_image_size; this config sets batch {batch}, a "
        f"{settings.width}x{settings.height} {settings.input_format} source and an output "
        f"of {w}x{h} (check {PREFIX}src_image_size_w/h, {PREFIX}crop_params and "
        f"{PREFIX}padding_params against the model's input)"
    )
    return "; ".join(p for p in (asked, recent_message(acl)) if p)


def aipp_input(info: ModelDescription) -> TensorInfo | None:
    return next((t for t in info.inputs if t.aipp == "dynamic"), None)
