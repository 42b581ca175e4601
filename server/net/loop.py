"""The event loop every server process runs: the owner's and each frontend child's alike."""

from __future__ import annotations

import asyncio


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where installed (its loop is what the HTTP fast path and grpc.aio were measured on);
    asyncio's own loop elsewhere."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # uvloop is optional (not on Windows)
        return asyncio.new_event_loop()
