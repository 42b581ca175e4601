"""The listening sockets: uvicorn servers for HTTP and metrics, and the sockets they accept on.

With --frontend-processes above 1 every frontend process binds its own socket to the same HTTP
and gRPC ports with SO_REUSEPORT, and the kernel spreads new connections across them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import socket
from typing import Any, Iterator, Optional

import uvicorn

from server.connections import ConnectionLimits, descriptor_limit, resolve_max_connections
from server.settings import ServerSettings

METRICS_MAX_CONNECTIONS = 64


class Listener(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the application."""

    sockets: Optional[list[socket.socket]] = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def serve(self, sockets: Optional[list[socket.socket]] = None) -> None:
        await super().serve(sockets or self.sockets)


def uvicorn_listener(app: Any, host: str, port: int, verbose: int, http: Any = "httptools",
                     keep_alive: float = 60.0, reuse_port: bool = False) -> Listener:
    """A uvicorn server for `app`; with `reuse_port` on a socket bound here with SO_REUSEPORT
    (uvicorn binds its own socket otherwise)."""
    config = uvicorn.Config(app, host=host, port=port, loop="none", http=http,
                            lifespan="off", access_log=verbose > 1,
                            log_level="info" if verbose else "warning",
                            timeout_keep_alive=keep_alive,  # type: ignore[arg-type]
                            timeout_graceful_shutdown=5)
    listener = Listener(config)
    if reuse_port:
        listener.sockets = [reuse_port_socket(host, port)]
    return listener


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) that other processes of this server may bind too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def http_limits(s: ServerSettings) -> ConnectionLimits:
    """The HTTP connection limits (server/connections.py), counted by each process for its own
    connections; the default connection limit fits the descriptor limit, raised to its hard
    limit first."""
    limit = resolve_max_connections(s.http_max_connections, s.http_health_reserved_connections,
                                    descriptor_limit(), share=2 if s.allow_grpc else 1)
    return ConnectionLimits(max_connections=limit,
                            health_reserve=s.http_health_reserved_connections,
                            idle_timeout=s.http_idle_timeout_secs,
                            header_timeout=s.http_header_timeout_secs)


def metrics_limits(limits: ConnectionLimits) -> ConnectionLimits:
    """The metrics listener: the same timeouts, room for a few scrapers, no health reserve."""
    return dataclasses.replace(limits, max_connections=min(limits.max_connections,
                                                           METRICS_MAX_CONNECTIONS),
                               health_reserve=0)


def http_frontend_listener(core: Any, settings: ServerSettings
                           ) -> tuple[Listener, Any]:
    """The HTTP frontend over `core` (the model owner's InferenceCore, or a frontend process's
    RemoteCore) and its uvicorn listener; also returns the frontend's parser-process pool,
    which the caller closes at shutdown."""
    from server.http import HttpFrontend
    from server.http_protocol import protocol_class

    s = settings
    frontend = HttpFrontend(core)
    listener = uvicorn_listener(frontend.build_app(), s.http_address, s.http_port, s.log_verbose,
                                protocol_class(frontend, http_limits(s)),
                                s.http_keep_alive_timeout_secs,
                                reuse_port=s.frontend_processes > 1)
    return listener, frontend.offload


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
