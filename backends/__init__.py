"""Runtimes behind the one small Backend interface (ONNX Runtime, Python models).

The Ascend NPU runtime lives beside this package in `npu/` and implements the same interface.
"""
