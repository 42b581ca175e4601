"""The HTTP generate extension: `POST /v2/models/{m}[/versions/{v}]/generate` and
`/generate_stream`, for decoupled models and others alike.

Both decode the body once (protocol/rest/generate.py) and take every answer from the one infer
path's stream (server/core/inference_path.py `stream`). `/generate` wants exactly one answer.
`/generate_stream` sends each answer as a server-sent event as soon as it comes; a flag-only
final answer sends nothing, an error is a `data: {"error": ...}` event (the status is the
error's when it is the first event; a model's own error is 400 on both routes), and a failure
before inference starts is a plain JSON error. Events are written only as fast as the client
reads them: an unread answer stays in the model's bounded buffer, so a slow client holds the
model's sender back (see backends/python/worker/bridge.py) instead of growing the server's
memory.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from protocol import compression
from protocol.errors import InvalidArgument, ServerError, client_error, http_status
from protocol.rest import decode as rest_decode
from protocol.rest.generate import (
    SSE_MEDIA_TYPE,
    InputSchema,
    decode_generate,
    encode_generate,
    generate_body,
    sse_event,
)
from protocol.stream import StreamItem
from protocol.types import InferRequest
from server.core.api import CoreAPI, InputRules, Resolved
from server.http.body import BodyBuffer, BodyLimit
from server.http.responses import DEFAULT_OVERLOAD_STATUS, Handler

log = logging.getLogger(__name__)

ONE_RESPONSE_ERROR = (
    "generate expects model to produce exactly 1 response, use generate "
    "stream for model that generates various number of responses"
)


def input_schemas(rules: InputRules) -> dict[str, InputSchema]:
    """Each input's datatype and full shape (a batching model's first dim is the batch, 1)."""
    batch = (1,) if rules.max_batch_size > 0 else ()
    return {name: InputSchema(rule.wire, batch + rule.dims) for name, rule in rules.inputs.items()}


class GenerateEndpoints:
    """Both generate routes over one core, reading bodies within the frontend's limit; a stream
    whose first answer is a full queue answers the frontend's --overload-status."""

    def __init__(
        self, core: CoreAPI, body_limit: BodyLimit, overload_status: int = DEFAULT_OVERLOAD_STATUS
    ) -> None:
        self.core = core
        self.body_limit = body_limit
        self.overload_status = overload_status

    def routes(self, prefix: str) -> list[tuple[str, Handler, str]]:
        return [
            (prefix + "/generate", self.generate, "POST"),
            (prefix + "/generate_stream", self.generate_stream, "POST"),
        ]

    async def _request(self, request: Request) -> tuple[InferRequest, Resolved]:
        params = request.path_params
        name = params["model"]
        version = "" if params.get("version") is None else str(params["version"])
        record = self.core.resolve(name, version)  # 404 before reading a body for nobody
        settings = self.core.settings
        limit = self.body_limit
        limit.check_declared(request.headers)
        buffer = BodyBuffer(limit)
        try:
            async for chunk in request.stream():
                buffer.add(chunk)
            body = compression.decompress(
                buffer.join(), request.headers.get("content-encoding"), settings.http_max_input_size
            )
            rest_decode.check_json_depth(bytes(body), settings.json_max_depth)
            return decode_generate(
                bytes(body), name, version, input_schemas(self.core.input_rules(record))
            ), record
        finally:
            buffer.release()  # decoded: the request holds its own copy

    async def generate(self, request: Request) -> Response:
        infer_request, record = await self._request(request)
        answers = []
        stream = self.core.infer_stream(infer_request, record)
        try:
            async for item in stream:
                if item.error is not None:
                    raise _as_answered(item.error)
                if item.response is not None:
                    answers.append(item.response)
                    if len(answers) > 1:  # stop (and cancel) at once: nothing piles up here
                        break
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        if len(answers) != 1:
            raise InvalidArgument(ONE_RESPONSE_ERROR)
        return Response(generate_body(answers[0]), media_type="application/json")

    async def generate_stream(self, request: Request) -> Response:
        infer_request, record = await self._request(request)
        answers = self.core.infer_stream(infer_request, record)
        first = await _next_event(answers)  # errors before inference starts: plain JSON
        status = 200
        if first is not None and first.error is not None:
            status = http_status(_as_answered(first.error), self.overload_status)
        return StreamingResponse(
            _events(first, answers), status_code=status, media_type=SSE_MEDIA_TYPE
        )


def _as_answered(error: ServerError) -> ServerError:
    """A model's own error answers 400 with its text here (the generate protocol: a failed
    request is "typically 400"); the server's errors (overload, unavailable) keep their
    statuses."""
    return InvalidArgument(error.message) if error.from_model else error


async def _next_event(answers: AsyncIterator[StreamItem]) -> StreamItem | None:
    """The next answer that makes an event (a flag-only final makes none); None at the end."""
    async for item in answers:
        if item.error is not None or item.response is not None:
            return item
    return None


def _event(item: StreamItem) -> bytes:
    if item.error is not None:
        return sse_event({"error": item.error.message})
    assert item.response is not None
    return sse_event(encode_generate(item.response))


async def _events(
    first: StreamItem | None, answers: AsyncIterator[StreamItem]
) -> AsyncIterator[bytes]:
    try:
        if first is None:
            return
        yield _event(first)
        if first.final:
            return
        async for item in answers:
            if item.error is not None or item.response is not None:
                yield _event(item)
    except ServerError as exc:
        yield sse_event({"error": exc.message})
    except Exception as exc:
        yield sse_event({"error": client_error(exc, log, "generate_stream").message})
    finally:
        await answers.aclose()  # type: ignore[attr-defined]
