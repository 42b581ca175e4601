"""The HTTP listener: the HTTP frontend over a core, served by uvicorn with the fast-path
protocol, as server/grpc/listener.py is for gRPC. Used by the model owner and by every frontend
process alike."""

from __future__ import annotations

from server.core.api import CoreAPI
from server.http.fast_path import protocol_class
from server.http.parsers import BodyOffload
from server.http.routes import HttpFrontend
from server.net.listeners import Listener, http_limits, uvicorn_listener
from server.settings import ServerSettings


def http_frontend_listener(core: CoreAPI, settings: ServerSettings) -> tuple[Listener, BodyOffload]:
    """The HTTP frontend over `core` (the model owner's InferenceCore, or a frontend process's
    RemoteCore) and its uvicorn listener; also returns the frontend's parser-process pool, which
    the caller closes at shutdown."""
    s = settings
    frontend = HttpFrontend(core)
    listener = uvicorn_listener(
        frontend.build_app(),
        s.http_address,
        s.http_port,
        s.log_verbose,
        protocol_class(frontend, http_limits(s)),
        s.http_keep_alive_timeout_secs,
        reuse_port=s.frontend_processes > 1,
    )
    return listener, frontend.offload
