"""The gRPC listener: grpc.aio server options (limits, keepalive, connections), the
grpc.health.v1 service for Kubernetes probes, and start/stop around the services of
server/grpc/services.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protocol.errors import NotFound
from protocol.proto.grpc_service_pb2_grpc import add_GRPCInferenceServiceServicer_to_server
from protocol.proto.traffic_service_pb2_grpc import add_TrafficServiceServicer_to_server
from server.core.api import CoreAPI
from server.grpc.services import (
    HEALTH_POLL_SECONDS,
    InferenceServicer,
    StreamLimits,
    Undecodable,
    abort,
    add_service,
)
from server.grpc.traffic import TrafficServicer
from server.net.connections import descriptor_limit, resolve_max_connections
from server.net.listeners import bind_failure
from server.settings import ServerSettings

# ----- grpc.health.v1 -----------------------------------------------------------------------
KNOWN_SERVICES = (
    "inference.GRPCInferenceService",
    "ascend.traffic.v1.TrafficService",
    "grpc.health.v1.Health",
)
UNKNOWN_SERVICE = "unknown service"


class HealthServicer(health_pb2_grpc.HealthServicer):
    """Kubernetes `grpc:` probes: SERVING exactly when the server is ready (core.ready()).

    The empty name (the whole server, what probes send) and each service this listener serves
    follow readiness; any other name is NOT_FOUND on Check and SERVICE_UNKNOWN on Watch, as the
    gRPC health protocol says (Triton answers every name with readiness: a typo in a probe's
    service name then looks healthy)."""

    def __init__(self, core: CoreAPI, poll_seconds: float = HEALTH_POLL_SECONDS) -> None:
        self.core = core
        self.services = frozenset(("", *KNOWN_SERVICES))
        self.poll_seconds = poll_seconds
        self.closing = asyncio.Event()

    def status(self) -> int:
        return (
            health_pb2.HealthCheckResponse.SERVING
            if self.core.ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> health_pb2.HealthCheckResponse:
        if type(request) is Undecodable:
            await abort(context, request.error)
        if request.service not in self.services:
            await abort(context, NotFound(UNKNOWN_SERVICE))
        return health_pb2.HealthCheckResponse(status=self.status())

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        """The current status at once, then each change; ends (NOT_SERVING) at shutdown."""
        if type(request) is Undecodable:
            await abort(context, request.error)
        if request.service not in self.services:  # one message, and the call stays open
            yield health_pb2.HealthCheckResponse(
                status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            )
            await self.closing.wait()
            return
        last: int | None = None
        while not self.closing.is_set():
            status = self.status()
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            try:
                await asyncio.wait_for(self.closing.wait(), self.poll_seconds)
            except asyncio.TimeoutError:
                pass
        if last != health_pb2.HealthCheckResponse.NOT_SERVING:
            yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)

    def close(self) -> None:
        self.closing.set()


# ----- the server ---------------------------------------------------------------------------
# --grpc-infer-response-compression-level -> grpc core's compression level, as Triton maps it.
# (grpc.aio ignores ServicerContext.set_compression, so the level is set for the whole server;
# the other responses are tiny.) Requests may be compressed whatever the level.
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}


def server_options(settings: ServerSettings) -> list[tuple[str, Any]]:
    """Triton's message limits (2 GiB - 1 by default, grpcio's own default is 4 MiB) for
    responses; requests are bounded by --grpc-max-input-size (default --http-max-input-size).
    No SO_REUSEPORT, so a port already in use fails the start instead of sharing traffic.

    Why requests have their own, smaller bound: grpcio decompresses a request in its core
    before the servicer sees it (and `grpc-encoding` is not in the invocation metadata), and
    the only bound it applies while inflating is `grpc.max_receive_message_length`; with 2 GiB
    there, a 2.2 MB gzip request inflated to 2 GiB. With this bound a request that would inflate
    past it is refused with RESOURCE_EXHAUSTED ("Decompressed message larger than max") and
    inflating stops there (tests/e2e/http/test_connection_limits.py measures the RSS). The same
    number bounds uncompressed requests: grpcio cannot tell the two apart.

    Connections: keepalive with Triton's flags; an idle connection (no call) is sent GOAWAY,
    a silent one that never completes its HTTP/2 handshake is closed, calls per connection are
    bounded (clients queue past it, and wait: see the overload protection option below), and so
    are connections (past it new ones are closed; the
    default fits the descriptor limit beside HTTP's, see server/net/connections.py).
    """
    size = settings.grpc_max_message_size
    received = min(size, settings.grpc_max_input_size or settings.http_max_input_size)
    return [
        ("grpc.max_receive_message_length", received),
        ("grpc.max_send_message_length", size),
        # Off, so that a port in use is an error, unless frontend processes share the port.
        ("grpc.so_reuseport", int(settings.frontend_processes > 1)),
        (
            "grpc.default_compression_level",
            COMPRESSION_LEVELS[settings.grpc_infer_response_compression_level],
        ),
        ("grpc.keepalive_time_ms", settings.grpc_keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.grpc_keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(settings.grpc_keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", settings.grpc_http2_max_pings_without_data),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            settings.grpc_http2_min_recv_ping_interval_without_data_ms,
        ),
        ("grpc.http2.max_ping_strikes", settings.grpc_http2_max_ping_strikes),
        ("grpc.max_connection_idle_ms", settings.grpc_max_connection_idle_ms),
        ("grpc.max_concurrent_streams", settings.grpc_max_concurrent_streams),
        # Off: with it, grpc-core counts a call until the server has freed it, after the client
        # saw it end, and refuses the client's next queued call (REFUSED_STREAM); without it the
        # limit counts open HTTP/2 streams, as the client does, so calls past it wait.
        ("grpc.http.overload_protection", 0),
        (
            "grpc.max_allowed_incoming_connections",
            settings.grpc_max_connections
            or resolve_max_connections(
                None,
                0,
                descriptor_limit(),
                share=2 if settings.allow_http else 1,
                flag="--grpc-max-connections",
            ),
        ),
        ("grpc.server_handshake_timeout_ms", settings.grpc_handshake_timeout_ms),
    ]


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def add_port(server: Any, settings: ServerSettings) -> int:
    """Bind the gRPC address to `server` (grpc.aio's or grpcio's synchronous one); the port,
    or the OSError that says the address cannot be bound."""
    address = _address(settings.grpc_address, settings.grpc_port)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if not port:
        raise bind_failure("GRPC", settings.grpc_address, settings.grpc_port)
    return int(port)


class GrpcFrontend:
    """The running gRPC server. `stop()` first ends the long-lived calls (health watches, open
    streams once their in-flight requests are answered), so shutdown need not wait the whole
    grace period for clients that never hang up."""

    def __init__(self, core: CoreAPI, settings: ServerSettings) -> None:
        self.settings = settings
        self.server = grpc.aio.server(
            options=server_options(settings), interceptors=_interceptors(settings)
        )
        self.inference = InferenceServicer(
            core, settings.grpc_offload_threshold, StreamLimits.of(settings)
        )
        self.health = HealthServicer(core)
        add_service(self.server, add_GRPCInferenceServiceServicer_to_server, self.inference)
        add_service(self.server, health_pb2_grpc.add_HealthServicer_to_server, self.health)
        add_service(self.server, add_TrafficServiceServicer_to_server, TrafficServicer(core))
        self.port = 0

    async def start(self) -> None:
        self.port = add_port(self.server, self.settings)
        await self.server.start()

    async def stop(self, grace: float | None) -> None:
        self.health.close()
        self.inference.close()
        await self.server.stop(grace)


def _interceptors(settings: ServerSettings) -> list[grpc.aio.ServerInterceptor]:
    """Only what is configured: with no restricted protocol, calls pay for no interceptor."""
    if not settings.grpc_restricted_protocol:
        return []
    from server.grpc.restricted import RestrictedProtocolInterceptor

    return [RestrictedProtocolInterceptor(settings.grpc_restricted_protocol)]


async def start_grpc_server(core: CoreAPI, settings: ServerSettings) -> GrpcFrontend:
    """Bind and start the gRPC listener (raising OSError when the address cannot be bound)."""
    frontend = GrpcFrontend(core, settings)
    await frontend.start()
    return frontend
