"""The NPU executor: Ascend instances run in a process of their own, not in the server's.

pyACL keeps the GIL through most of its calls (a load of seconds, every synchronous copy), so
the server never calls it: `client.py` (the `ascend` backend the server loads) starts one
executor process per model version, instance group and device (`main.py`), supervised like a
Python model's worker, and sends it each batch through shared memory.
"""
