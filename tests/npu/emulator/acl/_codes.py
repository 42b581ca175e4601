"""Numbers the real binding uses: aclError codes and the enums this emulator needs.

Kept apart from `npu/constants.py` on purpose: the emulator stands in for CANN, so it must not
borrow the backend's idea of what the numbers are.
"""

from __future__ import annotations

SUCCESS = 0
INVALID_PARAM = 100000
UNINITIALIZE = 100001
REPEAT_INITIALIZE = 100002
INVALID_MODEL_ID = 100011
REPEAT_FINALIZE = 100037
RT_PARAM_INVALID = 107000
RT_INVALID_DEVICEID = 107001
RT_CONTEXT_NULL = 107002
RT_STREAM_CONTEXT = 107003
RT_MODEL_CONTEXT = 107004
GE_PARAM_INVALID = 145000
GE_EXEC_MODEL_PATH_INVALID = 145002
GE_EXEC_MODEL_ID_INVALID = 145003
GE_DYNAMIC_INPUT_LENGTH_INVALID = 145012
GE_DYNAMIC_BATCH_SIZE_INVALID = 145013
RT_MEMORY_ALLOCATION = 207001
GE_MEMORY_ALLOCATION = 245000
GE_LOAD_MODEL = 545001
RT_LOST_HEARTBEAT = 507010
RT_MODEL_EXECUTE = 507011

DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"

# aclDataType -> numpy dtype name (BF16 travels as its uint16 bit pattern).
DTYPES: dict[int, str] = {
    0: "float32",
    1: "float16",
    2: "int8",
    3: "int32",
    4: "uint8",
    6: "int16",
    7: "uint16",
    8: "uint32",
    9: "int64",
    10: "uint64",
    11: "float64",
    12: "bool",
    27: "uint16",
}

RUN_MODE_DEVICE = 0
RUN_MODE_HOST = 1

MEMCPY_HOST_TO_HOST = 0
MEMCPY_HOST_TO_DEVICE = 1
MEMCPY_DEVICE_TO_HOST = 2
MEMCPY_DEVICE_TO_DEVICE = 3
MEMCPY_DEFAULT = 4

MEM_DDR = 0
MEM_HBM = 1

DYNAMIC_AIPP_NAME = "ascend_dynamic_aipp_data"
AIPP_DATA_SIZE = 160  # bytes of the dynamic AIPP parameter input the emulator reports [infer]
GE_AIPP_NOT_SET = 507011  # execute with dynamic AIPP parameters never set fails the model task
RT_AICORE_EXCEPTION = 507015
RT_AICORE_TIMEOUT = 507014
RT_STREAM_SYNC_TIMEOUT = 507046  # synchronize_stream_with_timeout ran out (acl_rt.h)
