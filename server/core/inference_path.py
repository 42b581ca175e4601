"""The one in-process infer: pick the version, submit, answer with the outputs asked for.

Every caller takes this door: both frontends, ensemble steps, and later BLS calls from Python
models. It is built once in server/app.py and handed to whoever needs it (the model manager
passes `infer_admitted` to the ensembles it builds), so nothing reaches back into the server
through a patched attribute.

Two kinds of request do not take this door, and this is the one place that says why. Both are
submitted straight to one version's scheduler (`Scheduler.submit`), which validates, queues and
batches them like any request; what they skip is what this path adds for client requests:
- Warm-up samples (repository/warmup.py) run on a new copy before it is published: no name
  resolves to it yet, nothing may route to it, and the load (the model manager, which has no
  path) waits for them itself. Their statistics are reset afterwards.
- Shadow copies (server/traffic/shadow.py) are not client requests: no routing (the version is
  the policy's), no in-flight count (shutdown does not wait for them), no traffic counting and
  no canary outcome (a copy is not a client's request, and is not shadowed again), no output
  selection (its answer is discarded). They never wait: their own in-flight limit drops them.

The path resolves the version (a model's traffic policy, server/traffic/policy.py, picks one
when set: one dict lookup otherwise), keeps count of what is in flight so shutdown can wait for
it, and submits to that version's scheduler, which validates and queues
(scheduler/interface.py). Classification and output selection happen here, once the answer is
back, with the labels the version read when it loaded.

Decoupled models answer any number of times: `stream` gives every answer to the gRPC stream,
generate_stream and BLS; `infer` refuses them as Triton does, and `infer_admitted` (ensemble
steps) takes their one answer. The path is also the BackendHost (backends/base.py) Python models
make their BLS calls through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from protocol.classification import classify
from protocol.errors import (
    HTTP_ENDPOINT,
    InternalError,
    as_server_error,
    decoupled_unsupported,
    server_exiting,
)
from protocol.stream import ResponseStream, StreamItem
from protocol.types import InferRequest, InferResponse, RequestedOutput, Tensor
from repository.registry import ModelRegistry, VersionRecord
from scheduler.interface import Scheduler
from server.traffic.policy import NAMED, Policy, TrafficControl

ONE_ANSWER_ERROR = (
    "model '{model}' is decoupled and gave {count}; a caller that expects one "
    "answer needs exactly 1 response"
)


# How often shutdown looks again whether the live sequences have ended (only while exiting).
SEQUENCE_POLL_S = 0.05


class InferencePath:
    def __init__(
        self,
        registry: ModelRegistry,
        traffic: TrafficControl | None = None,
        custom_metric: Callable[[dict], None] | None = None,
        declare_metric: Callable[[dict], str | None] | None = None,
    ) -> None:
        self.registry = registry
        self.traffic = traffic if traffic is not None else TrafficControl(registry)
        self._policies = self.traffic.policies  # model -> policy in force (gray release)
        self.exiting = False
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.loop: asyncio.AbstractEventLoop | None = None  # set by attach_loop
        self._custom_metric = custom_metric
        self._declare_metric = declare_metric

    # ----- what Python models' backends use (BackendHost) --------------------------------
    def attach_loop(self) -> None:
        """Called on the server's loop at start: BLS calls arrive from worker threads."""
        self.loop = asyncio.get_running_loop()

    def is_decoupled(self, name: str, version: str = "") -> bool:
        record = self.resolve(name, version)
        return record.scheduler is not None and record.scheduler.rules.decoupled

    def custom_metric(self, update: dict) -> None:
        if self._custom_metric is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(self._custom_metric, update)

    def declare_metric(self, update: dict) -> str | None:
        """On a worker's reading thread: None, or why a custom metric is refused."""
        return None if self._declare_metric is None else self._declare_metric(update)

    def resolve(self, name: str, version: str = "") -> VersionRecord:
        """The version a request for (name, version) goes to, or NOT_FOUND / UNAVAILABLE
        (a raw binary body, which carries no traffic_key, is resolved before it is decoded,
        and then inferred on that version: it is counted there)."""
        policy = self._policies.get(name)
        if policy is not None:
            return self.traffic.resolve(policy, name, version, count=False)
        return self.registry.resolve(name, version)

    async def infer(
        self,
        request: InferRequest,
        record: VersionRecord | None = None,
        endpoint: str = HTTP_ENDPOINT,
    ) -> InferResponse:
        """A request from a client; refused once the server is exiting, and for a decoupled
        model (`endpoint` names the caller in Triton's text). `record` is the version when the
        caller already resolved it (to decode a raw binary body)."""
        if self.exiting and not self._continues_sequence(request):
            raise server_exiting()
        return await self.infer_admitted(request, record, refuse_decoupled=endpoint)

    def stream(
        self, request: InferRequest, record: VersionRecord | None = None, admitted: bool = True
    ) -> AsyncIterator[StreamItem]:
        """Every answer to `request`, in order, the last one `final` (one answer for a model
        that is not decoupled, routed by infer_admitted). With `admitted=False` (a client's
        request) it is refused once the server is exiting. A decoupled model's version is
        picked uncounted by a traffic policy (its streams take no part in canaries)."""
        if not admitted and self.exiting and not self._continues_sequence(request):
            raise server_exiting()
        picked = (
            record
            if record is not None
            else self.resolve(request.model_name, request.model_version)
        )
        return self._answers(request, picked, record)

    async def infer_admitted(
        self, request: InferRequest, record: VersionRecord | None = None, refuse_decoupled: str = ""
    ) -> InferResponse:
        """`infer` without the exiting check: work on behalf of a request already admitted
        (an ensemble's steps), which must finish during the drain. Under a traffic policy the
        answer (or failure) is reported to it: the canary's outcomes, the shadow copy. A
        decoupled model gives its one answer, or is refused naming `refuse_decoupled`."""
        policy = self._policies.get(request.model_name)  # a traffic policy (gray release)
        record, started = self._route(policy, request, record)
        scheduler = record.scheduler
        assert scheduler is not None
        if scheduler.rules.decoupled:
            if refuse_decoupled:
                raise decoupled_unsupported(refuse_decoupled)
            return await self.one_answer(request, record, ONE_ANSWER_ERROR)
        if record.cache is not None:  # response_cache (server/core/response_cache.py)
            return await self._cached(request, record, policy, started)
        try:
            future = scheduler.submit(request)  # validates; raises at once when refused
        except Exception:
            if policy is not None:
                self.traffic.answered(policy, request, record, started, False)
            raise
        return await self._reported(future, request, record, policy, started)

    async def _reported(
        self,
        answer: Awaitable[InferResponse],
        request: InferRequest,
        record: VersionRecord,
        policy: Policy | None,
        started: int,
    ) -> InferResponse:
        """Await an admitted request's answer counted in flight (shutdown waits for it), tell
        the traffic policy how it went, and keep the outputs asked for: the one epilogue of
        the plain and the cached path."""
        self.enter()
        try:
            response = await answer
        except asyncio.CancelledError:
            raise
        except BaseException:
            if policy is not None:
                self.traffic.answered(policy, request, record, started, False)
            raise
        finally:
            self.leave()
        if policy is not None:
            self.traffic.answered(policy, request, record, started, True)
        return _select_outputs(response, request.outputs, record)

    async def _cached(
        self, request: InferRequest, record: VersionRecord, policy: Policy | None, started: int
    ) -> InferResponse:
        """infer_admitted for a copy with the response cache: validated as any request, then
        looked up (`_lookup`)."""
        scheduler = record.scheduler
        assert scheduler is not None
        try:
            scheduler.validate(request)  # a refused request is never looked up
        except Exception:
            if policy is not None:
                self.traffic.answered(policy, request, record, started, False)
            raise
        return await self._reported(
            self._lookup(request, record, scheduler), request, record, policy, started
        )

    @staticmethod
    async def _lookup(
        request: InferRequest, record: VersionRecord, scheduler: Scheduler
    ) -> InferResponse:
        """A hit answers at once (no queue, no execution), a miss runs and stores its answer.
        Hashing and storing large tensors happen in a thread."""
        cache = record.cache
        assert cache is not None
        stats = scheduler.statistics
        begin = time.monotonic_ns()
        if cache.heavy(request.inputs):
            key = await asyncio.to_thread(cache.key, request)
        else:
            key = cache.key(request)
        entry = cache.lookup(key)
        if entry is not None:
            response = entry.answer(request)
            now = time.monotonic_ns()
            stats.record_cache_hit(
                max(0, now - request.arrival_ns),
                max(0, begin - request.arrival_ns),
                now - begin,
            )
            return response
        missed = time.monotonic_ns() - begin
        try:
            response = await scheduler.admit(request)
        except BaseException:
            stats.record_cache_miss(missed)
            raise
        stored = time.monotonic_ns()
        if cache.heavy(response.outputs):
            await asyncio.to_thread(cache.store, key, response)
        else:
            cache.store(key, response)
        stats.record_cache_miss(missed + time.monotonic_ns() - stored)
        return response

    def _cached_nowait(
        self,
        request: InferRequest,
        record: VersionRecord,
        policy: Policy | None,
        started: int,
        on_done: Callable[[InferResponse | None, BaseException | None], None],
    ) -> asyncio.Future:
        """infer_nowait for a copy with the response cache: a task (cancelling it drops the
        request, as cancelling the scheduler's future does)."""
        task = asyncio.ensure_future(self._cached(request, record, policy, started))

        def finished(done: asyncio.Future) -> None:
            if done.cancelled():
                return
            error = done.exception()
            on_done(None if error is not None else done.result(), error)

        task.add_done_callback(finished)
        return task

    def _route(
        self, policy: Policy | None, request: InferRequest, record: VersionRecord | None
    ) -> tuple[VersionRecord, int]:
        """The version `request` runs on, and when a traffic policy began timing it (0 with
        no policy). With no policy: as before policies existed (`record` when the caller
        resolved it, else a retiring copy's live sequence or the latest), plus counting a
        named version. Under a policy a live sequence stays on its version whatever the split
        says."""
        if policy is None:
            version = request.model_version
            if record is None:
                record = self.registry.route(request)  # a retiring copy's live sequence
            if version and version != "-1":
                self.traffic.count(request.model_name, record.version, NAMED)
            return record, 0
        record = self.registry.sequence_home(request) or self.traffic.route(policy, request, record)
        return record, time.perf_counter_ns()

    def infer_nowait(
        self,
        request: InferRequest,
        on_done: Callable[[InferResponse | None, BaseException | None], None],
        endpoint: str = HTTP_ENDPOINT,
    ) -> asyncio.Future | None:
        """`infer` without a coroutine, for a caller that keeps no task per request (the model
        owner answering a frontend process): `on_done(response, error)` runs on the loop once
        the answer is in. Returns the scheduler's future (cancelling it drops the request if
        it has not run), or None when the request was refused at once (on_done has run)."""
        policy = self._policies.get(request.model_name)
        record: VersionRecord | None = None
        started = 0
        try:
            if self.exiting and not self._continues_sequence(request):
                raise server_exiting()
            record, started = self._route(policy, request, None)
            if record.scheduler.rules.decoupled:  # type: ignore[union-attr]
                raise decoupled_unsupported(endpoint)
            if record.cache is not None:  # response_cache: looked up in a task
                return self._cached_nowait(request, record, policy, started, on_done)
            future = record.scheduler.submit(request)  # type: ignore[union-attr]
        except Exception as exc:
            if policy is not None and record is not None:  # refused by the version picked
                self.traffic.answered(policy, request, record, started, False)
            on_done(None, exc)
            return None
        self.enter()

        def finished(done: asyncio.Future) -> None:
            self.leave()
            if done.cancelled():
                return
            error = done.exception()
            if policy is not None:
                self.traffic.answered(policy, request, record, started, error is None)
            if error is None:
                try:
                    on_done(_select_outputs(done.result(), request.outputs, record), None)
                    return
                except Exception as exc:
                    error = exc
            on_done(None, error)

        future.add_done_callback(finished)
        return future

    async def _answers(
        self, request: InferRequest, record: VersionRecord, routed: VersionRecord | None = None
    ) -> AsyncIterator[StreamItem]:
        """Every answer of one request, as an async iterator; `record`: the version picked;
        `routed`: the one the caller resolved itself, if any (a model that is not decoupled
        is routed again, and counted, by infer_admitted).

        For a decoupled model the request gets a ResponseStream (protocol/stream.py) before it
        is submitted to the version's scheduler, like any request (validation, queue,
        batching, statistics and metrics all apply); the scheduler's future then only says
        whether `execute` took it, and the answers come through the stream, a failed one as an
        item with its error. A model that is not decoupled gives its one answer as a final
        item, and its failure as an exception, like a request refused before it ran. When the
        consumer stops early (a client cancelled, a stream closed), the request is cancelled:
        dropped if still queued, `is_cancelled()` for the model if it runs."""
        scheduler = record.scheduler
        assert scheduler is not None
        if not scheduler.rules.decoupled:  # its one answer; a failure fails the request
            yield StreamItem(final=True, response=await self.infer_admitted(request, routed))
            return
        stream = ResponseStream(asyncio.get_running_loop())
        request.stream = stream
        future = scheduler.submit(request)  # validates; raises at once when refused
        self.enter()

        def taken(done: asyncio.Future) -> None:
            if not done.cancelled() and done.exception() is not None:
                stream.fail(as_server_error(done.exception()))  # type: ignore[arg-type]

        future.add_done_callback(taken)
        first = True
        try:
            while True:
                item = await stream.next()
                if item.response is not None:
                    if first:  # nv_inference_first_response_histogram_ms
                        first = False
                        scheduler.statistics.record_first_response(
                            max(0, time.monotonic_ns() - request.arrival_ns)
                        )
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
            self.leave()

    async def one_answer(
        self, request: InferRequest, record: VersionRecord, error_text: str
    ) -> InferResponse:
        """The single answer of a decoupled model; `error_text` (with {model} and {count})
        when it gives none or more than one. A second answer ends the call at once (the
        request is cancelled), so a model that streams on is never buffered here."""
        answers: list[InferResponse] = []
        async for item in self._answers(request, record):
            if item.error is not None:
                raise item.error
            if item.response is not None:
                answers.append(item.response)
                if len(answers) > 1:
                    break
        if len(answers) != 1:
            count = "no response" if not answers else "more than one response"
            raise InternalError(error_text.format(model=request.model_name, count=count))
        return answers[0]

    def enter(self) -> None:
        """One more inference in flight (shutdown waits for it)."""
        self.inflight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no inference is in flight and no sequence is live (a live sequence's
        next request is still taken while exiting); False if the timeout passed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                await asyncio.wait_for(self._idle.wait(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                return False
            if not self._live_sequences():
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(SEQUENCE_POLL_S)

    def _live_sequences(self) -> int:
        return sum(
            record.scheduler.live_sequences()
            for _, record in self.registry.serving_versions()
            if record.scheduler is not None  # always set on a serving version
        )

    def _continues_sequence(self, request: InferRequest) -> bool:
        """While exiting: a request that continues a live sequence is still served."""
        return self.registry.sequence_home(request) is not None


def _select_outputs(
    response: InferResponse,
    requested: list[RequestedOutput] | None,
    record: VersionRecord,
    lenient: bool = False,
) -> InferResponse:
    """Keep the outputs asked for, in the order asked, classified where asked (`lenient`: a
    decoupled model's answer may leave some out)."""
    if requested is None:
        return response
    by_name = {t.name: t for t in response.outputs}
    batching = record.scheduler.rules.max_batch_size > 0  # type: ignore[union-attr]
    outputs: list[Tensor] = []
    for wanted in requested:
        tensor = by_name.get(wanted.name)
        if tensor is None:
            if lenient:
                continue
            raise InternalError(
                f"model '{response.model_name}' did not produce the requested "
                f"output '{wanted.name}'"
            )
        if wanted.classification > 0:
            tensor = classify(
                tensor, wanted.classification, batching, record.labels.get(wanted.name, [])
            )
        outputs.append(tensor)
    response.outputs = outputs
    return response
