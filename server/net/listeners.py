"""The listening sockets: uvicorn servers for HTTP and metrics, and the sockets they accept on.

With --frontend-processes above 1 every frontend process binds its own socket to the same HTTP
and gRPC ports with SO_REUSEPORT, and the kernel spreads new connections across them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from server.net.connections import ConnectionLimits, descriptor_limit, resolve_max_connections
from server.settings import ServerSettings

METRICS_MAX_CONNECTIONS = 64


class Listener(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the application."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket] | None = None) -> None:
        super().__init__(config)
        self.sockets = sockets  # bound before serving (SO_REUSEPORT), or uvicorn binds

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        await super().serve(sockets or self.sockets)


class ServiceStartError(OSError):
    """A listener could not bind its address. The text is Triton's ("failed to start HTTP
    service: Unavailable - Socket '0.0.0.0:8000' already in use"): operators and NVIDIA's qa
    scripts look for it in the log."""

    def __init__(self, service: str, host: str, port: int, cause: OSError) -> None:
        where = f"Socket '{host}:{port}'"
        reason = (
            f"{where} already in use"
            if cause.errno == errno.EADDRINUSE
            else f"{where}: {cause.strerror or cause}"
        )
        super().__init__(cause.errno, f"failed to start {service} service: Unavailable - {reason}")

    def __str__(self) -> str:
        return str(self.strerror)


def uvicorn_listener(
    app: Any,
    host: str,
    port: int,
    verbose: int,
    http: Any = "httptools",
    keep_alive: float = 60.0,
    reuse_port: bool = False,
    service: str = "HTTP",
) -> Listener:
    """A uvicorn server for `app` on a socket bound here, now (ServiceStartError when it cannot
    be), with SO_REUSEPORT where frontend processes share the port."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="none",
        http=http,
        lifespan="off",
        access_log=verbose > 1,
        log_level="info" if verbose else "warning",
        timeout_keep_alive=keep_alive,  # type: ignore[arg-type]  # an int in uvicorn's hints; any number works
        timeout_graceful_shutdown=5,
    )
    return Listener(config, [listening_socket(service, host, port, reuse_port)])


def listening_socket(service: str, host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to (host, port); with `reuse_port` other processes of this server may
    bind it too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServiceStartError(service, host, port, exc) from None
    return sock


def bind_failure(service: str, host: str, port: int) -> ServiceStartError:
    """Why (host, port) cannot be bound, for a listener (grpcio's) that does not say."""
    try:
        listening_socket(service, host, port).close()
    except ServiceStartError as exc:
        return exc
    return ServiceStartError(service, host, port, OSError(errno.EINVAL, "cannot be bound"))


def http_limits(s: ServerSettings) -> ConnectionLimits:
    """The HTTP connection limits (server/net/connections.py), counted by each process for its own
    connections; the default connection limit fits the descriptor limit, raised to its hard
    limit first."""
    limit = resolve_max_connections(
        s.http_max_connections,
        s.http_health_reserved_connections,
        descriptor_limit(),
        share=2 if s.allow_grpc else 1,
    )
    return ConnectionLimits(
        max_connections=limit,
        health_reserve=s.http_health_reserved_connections,
        idle_timeout=s.http_idle_timeout_secs,
        header_timeout=s.http_header_timeout_secs,
        body_timeout=s.http_body_timeout_secs,
        max_header_bytes=s.http_max_header_size,
    )


def metrics_limits(limits: ConnectionLimits) -> ConnectionLimits:
    """The metrics listener: the same timeouts, room for a few scrapers, no health reserve."""
    return dataclasses.replace(
        limits,
        max_connections=min(limits.max_connections, METRICS_MAX_CONNECTIONS),
        health_reserve=0,
    )


async def wait_started(listeners: list[Listener], tasks: list[Any]) -> bool:
    """Wait until every listener is bound; False when one failed (its error is raised)."""
    import asyncio

    while not all(listener.started for listener in listeners):
        for task in tasks:
            if task.done():
                task.result()  # a bind failure surfaces here
                return False
        await asyncio.sleep(0.02)
    return True
