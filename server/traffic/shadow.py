"""Shadow traffic: a copy of a primary request sent to another version, its answer discarded.

The copy is submitted on the next turn of the event loop after the primary answer is computed
(so the frontend writes the client's answer first), straight to the shadow version's own
scheduler, not through the infer path (server/core/inference_path.py says why). It never waits:
a shadow refused by a full queue, or over the in-flight limit, is dropped and counted, so it can
neither delay nor fail the request it copies.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from protocol.traffic import ShadowSpec
from protocol.types import InferRequest
from repository.registry import ModelRegistry

log = logging.getLogger(__name__)

DEFAULT_MAX_INFLIGHT = 32  # shadow requests in flight per server before new ones are dropped

Count = Callable[[str, int, str], None]


class ShadowSender:
    def __init__(
        self, registry: ModelRegistry, count: Count, max_inflight: int = DEFAULT_MAX_INFLIGHT
    ) -> None:
        self.registry = registry
        self._count = count  # the route counter (route "shadow")
        self.max_inflight = max_inflight
        self.inflight = 0
        self.errors: dict[tuple[str, int], int] = {}  # (model, version) -> failed or dropped

    def maybe_send(self, name: str, spec: ShadowSpec, request: InferRequest) -> None:
        """Called once the primary answer is computed: with probability `fraction`, send a copy
        on the next loop turn."""
        if spec.fraction <= 0.0 or (spec.fraction < 1.0 and random.random() >= spec.fraction):
            return
        asyncio.get_running_loop().call_soon(self._send, name, int(spec.version), request)

    def _send(self, name: str, version: int, request: InferRequest) -> None:
        if self.inflight >= self.max_inflight:
            self._error(name, version)
            return
        model = self.registry.models.get(name)
        record = model.versions.get(version) if model is not None else None
        if record is None or not record.serving:
            self._error(name, version)
            return
        copy = InferRequest(
            name, str(version), id=request.id, inputs=request.inputs, parameters=request.parameters
        )
        try:
            future = record.scheduler.submit(copy)  # type: ignore[union-attr]  # serving: has one
        except Exception:
            self._error(name, version)
            return
        self._count(name, version, "shadow")
        self.inflight += 1
        future.add_done_callback(lambda done: self._done(name, version, done))

    def _done(self, name: str, version: int, future: asyncio.Future) -> None:
        self.inflight -= 1
        if future.cancelled() or future.exception() is not None:
            self._error(name, version)

    def _error(self, name: str, version: int) -> None:
        key = (name, version)
        self.errors[key] = self.errors.get(key, 0) + 1
