"""The composition root: builds the pieces, starts the listeners, and shuts down in order.

Shutdown order on SIGTERM/SIGINT: readiness turns non-ready at once and new requests are refused
("Server exiting"), repository polling stops, in-flight requests finish, listeners close,
schedulers drain and instances unload, all within --exit-timeout-secs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from backends import registry as backend_registry
from repository import layout
from repository.bounds import ModelBounds
from repository.manager import ManagerSettings, ModelManager
from repository.poller import RepositoryPoller
from repository.registry import ModelRegistry
from repository.s3_mirror import MirrorError, ObjectRepositories
from scheduler import affinity
from scheduler.factory import create_scheduler
from scheduler.rate_limiter import RateLimiter
from server.core.inference_core import InferenceCore
from server.core.inference_path import InferencePath
from server.core.response_cache import ResponseCache, VersionCache
from server.http.fast_path import bounded_protocol_class
from server.http.listener import http_frontend_listener
from server.http.parsers import BodyOffload
from server.malloc import steady_malloc
from server.multiprocess.pool import FrontendPool
from server.net.listeners import (
    Listener,
    ServiceStartError,
    http_limits,
    metrics_limits,
    uvicorn_listener,
    wait_started,
)
from server.observability.custom_metrics import CustomMetricLimits, CustomMetrics
from server.observability.metrics import MetricsOptions, ServerMetrics, worker_restarts
from server.observability.metrics_app import build_metrics_app
from server.settings import ServerSettings
from server.traffic.policy import TrafficControl, TrafficHooks, TrafficSettings

log = logging.getLogger("ascend_serve")


def _settle_heap() -> None:
    """Take what startup built (frameworks, configs, sessions: hundreds of thousands of objects
    that live as long as the process) out of the garbage collector's generations.

    Otherwise every older-generation pass walks all of it again, and those passes land on
    requests: about a tenth of the event loop's CPU per request (bench/FINDINGS.md section 7).
    The young generation is collected less often for the same reason; requests allocate few
    cycles, so this does not grow memory.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    steady_malloc()  # answers free their tensors at once: keep those pages (server/malloc.py)


_GC_YOUNG_THRESHOLD = 10_000  # objects; CPython's default is 700


class ServerApp:
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.registry = ModelRegistry()
        self.metrics = ServerMetrics(
            restarts=lambda: worker_restarts(self.registry),
            options=MetricsOptions(
                counter_latencies=settings.metrics_counter_latencies,
                histogram_latencies=settings.metrics_histogram_latencies,
                summary_latencies=settings.metrics_summary_latencies,
                summary_quantiles=settings.metrics_summary_quantiles,
                summary_samples=settings.metrics_summary_samples,
                cpu_metrics=settings.allow_cpu_metrics,
                interval_ms=settings.metrics_interval_ms,
            ),
        )
        # The one in-process infer: frontends call it through the core, ensembles directly,
        # Python models (BLS) as their backend's host.
        # Gray release: traffic policies, told of every version that starts or stops serving.
        self.traffic = TrafficControl(
            self.registry,
            TrafficSettings(
                settings.traffic_gate_interval_secs, settings.traffic_shadow_max_inflight
            ),
        )
        self.metrics.add_collector(self.traffic)
        custom = CustomMetrics(  # Python models' own metric families
            CustomMetricLimits(
                settings.custom_metric_max_families,
                settings.custom_metric_max_series,
                settings.custom_metric_max_labels,
                settings.custom_metric_max_buckets,
                settings.custom_metric_max_text,
            )
        )
        self.metrics.add_collector(custom)
        self.inference = InferencePath(
            self.registry,
            self.traffic,
            custom_metric=custom.apply,
            declare_metric=custom.declare,
        )
        # The one rate limiter (None with --rate-limit off): every model's scheduler shares it.
        self.rate_limiter = _rate_limiter(settings)
        # s3:// repositories, each mirrored into a local folder that is served as from disk.
        self.objects: ObjectRepositories | None = None
        repositories = list(settings.model_repositories)
        if settings.object_repositories:
            self.objects = ObjectRepositories(
                settings.object_repositories,
                settings.object_store_cache_dir,
                settings.object_store_limits,
            )
            repositories += self.objects.roots
        explicit = settings.model_control_mode == "explicit"
        self.manager = ModelManager(
            ManagerSettings(
                repositories,
                settings.auto_complete_config,
                settings.exit_timeout_secs,
                settings.model_config_name,
                load_dependencies=settings.model_control_mode == "explicit",
                load_retries=settings.model_load_retry_count,
                bounds=ModelBounds(
                    settings.model_max_batch_size,
                    settings.model_max_instances,
                    settings.model_max_sequence_slots,
                    settings.model_warmup_max_requests,
                    settings.model_config_max_tensor_bytes,
                    settings.python_max_response_ring_bytes,
                    settings.model_max_delay_secs,
                ),
            ),
            self.registry,
            TrafficHooks(self.metrics, self.traffic),
            infer=self.inference.infer_admitted,
            host=self.inference,
            response_cache=_response_cache(settings),
            scheduler_factory=partial(create_scheduler, rate_limiter=self.rate_limiter),
            refresh=self.objects.refresh_model if self.objects is not None and explicit else None,
        )
        self.poller: RepositoryPoller | None = None
        if settings.model_control_mode == "poll":
            self.poller = RepositoryPoller(
                repositories,
                self.manager,
                settings.repository_poll_secs,
                settle=settings.repository_settle_secs,
                refresh=self.objects.refresh if self.objects is not None else None,
            )
        self.core = InferenceCore(settings, self.registry, self.manager, self.inference)
        self._stop = asyncio.Event()
        self._listeners: list[Listener] = []
        self._offloads: list[BodyOffload] = []  # each HTTP frontend's parser processes
        self._tasks: list[asyncio.Task] = []
        self.grpc_server: Any | None = None
        self.frontends: FrontendPool | None = None  # --frontend-processes > 1
        self._register_npu_telemetry()

    def _register_npu_telemetry(self) -> None:
        try:
            from npu.telemetry import npu_collector
        except ImportError:
            return
        self.metrics.add_collector(npu_collector())

    def request_stop(self) -> None:
        if not self._stop.is_set():
            log.info("shutdown requested: readiness is now off; draining in-flight requests")
            self.core.exiting = True
            if self.frontends is not None:
                self.frontends.notify_exiting()
            self._stop.set()

    async def start(self) -> bool:
        """Load models and open the listeners. False when startup must abort (--exit-on-error)."""
        self.inference.attach_loop()
        missing = layout.missing_repositories(self.settings.model_repositories)
        reason = f"model repository '{missing[0]}' does not exist" if missing else ""
        if self.objects is not None:
            try:
                await asyncio.to_thread(self.objects.sync_all)
            except MirrorError as exc:  # no bucket, no access, too many objects
                reason = reason or str(exc)
        if reason:
            log.error("%s", reason)
            if self.settings.exit_on_error:
                log.error("exiting: --exit-on-error is set")
                return False
            # As Triton: up, answering metadata, but not live (nor ready).
            self.core.repository_failure = reason
        if self.poller is not None:
            await self.poller.prime()  # before loading: a change during startup is seen later
        failures = await self._startup_load()
        for name, reason in failures.items():
            log.error("model '%s' failed to load: %s", name, reason)
        if failures and self.settings.exit_on_error:
            log.error(
                "exiting: %d model(s) failed to load and --exit-on-error is set", len(failures)
            )
            await self.manager.shutdown()
            return False
        s = self.settings
        if s.allow_http:
            listener, offload = http_frontend_listener(self.core, s)
            self._offloads.append(offload)
            self._listeners.append(listener)
        if s.allow_metrics:
            self.metrics.start()  # per-interval readings (--metrics-interval-ms)
            self._listeners.append(
                uvicorn_listener(
                    build_metrics_app(self.metrics),
                    s.metrics_address,
                    s.metrics_port,
                    s.log_verbose,
                    bounded_protocol_class(metrics_limits(http_limits(s))),
                    s.http_keep_alive_timeout_secs,
                    service="Metrics",
                )
            )
        for listener in self._listeners:
            self._tasks.append(asyncio.create_task(listener.serve()))
        if s.allow_grpc:
            from server.grpc.frontend import start_grpc_server

            self.grpc_server = await start_grpc_server(self.core, s)
        # Wait until every listener is bound before declaring the server live.
        if not await wait_started(self._listeners, self._tasks):
            return False
        if s.frontend_processes > 1 and (s.allow_http or s.allow_grpc):
            self.frontends = FrontendPool(s, self.core)
            try:
                await self.frontends.start()
            except RuntimeError as exc:
                log.error("%s", exc)
                return False
        self.core.started = True
        if self.poller is not None:
            self.poller.start()
        endpoints = [
            f"{kind} {address}:{port}"
            for kind, enabled, address, port in (
                ("HTTP", s.allow_http, s.http_address, s.http_port),
                ("gRPC", s.allow_grpc, s.grpc_address, s.grpc_port),
                ("metrics", s.allow_metrics, s.metrics_address, s.metrics_port),
            )
            if enabled
        ]
        log.info("ascend-serve started: %s", ", ".join(endpoints))
        return True

    async def _startup_load(self) -> dict[str, str]:
        """Everything, except in explicit mode: only --load-model names ('*' for all)."""
        s = self.settings
        if s.model_control_mode != "explicit" or "*" in s.load_models:
            if s.load_models and s.model_control_mode != "explicit":
                log.warning("--load-model is ignored unless --model-control-mode=explicit")
            return await self.manager.load_all()
        return await self.manager.load_models(s.load_models)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        try:
            return await self._run()
        finally:
            if self.objects is not None:  # the mirrors: nothing runs from them any more
                await asyncio.to_thread(self.objects.close)

    async def _run(self) -> int:
        try:
            if not await self.start():
                await self._close_listeners(1.0)
                return 1
        except ServiceStartError as exc:
            log.error("%s", exc)  # Triton's words, which operators and scripts grep for
            await self._close_listeners(1.0)
            await self.manager.shutdown()
            return 1
        except OSError as exc:
            log.error("failed to start: %s", exc)
            await self._close_listeners(1.0)
            await self.manager.shutdown()
            return 1
        _settle_heap()
        if self.settings.colocate_cheap_instances:
            affinity.pin_event_loop(asyncio.get_running_loop())
        await self._stop.wait()
        await self.shutdown()
        return 0

    async def shutdown(self) -> None:
        deadline = time.monotonic() + self.settings.exit_timeout_secs

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        # Keep a little of the budget to answer leftovers and close connections.
        reserve = min(1.0, self.settings.exit_timeout_secs / 4)
        if self.poller is not None:
            # No new loads from here; one already running gets a share of the budget.
            await self.poller.stop(timeout=max(left() - reserve, 0.0) / 2)
        await self.traffic.stop()  # the canary gate
        drained = await self.core.wait_idle(max(left() - reserve, 0.0))
        if not drained:
            log.warning(
                "exit timeout reached with %d request(s) in flight; failing them",
                self.core.inflight,
            )
        try:
            # Drained: nothing is queued. Not drained: leftovers fail with UNAVAILABLE now.
            await asyncio.wait_for(
                self.manager.shutdown(drain_timeout=0.0), timeout=max(left(), 0.1)
            )
        except asyncio.TimeoutError:
            log.warning("exit timeout reached while unloading models")
        # Past the deadline: a Python model still inside execute() must not outlive the server.
        killed = backend_registry.end_child_processes()
        if killed:
            log.warning(
                "killed %d model worker process(es) still running at the exit deadline", killed
            )
        await self.core.wait_idle(min(left(), 0.5))  # let handlers write those answers
        await self._close_listeners(left())
        self.core.tracer.flush()  # traces not yet written (log_frequency 0: all of them)
        self.metrics.stop()
        log.info("ascend-serve stopped")

    async def _close_listeners(self, grace: float) -> None:
        if self.frontends is not None:
            await self.frontends.stop(grace)
        for offload in self._offloads:
            offload.close()  # parser processes: nothing is left for them to parse
        if self.grpc_server is not None:
            await self.grpc_server.stop(grace)
        for listener in self._listeners:
            listener.config.timeout_graceful_shutdown = max(int(grace), 1)
            listener.should_exit = True
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=grace + 1)


def _rate_limiter(settings: ServerSettings) -> RateLimiter | None:
    """The one rate limiter of this process (every model's instances share it), or None with
    --rate-limit off (instance groups' rate_limiter is then ignored, as in Triton)."""
    if settings.rate_limit != "execution_count":
        if settings.rate_limit_resources:
            log.warning("--rate-limit-resource is ignored: --rate-limit is off")
        return None
    limits = ", ".join(
        f"{r.name}:{r.count}" + ("" if r.device is None else f":{r.device}")
        for r in settings.rate_limit_resources
    )
    log.info("rate limiter: execution_count, resources %s", limits or "by default")
    return RateLimiter(settings.rate_limit_resources)


def _response_cache(settings: ServerSettings) -> Callable[[str, bool], VersionCache | None] | None:
    """What binds each loaded copy to the server's response cache; None without --cache-config."""
    if not settings.response_cache_bytes:
        return None
    cache = ResponseCache(
        settings.response_cache_bytes,
        min(settings.http_offload_threshold, settings.grpc_offload_threshold),
    )
    log.info("response cache: local, %d bytes", settings.response_cache_bytes)
    return cache.bind
