"""Comparisons of two source trees on the Python model `py_add` (not part of `make bench`):
python_model_ab.py measures both servers' CPU and throughput in interleaved rounds,
python_path_opcodes.py counts the bytecodes one `execute` runs (a count no machine noise moves)."""
