"""Fixtures the backend unit tests share."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """Two connected Unix stream sockets, as between the server and a worker."""
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield left, right
    left.close()
    right.close()
