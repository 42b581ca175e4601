"""The HTTP routes of Triton's admin extensions: system and CUDA shared memory, trace settings
and log settings. Each one decodes its body through protocol/, calls the core (so a frontend
process answers from the model owner's state, server/multiprocess/remote_core.py) and encodes
the answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from protocol import shared_memory
from protocol.errors import InvalidArgument
from protocol.rest import settings as rest_settings
from server.core.api import CoreAPI
from server.http.responses import Handler, json_response

# `decoder(*args, document)` of a request's JSON body: the frontend's body reader
# (server/http/routes.py `HttpFrontend.json_document`), with its size limit and parser processes.
JsonDocument = Callable[..., Awaitable[Any]]


class AdminRoutes:
    """Shared memory, trace and logging endpoints over one core."""

    def __init__(self, core: CoreAPI, json_document: JsonDocument) -> None:
        self.core = core
        self.json_document = json_document

    @staticmethod
    def _json(payload: Any) -> Response:
        return json_response(payload)

    # ----- system shared memory ------------------------------------------------------------
    async def system_status(self, request: Request) -> Response:
        name = request.path_params.get("region", "")
        return self._json(self.core.system_shared_memory_status(name))

    async def system_register(self, request: Request) -> Response:
        name = request.path_params.get("region", "")
        if not name:
            raise InvalidArgument(
                "'region name' is necessary to register system shared memory region"
            )
        key, offset, byte_size = await self.json_document(request, shared_memory.decode_register)
        self.core.register_system_shared_memory(name, key, offset, byte_size)
        return Response(b"", status_code=200)

    async def system_unregister(self, request: Request) -> Response:
        self.core.unregister_system_shared_memory(request.path_params.get("region", ""))
        return Response(b"", status_code=200)

    # ----- CUDA shared memory: none on this server --------------------------------------------
    async def cuda_status(self, request: Request) -> Response:
        return self._json(
            self.core.cuda_shared_memory_status(request.path_params.get("region", ""))
        )

    async def cuda_register(self, request: Request) -> Response:
        raise shared_memory.cuda_unsupported(request.path_params.get("region", ""))

    async def cuda_unregister(self, request: Request) -> Response:
        return Response(b"", status_code=200)  # nothing can be registered, so nothing to do

    # ----- trace and logging -------------------------------------------------------------
    async def trace_get(self, request: Request) -> Response:
        return self._json(
            rest_settings.encode_trace_settings(
                self.core.trace_settings(request.path_params.get("model", ""))
            )
        )

    async def trace_post(self, request: Request) -> Response:
        changes = await self.json_document(request, rest_settings.decode_trace_settings)
        return self._json(
            rest_settings.encode_trace_settings(
                self.core.trace_settings(request.path_params.get("model", ""), changes or None)
            )
        )

    async def log_get(self, request: Request) -> Response:
        return self._json(self.core.log_settings())

    async def log_post(self, request: Request) -> Response:
        changes = await self.json_document(request, rest_settings.decode_log_settings)
        return self._json(self.core.log_settings(changes or None))

    def routes(self) -> list[tuple[str, Handler, str]]:
        """(path, handler, method) for every admin route, in Triton's path forms."""
        routes: list[tuple[str, Handler, str]] = [
            ("/v2/trace/setting", self.trace_get, "GET"),
            ("/v2/trace/setting", self.trace_post, "POST"),
            ("/v2/models/{model}/trace/setting", self.trace_get, "GET"),
            ("/v2/models/{model}/trace/setting", self.trace_post, "POST"),
            ("/v2/logging", self.log_get, "GET"),
            ("/v2/logging", self.log_post, "POST"),
        ]
        for kind, status, register, unregister in (
            ("system", self.system_status, self.system_register, self.system_unregister),
            ("cuda", self.cuda_status, self.cuda_register, self.cuda_unregister),
        ):
            for prefix in (f"/v2/{kind}sharedmemory", f"/v2/{kind}sharedmemory/region/{{region}}"):
                routes += [
                    (prefix + "/status", status, "GET"),
                    (prefix + "/register", register, "POST"),
                    (prefix + "/unregister", unregister, "POST"),
                ]
        return routes
