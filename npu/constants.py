"""pyACL numbers the backend relies on. The real `acl` module exports few constants, so code
that uses it keeps its own (as Huawei's own samples do)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The extra input ATC adds to a model compiled with --dynamic_batch_size, --dynamic_image_size
# or --dynamic_dims (ACL_DYNAMIC_TENSOR_NAME), and the one dynamic AIPP adds
# (ACL_DYNAMIC_AIPP_NAME), as acl_mdl.h defines them.
DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"
DYNAMIC_AIPP_NAME = "ascend_dynamic_aipp_data"

# aclAippInputFormat values dynamic AIPP accepts (acl_mdl.h) -> (height factor, channels) of
# the source image as the model takes it (CANN docs, aclmdlGetInputDimsV2 table 1: NHWC).
AIPP_FORMATS = {
    "YUV420SP_U8": (1, 1.5, 1),
    "XRGB8888_U8": (2, 1.0, 4),
    "RGB888_U8": (3, 1.0, 3),
    "YUV400_U8": (4, 1.0, 1),
}

MALLOC_HUGE_FIRST = 0

MEMCPY_HOST_TO_DEVICE = 1
MEMCPY_DEVICE_TO_HOST = 2
MEMCPY_DEVICE_TO_DEVICE = 3

RUN_MODE_DEVICE = 0  # the program runs on the device's own CPU (e.g. Atlas 200 DK)
RUN_MODE_HOST = 1  # the program runs on a host, the NPU sits on PCIe

MEM_DDR = 0
MEM_HBM = 1

SUCCESS = 0
REPEAT_INITIALIZE = 100002
REPEAT_FINALIZE = 100037


@dataclass(frozen=True)
class AclType:
    """One aclDataType: its number, Triton's config name and the numpy dtype that carries it."""

    acl: int
    config_name: str
    numpy: np.dtype


# BF16 travels as its uint16 bit pattern, as protocol/datatypes.py does.
_TYPES = [
    AclType(0, "TYPE_FP32", np.dtype(np.float32)),
    AclType(1, "TYPE_FP16", np.dtype(np.float16)),
    AclType(2, "TYPE_INT8", np.dtype(np.int8)),
    AclType(3, "TYPE_INT32", np.dtype(np.int32)),
    AclType(4, "TYPE_UINT8", np.dtype(np.uint8)),
    AclType(6, "TYPE_INT16", np.dtype(np.int16)),
    AclType(7, "TYPE_UINT16", np.dtype(np.uint16)),
    AclType(8, "TYPE_UINT32", np.dtype(np.uint32)),
    AclType(9, "TYPE_INT64", np.dtype(np.int64)),
    AclType(10, "TYPE_UINT64", np.dtype(np.uint64)),
    AclType(11, "TYPE_FP64", np.dtype(np.float64)),
    AclType(12, "TYPE_BOOL", np.dtype(np.bool_)),
    AclType(27, "TYPE_BF16", np.dtype(np.uint16)),
]
ACL_TYPES: dict[int, AclType] = {t.acl: t for t in _TYPES}
