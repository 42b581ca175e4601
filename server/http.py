"""The HTTP/REST frontend: KServe v2 plus Triton's extensions, on FastAPI/Starlette.

Handlers are plain Starlette endpoints that read the raw body (no pydantic model on the hot
path), convert once through protocol/rest_codec.py, call server/core.py, and map every error
through protocol/errors.py to `{"error": "..."}` with Triton's status codes.
"""
from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from protocol import compression, rest_codec
from protocol.errors import (InvalidArgument, ServerError, TooLarge, Unsupported,
                             as_server_error)
from repository.config import config_to_json
from scheduler.stats import Duration, VersionStatistics
from server.core import InferenceCore, ModelMetadata

log = logging.getLogger(__name__)

JSON = "application/json"
HEADER_LENGTH = "inference-header-content-length"


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type=JSON)


def error_headers(error: ServerError) -> dict[str, str]:
    """An unknown Content-Encoding answer tells the client which encodings work."""
    if isinstance(error, Unsupported) and "compression" in error.message:
        return {"Accept-Encoding": compression.ACCEPT_ENCODING}
    return {}


def error_response(error: ServerError) -> Response:
    return Response(rest_codec.encode_error(error.message), status_code=error.http_status(),
                    headers=error_headers(error), media_type=JSON)


def empty(status: int = 200) -> Response:
    return Response(b"", status_code=status)


Handler = Callable[[Request], Awaitable[Response]]


def guarded(handler: Handler) -> Handler:
    """Every failure becomes a JSON error with its mapped status; nothing escapes as a 500 page."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ServerError as exc:
            return error_response(exc)
        except Exception as exc:  # noqa: BLE001 - never let a request take the server down
            log.exception("unexpected error on %s", request.url.path)
            return error_response(as_server_error(exc))

    endpoint.__name__ = handler.__name__
    return endpoint


class HttpFrontend:
    def __init__(self, core: InferenceCore) -> None:
        self.core = core
        self.settings = core.settings

    # ----- body handling ------------------------------------------------------------------
    def too_large(self) -> TooLarge:
        limit = self.settings.http_max_input_size
        return TooLarge(f"request body size exceeds the maximum allowed input size of {limit} "
                        f"bytes. Use --http-max-input-size to increase the limit.")

    def check_declared_length(self, headers: Mapping[str, str]) -> int:
        """Refuse a Content-Length over --http-max-input-size before reading; the limit."""
        limit = self.settings.http_max_input_size
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise InvalidArgument(f"invalid Content-Length '{declared}'")
            if int(declared) > limit:
                raise self.too_large()
        return limit

    async def read_body(self, request: Request) -> Any:
        """The whole body with its Content-Encoding undone."""
        body = await self.collect_body(request.stream(), request.headers)
        return compression.decompress(body, request.headers.get("content-encoding"),
                                      self.settings.http_max_input_size)

    async def collect_body(self, chunks: AsyncIterator[bytes], headers: Mapping[str, str]) -> bytes:
        """The whole body as sent, refusing anything over --http-max-input-size before it is
        buffered."""
        limit = self.check_declared_length(headers)
        parts: list[bytes] = []
        total = 0
        async for chunk in chunks:
            total += len(chunk)
            if total > limit:
                raise self.too_large()
            if chunk:
                parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def json_body(self, request: Request) -> Any:
        body = await self.read_body(request)
        if not body.strip():
            return None
        rest_codec.check_json_depth(body, self.settings.json_max_depth)
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None

    # ----- health and metadata ------------------------------------------------------------
    async def live(self, request: Request) -> Response:
        if self.core.exiting:
            return error_response(_exiting())
        return empty(200 if self.core.live() else 400)

    async def ready(self, request: Request) -> Response:
        if self.core.exiting:
            return error_response(_exiting())
        return empty(200 if self.core.ready() else 400)

    async def server_metadata(self, request: Request) -> Response:
        return json_response(self.core.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        name, version = _model_path(request)
        return json_response(metadata_json(self.core.model_metadata(name, version)))

    async def model_ready(self, request: Request) -> Response:
        name, version = _model_path(request)
        if self.core.model_ready(name, version):
            return empty()
        return json_response({"error": "Model version not ready"}, 400)

    async def model_config(self, request: Request) -> Response:
        name, version = _model_path(request)
        return json_response(config_to_json(self.core.model_config(name, version)))

    async def model_stats(self, request: Request) -> Response:
        name, version = _model_path(request)
        return json_response({"model_stats": [stats_json(s) for s in self.core.statistics(name, version)]})

    async def all_stats(self, request: Request) -> Response:
        return json_response({"model_stats": [stats_json(s) for s in self.core.statistics()]})

    # ----- inference ----------------------------------------------------------------------
    async def infer(self, request: Request) -> Response:
        """The routed (ASGI) form of infer; the server answers infer POSTs in
        server/http_protocol.py without ASGI."""
        name, version = _model_path(request)
        payload, headers, media_type = await self.infer_reply(
            name, version, request.headers, request.stream())
        return Response(payload, status_code=200, headers=headers, media_type=media_type)

    async def infer_reply(self, name: str, version: str, headers: Mapping[str, str],
                          chunks: AsyncIterator[bytes]) -> tuple[bytes, dict[str, str], str]:
        """Body in, (payload, extra headers, content type) out: decode once, infer, encode once."""
        return await self.infer_body(name, version, headers, await self.collect_body(chunks, headers))

    async def infer_body(self, name: str, version: str, headers: Mapping[str, str],
                         body: Any) -> tuple[bytes, dict[str, str], str]:
        """infer_reply for a body already read (and within the size limit)."""
        body = compression.decompress(body, headers.get("content-encoding"),
                                      self.settings.http_max_input_size)
        header_length = rest_codec.parse_header_length(headers.get(HEADER_LENGTH))
        if header_length == 0:
            infer_request = self._decode_raw(body, name, version)
        else:
            infer_request = rest_codec.decode_infer_request(
                body, header_length, name, version, max_json_depth=self.settings.json_max_depth,
                max_bytes=self.settings.http_max_input_size)
        # Raw requests set binary_data_output themselves (all outputs come back binary).
        binary_default = bool(infer_request.parameters.get("binary_data_output", False))
        response = await self.core.infer(infer_request)
        payload, json_length = rest_codec.encode_infer_response(
            response, infer_request.outputs, binary_default)
        extra: dict[str, str] = {}
        media_type = JSON
        if json_length is not None:
            extra["Inference-Header-Content-Length"] = str(json_length)
            media_type = "application/octet-stream"
        encoding = compression.choose_response_encoding(headers.get("accept-encoding"))
        if encoding:
            payload = compression.compress(payload, encoding)
            extra["Content-Encoding"] = encoding
        return payload, extra, media_type

    def _decode_raw(self, body: bytes, name: str, version: str) -> Any:
        config = self.core.model_config(name, version)
        if len(config.input) != 1:
            raise InvalidArgument(rest_codec.raw_input_count_message(name, len(config.input)))
        spec = config.input[0]
        from protocol.datatypes import config_to_wire
        from protocol.model_config_pb2 import DataType

        return rest_codec.decode_raw_request(
            body, name, version, spec.name, config_to_wire(DataType.Name(spec.data_type)),
            [int(d) for d in spec.dims], config.max_batch_size)

    # ----- repository ---------------------------------------------------------------------
    async def repository_index(self, request: Request) -> Response:
        payload = await self.json_body(request)
        ready = False
        if payload is not None:
            if not isinstance(payload, dict):
                raise InvalidArgument("the repository index request must be a JSON object")
            ready = payload.get("ready", False)
            if not isinstance(ready, bool):
                raise InvalidArgument("Invalid value for 'ready': expected a boolean")
        entries = []
        for entry in self.core.repository_index(ready):
            item: dict[str, str] = {"name": entry.name}
            if entry.version:
                item["version"] = entry.version
            if entry.state:
                item["state"] = entry.state
            if entry.reason:
                item["reason"] = entry.reason
            entries.append(item)
        return json_response(entries)

    async def repository_load(self, request: Request) -> Response:
        name = request.path_params["model"]
        payload = await self.json_body(request) or {}
        parameters = _parameters(payload)
        config = None
        files: dict[str, bytes] = {}
        for key, value in parameters.items():
            if not isinstance(value, str):
                raise InvalidArgument(f"failed to load '{name}': parameter '{key}' must be a string")
            if key == "config":
                config = value
            elif key.startswith("file:"):
                import base64
                import binascii

                try:
                    files[key[len("file:"):]] = base64.b64decode(value, validate=True)
                except binascii.Error:
                    raise InvalidArgument(f"failed to load '{name}': file content for '{key}' "
                                          f"is not valid base64") from None
        await self.core.load_model(name, config, files or None)
        return empty()

    async def repository_unload(self, request: Request) -> Response:
        name = request.path_params["model"]
        payload = await self.json_body(request) or {}
        dependents = _parameters(payload).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidArgument("'unload_dependents' must be a boolean")
        await self.core.unload_model(name, dependents)
        return empty()

    async def repository_named(self, request: Request) -> Response:
        raise Unsupported("'repository_name' specification is not supported")

    # ----- app ----------------------------------------------------------------------------
    def build_app(self) -> FastAPI:
        app = FastAPI(title="ascend-serve", docs_url=None, redoc_url=None, openapi_url=None)
        routes: list[tuple[str, Handler, str]] = [
            ("/v2/health/live", self.live, "GET"),
            ("/v2/health/ready", self.ready, "GET"),
            ("/v2", self.server_metadata, "GET"),
            ("/v2/models/stats", self.all_stats, "GET"),
            ("/v2/repository/index", self.repository_index, "POST"),
            ("/v2/repository/models/{model}/load", self.repository_load, "POST"),
            ("/v2/repository/models/{model}/unload", self.repository_unload, "POST"),
            ("/v2/repository/{repo}/index", self.repository_named, "POST"),
            ("/v2/repository/{repo}/models/{model}/load", self.repository_named, "POST"),
            ("/v2/repository/{repo}/models/{model}/unload", self.repository_named, "POST"),
        ]
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version:int}"):
            routes += [
                (prefix, self.model_metadata, "GET"),
                (prefix + "/ready", self.model_ready, "GET"),
                (prefix + "/config", self.model_config, "GET"),
                (prefix + "/stats", self.model_stats, "GET"),
                (prefix + "/infer", self.infer, "POST"),
            ]
        for path, handler, method in routes:
            app.add_route(path, guarded(handler), methods=[method], include_in_schema=False)

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
            text = {404: "Not Found", 405: "Method Not Allowed"}.get(exc.status_code, str(exc.detail))
            return json_response({"error": text}, exc.status_code)

        return app



def _exiting() -> ServerError:
    from protocol.errors import Unavailable

    return Unavailable("Server exiting")


def _model_path(request: Request) -> tuple[str, str]:
    params = request.path_params
    version = params.get("version")
    return params["model"], "" if version is None else str(version)


def _parameters(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise InvalidArgument("the request body must be a JSON object")
    parameters = payload.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidArgument("'parameters' must be a JSON object")
    return parameters


def metadata_json(meta: ModelMetadata) -> dict[str, Any]:
    def tensors(items: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in items]

    return {"name": meta.name, "versions": meta.versions, "platform": meta.platform,
            "inputs": tensors(meta.inputs), "outputs": tensors(meta.outputs)}


def _duration(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def stats_json(stats: VersionStatistics) -> dict[str, Any]:
    """Triton's statistics JSON: every key present, counts as JSON numbers."""
    with stats._lock:
        return {
            "name": stats.name,
            "version": stats.version,
            "last_inference": stats.last_inference_ms,
            "inference_count": stats.inference_count,
            "execution_count": stats.execution_count,
            "inference_stats": {
                "success": _duration(stats.success),
                "fail": _duration(stats.fail),
                "queue": _duration(stats.queue),
                "compute_input": _duration(stats.compute_input),
                "compute_infer": _duration(stats.compute_infer),
                "compute_output": _duration(stats.compute_output),
                "cache_hit": _duration(stats.cache_hit),
                "cache_miss": _duration(stats.cache_miss),
            },
            "response_stats": {},
            "batch_stats": [
                {"batch_size": size,
                 "compute_input": _duration(b.compute_input),
                 "compute_infer": _duration(b.compute_infer),
                 "compute_output": _duration(b.compute_output)}
                for size, b in sorted(stats.batch_stats.items())],
            "memory_usage": [],
        }
