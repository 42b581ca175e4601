"""tests/qa: NVIDIA's qa suites and the tritonserver shim run servers, so each test is `e2e`."""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    """Called only for items under this folder (the hook goes through the item's own conftests)."""
    item.add_marker(pytest.mark.e2e)
