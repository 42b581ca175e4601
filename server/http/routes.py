"""The HTTP/REST frontend: KServe v2 plus Triton's extensions, on FastAPI/Starlette.

Handlers are plain Starlette endpoints that read the raw body (no pydantic model on the hot
path), convert once through protocol/rest/decode.py and protocol/rest/encode.py, call the core
(server/core/api.py), and map every error through protocol/errors.py (by
server/http/responses.py) to `{"error": "..."}` with Triton's status codes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from protocol import compression
from protocol import traffic as traffic_json
from protocol.config_json import config_to_json
from protocol.errors import (
    InvalidArgument,
    Unsupported,
    overload_http_status,
    server_exiting,
)
from protocol.rest import decode as rest_decode
from protocol.rest import encode as rest_encode
from protocol.rest.common import Buffer
from protocol.types import InferRequest, InferResponse
from server.core.api import CoreAPI, InputRule, Resolved
from server.http.admin import AdminRoutes
from server.http.body import BodyBudget, BodyBuffer, BodyLimit, resolve_inflight_budget
from server.http.generate import GenerateEndpoints
from server.http.parsers import (
    BodyOffload,
    inflate_small,
    output_sizes,
    parse_json_document,
)
from server.http.receive import receive_stamps
from server.http.responses import JSON, Handler, empty, error_response, guarded, json_response
from server.restricted import HttpGuard, RestrictionMiddleware

HEADER_LENGTH = "inference-header-content-length"
# An infer answer's body: one buffer, or its pieces (the JSON, then views of binary outputs).
Payload = bytes | list[Buffer]


class HttpFrontend:
    def __init__(self, core: CoreAPI) -> None:
        self.core = core
        self.settings = core.settings
        # --http-max-input-size per body; --http-max-inflight-body-size for all of them at once
        # (one budget for the routed endpoints and the direct infer path of this process).
        max_input = self.settings.http_max_input_size
        self.body_limit = BodyLimit(
            max_input,
            BodyBudget(
                resolve_inflight_budget(self.settings.http_max_inflight_body_size, max_input)
            ),
        )
        # --overload-status: the HTTP status of a full queue, for every error this frontend maps.
        self.overload_status = overload_http_status(self.settings.overload_status)
        # --http-restricted-api (server/restricted.py); None when nothing is restricted.
        restricted = self.settings.http_restricted_api
        self.guard: HttpGuard | None = HttpGuard(restricted) if restricted else None
        # Large bodies and responses are worked on in parser processes (server/http/parsers.py).
        self.offload = BodyOffload(
            self.settings.http_offload_threshold, self.settings.http_parser_processes
        )

    # ----- body handling ------------------------------------------------------------------
    async def json_document(self, request: Request, decoder: Callable[..., Any], *args: Any) -> Any:
        """`decoder(*args, document)` of a repository route's JSON body (None when blank).

        Small bodies are decompressed and parsed here; larger ones (over
        --http-offload-threshold, as sent or once inflated) in a parser process
        (server/http/parsers.py), with the same checks and error texts.
        """
        headers = request.headers
        self.body_limit.check_declared(headers)
        buffer = BodyBuffer(self.body_limit)
        try:
            async for chunk in request.stream():
                buffer.add(chunk)
            return await self._json_document(buffer, headers, decoder, *args)
        finally:
            buffer.release()

    async def _json_document(
        self,
        buffer: BodyBuffer,
        headers: Mapping[str, str],
        decoder: Callable[..., Any],
        *args: Any,
    ) -> Any:
        """json_document once the body is read (while the budget still counts it)."""
        encoding = headers.get("content-encoding")
        max_size = self.settings.http_max_input_size
        offload = self.offload
        if not offload.wants(buffer.total):
            body = buffer.join()
            if not encoding or not offload.enabled:
                return decoder(
                    *args,
                    parse_json_document(body, encoding, max_size, self.settings.json_max_depth),
                )
            inflated = inflate_small(body, encoding, max_size, offload.threshold)
            if inflated is not None:
                return decoder(
                    *args,
                    parse_json_document(inflated, None, max_size, self.settings.json_max_depth),
                )
        return await offload.json_document(
            buffer.parts, encoding, max_size, self.settings.json_max_depth, decoder, *args
        )

    # ----- health and metadata ------------------------------------------------------------
    async def live(self, request: Request) -> Response:
        if self.core.exiting:
            return error_response(server_exiting())
        return _health(request, "live", self.core.live())

    async def ready(self, request: Request) -> Response:
        if self.core.exiting:
            return error_response(server_exiting())
        return _health(request, "ready", self.core.ready())

    async def server_metadata(self, request: Request) -> Response:
        return json_response(self.core.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        name, version = _model_path(request)
        metadata = self.core.model_metadata(name, version)
        return json_response(rest_encode.encode_model_metadata(metadata))

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
        return json_response(
            rest_encode.encode_statistics_response(self.core.statistics(name, version))
        )

    async def all_stats(self, request: Request) -> Response:
        return json_response(rest_encode.encode_statistics_response(self.core.statistics()))

    # ----- inference ----------------------------------------------------------------------
    async def infer(self, request: Request) -> Response:
        """The routed (ASGI) form of infer; the server answers infer POSTs in
        server/http/fast_path.py without ASGI."""
        name, version = _model_path(request)
        payload, headers, media_type = await self.infer_reply(
            name, version, request.headers, request.stream()
        )
        return Response(
            joined_payload(payload), status_code=200, headers=headers, media_type=media_type
        )

    async def infer_reply(
        self, name: str, version: str, headers: Mapping[str, str], chunks: AsyncIterator[bytes]
    ) -> tuple[Payload, dict[str, str], str]:
        """Body in, (payload, extra headers, content type) out: decode once, infer, encode once."""
        start = time.monotonic_ns() if self.core.may_trace else 0
        self.body_limit.check_declared(headers)
        buffer = BodyBuffer(self.body_limit)
        try:
            async for chunk in chunks:
                buffer.add(chunk)
            body = buffer.parts if self.offload.wants(buffer.total) else buffer.join()
            received = receive_stamps(start)
            return await self.infer_body(name, version, headers, body, received)
        finally:
            buffer.release()  # the body is counted until its request is answered

    async def infer_body(
        self, name: str, version: str, headers: Mapping[str, str], body: Any, received: tuple = ()
    ) -> tuple[Payload, dict[str, str], str]:
        """infer_reply for a body already read (and within the size limit): one buffer, or the
        list of its chunks when it is over --http-offload-threshold. The payload is one buffer
        or a list of them (the JSON, then binary outputs as views of their arrays)."""
        if type(body) is list or (len(body) > self.offload.threshold and self.offload.enabled):
            infer_request, record = await self._decode_large(name, version, headers, body)
        else:
            encoding = headers.get("content-encoding")
            if encoding and self.offload.enabled:
                inflated = inflate_small(
                    body, encoding, self.settings.http_max_input_size, self.offload.threshold
                )
            else:
                inflated = compression.decompress(body, encoding, self.settings.http_max_input_size)
            if inflated is None:  # a small body that inflates past the threshold
                infer_request, record = await self._decode_large(name, version, headers, [body])
            else:
                infer_request, record = self._decode(name, version, headers, inflated)
        self._received(infer_request, headers, received)
        response = await self.core.infer(infer_request, record)
        return await self.encode_answer(response, infer_request, headers)

    # ----- inference with no task (server/http/infer_nowait.py) ---------------------------
    def nowait_fits(self, headers: Mapping[str, str]) -> bool:
        """Whether an infer request can be served with no task: a JSON or JSON+binary body
        (not raw binary) declared within --http-offload-threshold, neither compressed nor
        asking for a compressed answer. Anything else needs an await on its way (a parser
        process, a thread, the version resolved first) and takes the task path."""
        declared = headers.get("content-length")
        if declared is None or not declared.isdigit():
            return False
        size = int(declared)  # over the body limit: refused by the task path before it is read
        if size > self.offload.threshold or size > self.body_limit.max_bytes:
            return False
        length = headers.get(HEADER_LENGTH)  # raw binary (0) resolves the version first
        if length is not None and (not length.isdigit() or int(length) == 0):
            return False
        if "transfer-encoding" in headers:
            return False
        if compression.is_compressed(headers.get("content-encoding")):
            return False
        return compression.choose_response_encoding(headers.get("accept-encoding")) is None

    def decode_small(
        self, name: str, version: str, headers: Mapping[str, str], body: Any, received: tuple
    ) -> InferRequest:
        """The request of a body `nowait_fits` took, decoded here on the loop."""
        infer_request, _ = self._decode(name, version, headers, body)
        self._received(infer_request, headers, received)
        return infer_request

    def _received(
        self, infer_request: InferRequest, headers: Mapping[str, str], received: tuple
    ) -> None:
        if self.core.propagates_trace:  # OpenTelemetry mode: the client's W3C trace context
            infer_request.traceparent = headers.get("traceparent") or ""
        infer_request.received = received  # receive timestamps where tracing is possible

    def encode_small(
        self, response: InferResponse, infer_request: InferRequest
    ) -> tuple[Payload, dict[str, str], str] | None:
        """The answer's pieces, encoded here, when no output is large enough to be encoded off
        the loop (then None: `encode_answer` does it); never compressed (`nowait_fits`)."""
        binary_default = _binary_default(infer_request)
        outputs = infer_request.outputs
        offload = self.offload
        as_json, binary_objects = output_sizes(response, outputs, binary_default)
        if offload.wants(as_json) or offload.wants(binary_objects):
            return None
        payload, json_length = rest_encode.encode_infer_response_parts(
            response, outputs, binary_default
        )
        return payload, *_answer_headers(json_length)

    async def encode_answer(
        self, response: InferResponse, infer_request: InferRequest, headers: Mapping[str, str]
    ) -> tuple[Payload, dict[str, str], str]:
        """(payload, extra headers, content type) of an answer, large outputs encoded off the
        loop, compressed when the client asks for it."""
        binary_default = _binary_default(infer_request)
        offload = self.offload
        payload: Payload
        as_json, binary_objects = output_sizes(response, infer_request.outputs, binary_default)
        if offload.enabled and offload.wants(as_json):
            payload, json_length = await offload.encode_response(
                response, infer_request.outputs, binary_default
            )
        elif offload.wants(binary_objects):
            # large binary BYTES outputs: serialized in steps (protocol/datatypes.py), so a
            # thread lets the loop run between them
            payload, json_length = await asyncio.to_thread(
                rest_encode.encode_infer_response, response, infer_request.outputs, binary_default
            )
        else:  # the pieces as they are: the direct path writes them without joining them
            payload, json_length = rest_encode.encode_infer_response_parts(
                response, infer_request.outputs, binary_default
            )
        extra, media_type = _answer_headers(json_length)
        encoding = compression.choose_response_encoding(headers.get("accept-encoding"))
        if encoding:
            whole = joined_payload(payload)
            if offload.wants(len(whole)):  # zlib releases the GIL: a thread is enough
                payload = await asyncio.to_thread(compression.compress, whole, encoding)
            else:
                payload = compression.compress(whole, encoding)
            extra["Content-Encoding"] = encoding
        return payload, extra, media_type

    def _decode(
        self, name: str, version: str, headers: Mapping[str, str], body: Any
    ) -> tuple[InferRequest, Resolved | None]:
        """A small (decompressed) body, decoded here on the loop."""
        header_length = rest_decode.parse_header_length(headers.get(HEADER_LENGTH))
        if header_length == 0:
            return self._decode_raw(body, name, version)
        return rest_decode.decode_infer_request(
            body,
            header_length,
            name,
            version,
            max_json_depth=self.settings.json_max_depth,
            max_bytes=self.settings.http_max_input_size,
        ), None

    async def _decode_large(
        self, name: str, version: str, headers: Mapping[str, str], body: Any
    ) -> tuple[InferRequest, Resolved | None]:
        """A body over --http-offload-threshold (or one that inflates past it).

        Uncompressed JSON+binary bodies whose JSON part is small and holds no BYTES tensor, and
        uncompressed raw bodies of fixed-size types, decode here: their tensors are views over
        the body, so that is O(number of tensors). Everything else goes to a parser process.
        """
        parts = body if type(body) is list else [body]
        encoding = headers.get("content-encoding")
        compressed = compression.is_compressed(encoding)
        header_length = rest_decode.parse_header_length(headers.get(HEADER_LENGTH))
        max_size = self.settings.http_max_input_size
        if header_length == 0:
            resolved = record, input_name, rule = self._raw_input(name, version)
            if not compressed and "BYTES" not in str(rule.wire):
                return self._decode_raw(_joined(parts), name, version, resolved)
            request = await self.offload.raw_request(
                parts,
                encoding,
                max_size,
                name,
                version,
                input_name,
                rule.wire,
                list(rule.dims),
                self.core.input_rules(record).max_batch_size,
            )
            return request, record
        if not compressed and header_length is not None and header_length <= self.offload.threshold:
            head = _prefix(parts, header_length)
            if b'"BYTES"' not in head:
                return self._decode(name, version, headers, _joined(parts))
        request = await self.offload.infer_request(
            parts, encoding, max_size, header_length, name, version, self.settings.json_max_depth
        )
        return request, None

    def _raw_input(self, name: str, version: str) -> tuple[Resolved, str, InputRule]:
        """A raw binary body is the model's one input: the version is resolved first (its
        rules say which input that is), and the request then goes to that same version.
        Returns the version, the input's name and its rule."""
        record = self.core.resolve(name, version)
        rules = self.core.input_rules(record)
        if len(rules.inputs) != 1:
            raise InvalidArgument(rest_decode.raw_input_count_message(name, len(rules.inputs)))
        ((input_name, rule),) = rules.inputs.items()
        return record, input_name, rule

    def _decode_raw(
        self,
        body: Any,
        name: str,
        version: str,
        resolved: tuple[Resolved, str, InputRule] | None = None,
    ) -> tuple[InferRequest, Resolved]:
        record, input_name, rule = resolved or self._raw_input(name, version)
        max_batch_size = self.core.input_rules(record).max_batch_size
        request = rest_decode.decode_raw_request(
            body, name, version, input_name, rule.wire, list(rule.dims), max_batch_size
        )
        return request, record

    # ----- repository ---------------------------------------------------------------------
    async def repository_index(self, request: Request) -> Response:
        ready = await self.json_document(request, rest_decode.decode_index_ready)
        return json_response(rest_encode.encode_repository_index(self.core.repository_index(ready)))

    async def repository_load(self, request: Request) -> Response:
        name = request.path_params["model"]
        config, files = await self.json_document(request, rest_decode.decode_load_parameters, name)
        await self.core.load_model(name, config, files or None)
        return empty()

    async def repository_unload(self, request: Request) -> Response:
        name = request.path_params["model"]
        dependents = await self.json_document(request, rest_decode.decode_unload_dependents)
        await self.core.unload_model(name, dependents)
        return empty()

    async def repository_named(self, request: Request) -> Response:
        raise Unsupported("'repository_name' specification is not supported")

    # ----- gray release: /v2/models/{model}/traffic (server/traffic/policy.py) --------------------
    async def traffic_get(self, request: Request) -> Response:
        return json_response(self.core.traffic_policy(request.path_params["model"]))

    async def traffic_put(self, request: Request) -> Response:
        name = request.path_params["model"]
        self.core.traffic_policy(name)  # an unknown model is a 404 whatever the body says
        spec = await self.json_document(request, traffic_json.decode_traffic)
        return json_response(self.core.set_traffic_policy(name, spec))

    async def traffic_delete(self, request: Request) -> Response:
        return json_response(self.core.delete_traffic_policy(request.path_params["model"]))

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
            # Triton's HTTP index ignores a repository name (its gRPC index refuses one).
            ("/v2/repository/{repo}/index", self.repository_index, "POST"),
            ("/v2/repository/{repo}/models/{model}/load", self.repository_named, "POST"),
            ("/v2/repository/{repo}/models/{model}/unload", self.repository_named, "POST"),
            ("/v2/models/{model}/traffic", self.traffic_get, "GET"),
            ("/v2/models/{model}/traffic", self.traffic_put, "PUT"),
            ("/v2/models/{model}/traffic", self.traffic_delete, "DELETE"),
        ]
        generate = GenerateEndpoints(self.core, self.body_limit, self.overload_status)
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version:int}"):
            routes += [
                (prefix, self.model_metadata, "GET"),
                (prefix + "/ready", self.model_ready, "GET"),
                (prefix + "/config", self.model_config, "GET"),
                (prefix + "/stats", self.model_stats, "GET"),
                (prefix + "/infer", self.infer, "POST"),
            ]
            routes += generate.routes(prefix)
        routes += AdminRoutes(self.core, self.json_document).routes()  # shm, trace, logging
        for path, handler, method in routes:
            app.add_route(
                path,
                guarded(handler, self.overload_status),
                methods=[method],
                include_in_schema=False,
            )

        if self.guard is not None:  # before routing: a restricted path is 403 on any method
            app.add_middleware(RestrictionMiddleware, guard=self.guard)

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
            text = {404: "Not Found", 405: "Method Not Allowed"}.get(
                exc.status_code, str(exc.detail)
            )
            return json_response({"error": text}, exc.status_code)

        return app


def _binary_default(infer_request: InferRequest) -> bool:
    """Whether outputs come back binary unless asked otherwise (raw requests set it)."""
    return bool(infer_request.parameters.get("binary_data_output", False))


def _answer_headers(json_length: int | None) -> tuple[dict[str, str], str]:
    """The extra headers and content type of an answer whose JSON is `json_length` bytes
    followed by binary outputs (None: all JSON)."""
    if json_length is None:
        return {}, JSON
    return {"Inference-Header-Content-Length": str(json_length)}, "application/octet-stream"


def joined_payload(payload: Payload) -> bytes:
    """An answer's pieces as one bytes (for a writer that takes one buffer, or to compress)."""
    if type(payload) is list:
        return payload[0] if len(payload) == 1 and type(payload[0]) is bytes else b"".join(payload)
    return payload  # type: ignore[return-value]  # one buffer already


def _joined(parts: list) -> Any:
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _prefix(parts: list, size: int) -> bytes:
    """The first `size` bytes of a body held as chunks."""
    out = []
    for part in parts:
        if size <= 0:
            break
        piece = bytes(memoryview(part)[:size])
        out.append(piece)
        size -= len(piece)
    return b"".join(out)


def _health(request: Request, key: str, state: bool) -> Response:
    """200 or 400 with an empty body, as Triton and tritonclient expect; `{"live": true}` (or
    `"ready"`) when the client asks for JSON (`Accept: application/json`), as KServe's v2 spec
    writes the answer and KServe's own client reads it."""
    status = 200 if state else 400
    if _accepts_json(request.headers.get("accept", "")):
        return json_response({key: state}, status)
    return empty(status)


def _accepts_json(accept: str) -> bool:
    """Whether an Accept header names application/json itself (not only */*) with q above 0."""
    for media_range in accept.split(","):
        media_type, *params = (part.strip() for part in media_range.split(";"))
        if media_type.lower() != JSON:
            continue
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def _model_path(request: Request) -> tuple[str, str]:
    params = request.path_params
    version = params.get("version")
    return params["model"], "" if version is None else str(version)
