"""Measurements for one question each, run on their own (not by `make bench`): frontend
processes (frontend_scaling.py), hostile bodies against the event loop (hostile.py), shared
memory and tracing (shm_and_tracing.py), gray-release routing cost (traffic_routing.py), and an
Ascend NPU device's own loop (npu_device.py)."""
