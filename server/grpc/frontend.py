"""Which grpcio server carries the gRPC services (--grpc-server): grpc.aio's
(server/grpc/listener.py, the default) or grpcio's synchronous one (server/grpc/threaded.py).
Both have `port`, `start()` and `stop(grace)`."""

from __future__ import annotations

from typing import Any

from server.core.api import CoreAPI
from server.grpc.listener import GrpcFrontend
from server.grpc.threaded import ThreadedGrpcFrontend
from server.settings import ServerSettings


async def start_grpc_server(core: CoreAPI, settings: ServerSettings) -> Any:
    """Bind and start the gRPC listener (raising OSError when the address cannot be bound)."""
    frontend: GrpcFrontend | ThreadedGrpcFrontend
    if settings.grpc_server == "threads":
        frontend = ThreadedGrpcFrontend(core, settings)
    else:
        frontend = GrpcFrontend(core, settings)
    await frontend.start()
    return frontend
