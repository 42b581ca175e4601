"""Triton's classification extension output format."""

from __future__ import annotations

import numpy as np

from protocol.classification import classify
from protocol.types import Tensor


def test_top_k_per_batch_item_with_labels() -> None:
    data = np.array([[0.1, 0.7, 0.2], [0.5, 0.1, 0.4]], dtype=np.float32)
    result = classify(Tensor("P", "FP32", data.shape, data), 2, True, ["cat", "dog", "bird"])
    assert result.datatype == "BYTES" and result.shape == (2, 2)
    assert list(result.data[0]) == [b"0.700000:1:dog", b"0.200000:2:bird"]
    assert list(result.data[1]) == [b"0.500000:0:cat", b"0.400000:2:bird"]


def test_integers_and_k_larger_than_classes_without_labels() -> None:
    data = np.array([3, 10, 7], dtype=np.int32)
    result = classify(Tensor("P", "INT32", data.shape, data), 5, False, [])
    assert result.shape == (3,)
    assert list(result.data) == [b"10:1", b"7:2", b"3:0"]
