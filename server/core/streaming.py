"""Every answer of one request, as an async iterator: the streaming side of the one infer path.

For a decoupled model the request gets a ResponseStream (protocol/stream.py) before it is
submitted to the version's scheduler, like any request (validation, queue, batching, statistics
and metrics all apply); the scheduler's future then only says whether `execute` took it, and
the answers come through the stream, a failed one as an item with its error. A model that is
not decoupled gives its one answer as a final item, and its failure as an exception, like a
request refused before it ran. When the consumer stops early (a client cancelled, a stream closed),
the request is cancelled: dropped if still queued, `is_cancelled()` for the model if it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from protocol.errors import as_server_error
from protocol.stream import ResponseStream, StreamItem
from protocol.types import InferRequest

if TYPE_CHECKING:  # pragma: no cover
    from repository.registry import VersionRecord
    from server.core.inference_path import InferencePath


async def answers(
    path: InferencePath,
    request: InferRequest,
    record: VersionRecord,
    routed: VersionRecord | None = None,
) -> AsyncIterator[StreamItem]:
    """`record`: the version picked; `routed`: the one the caller resolved itself, if any (a
    model that is not decoupled is routed again, and counted, by infer_admitted)."""
    scheduler = record.scheduler
    assert scheduler is not None
    if not scheduler.rules.decoupled:  # its one answer; a failure fails the request
        yield StreamItem(final=True, response=await path.infer_admitted(request, routed))
        return
    from server.core.inference_path import _select_outputs  # the one output selection

    stream = ResponseStream(asyncio.get_running_loop())
    request.stream = stream
    future = scheduler.submit(request)  # validates; raises at once when refused
    path.enter()

    def taken(done: asyncio.Future) -> None:
        if not done.cancelled() and done.exception() is not None:
            stream.fail(as_server_error(done.exception()))  # type: ignore[arg-type]

    future.add_done_callback(taken)
    try:
        while True:
            item = await stream.next()
            if item.response is not None:
                item.response = _select_outputs(
                    item.response, request.outputs, record, lenient=True
                )
            yield item
            if item.final:
                return
    finally:
        if not stream.finished or stream.cancelled:
            stream.cancel()
            future.cancel()
        path.leave()
