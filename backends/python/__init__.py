"""Triton-style Python models: the server's side of a model's worker processes."""
