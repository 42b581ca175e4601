"""Dynamic AIPP: the image pre-processing a model compiled with `aipp_mode: dynamic` takes at run
time, read from the model config's `parameters` and set once per loaded copy.

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
from npu.errors import check

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
            f"input '{target.name}': a {settings.width}x{settings.height} "
            f"{settings.input_format} image needs {shown.row_bytes} bytes per "
            f"batch row, the model's buffer holds {target.size} for {rows}"
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
        check(acl, mdl.set_input_aipp(model_id, dataset, index, handle), "acl.mdl.set_input_aipp")
    finally:
        check(acl, mdl.destroy_aipp(handle), "acl.mdl.destroy_aipp")


def aipp_input(info: ModelDescription) -> TensorInfo | None:
    return next((t for t in info.inputs if t.aipp == "dynamic"), None)
