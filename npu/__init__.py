"""The Ascend NPU backend: ATC-compiled `.om` models run through pyACL.

Nothing here imports `acl` at import time; `npu/acl.py` does it on first use, so a machine
without CANN only fails the models that ask for this backend.
"""
