"""The responses of one decoupled request on their way from the backend to the frontend.

A decoupled model answers a request any number of times, from any thread, after `execute`
returned or before. The backend pushes each answer here (thread-safe); the infer path hands
them to the frontend in order, with a final marker. It lives beside InferRequest because it is
part of the one internal request: `InferRequest.stream` is set for requests to decoupled models.

Back-pressure is the producer's business: its `on_consumed` hook runs each time the consumer
took an answer (the Python backend turns that into credit for the model's sender), so at most a
window of answers waits here. `cancel` tells it the consumer went away.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol.errors import ServerError
from protocol.types import InferResponse


@dataclass(slots=True)
class StreamItem:
    """One answer: outputs (None for a flag-only final), or an error; `final` ends the stream."""

    outputs: Mapping[str, np.ndarray] | None = None
    error: ServerError | None = None
    final: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)
    response: InferResponse | None = None  # filled by the consumer (see `convert`)


class ResponseStream:
    """An ordered channel of StreamItems for one request; one consumer, on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[StreamItem] = deque()
        self._waiter: asyncio.Future | None = None
        self.finished = False  # the final item has been pushed
        self.cancelled = False
        # Given by the producers (the instance pool, the backend) before the first push.
        self._convert: Callable[[Mapping[str, np.ndarray]], InferResponse] | None = None
        self._on_consumed: Callable[[], None] | None = None
        self._on_cancel: Callable[[], None] | None = None

    def set_converter(self, convert: Callable[[Mapping[str, np.ndarray]], InferResponse]) -> None:
        """How an answer's output arrays become an InferResponse (the instance's rules)."""
        self._convert = convert

    def attach(self, on_consumed: Callable[[], None], on_cancel: Callable[[], None]) -> None:
        """The producer's hooks: an answer was taken (credit for the model's sender); the
        consumer went away (tell the model)."""
        self._on_consumed = on_consumed
        self._on_cancel = on_cancel

    def push_threadsafe(self, item: StreamItem) -> None:
        self._loop.call_soon_threadsafe(self.push, item)

    def push(self, item: StreamItem) -> None:
        """On the loop. Anything after the final item, or after a cancel, is dropped."""
        if self.finished or self.cancelled:
            return
        if item.final:
            self.finished = True
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, error: ServerError) -> None:
        """End the stream with an error (execute failed, the worker died, ...)."""
        self.push(StreamItem(error=error, final=True))

    async def next(self) -> StreamItem:
        """The next answer, its outputs converted to an InferResponse."""
        while not self._items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if item.outputs is not None and item.error is None and self._convert is not None:
            try:
                item.response = self._convert(item.outputs)
            except ServerError as exc:
                item.error = exc
            if item.response is not None:
                item.response.parameters.update(item.parameters)
        if self._on_consumed is not None and not item.final:
            self._on_consumed()
        return item

    def cancel(self) -> None:
        """The consumer is gone: tell the producer (once), drop what is still to come."""
        if self.cancelled or self.finished:
            self.cancelled = True
            return
        self.cancelled = True
        self._items.clear()
        if self._on_cancel is not None:
            self._on_cancel()
