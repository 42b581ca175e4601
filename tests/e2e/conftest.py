"""tests/e2e: every test here starts a server subprocess, so each one is marked `e2e`."""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    """Called only for items under this folder (the hook goes through the item's own conftests)."""
    item.add_marker(pytest.mark.e2e)
