"""tests/soak: the two-minute soak and chaos run, marked `e2e`, `soak` and `slow` here, so that
`pytest -m "not soak"` (or `--ignore tests/soak`) leaves it out."""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    """Called only for items under this folder (the hook goes through the item's own conftests)."""
    for mark in (pytest.mark.e2e, pytest.mark.soak, pytest.mark.slow):
        item.add_marker(mark)
