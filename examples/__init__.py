"""Example model repository for ascend-serve (built by ``examples/build_repository.py``)."""
