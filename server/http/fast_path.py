"""The HTTP connection protocol: uvicorn's httptools protocol, with infer POSTs answered directly.

Why not plain ASGI for inference: at concurrency 1 the event loop's CPU per request *is* the
latency the server adds, and on a small machine the ASGI plumbing around one infer call cost more
than decoding, validating and encoding it (bench/FINDINGS.md section 7): a receive/send message
dict each way, an `asyncio.Event` wait, a second task watching for a disconnect, and two socket
writes per response (status and headers, then body), each a syscall that also wakes the client.

Here uvicorn still parses, keeps connections alive, pipelines, pauses reading and handles
shutdown; only the request's task differs. For `POST /v2/models/{m}[/versions/{v}]/infer` the task
reads the body uvicorn buffered, calls `HttpFrontend.infer_body` and writes status, headers and
body in one `transport.write`. A client that disconnects cancels the task from
`connection_lost` (so its queued request never runs). As everywhere in uvicorn, a client that
half-closes (shuts down its sending side) counts as gone: at the TCP level that FIN looks the
same as a client that closed, and dropping the abandoned request is the case worth having.
Every other request goes to the ASGI (FastAPI) app unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from protocol.errors import Cancelled
from server.http.body import BodyBudgetExhausted, BodyBuffer
from server.http.infer_nowait import NoTaskInfer
from server.http.receive import BodySink, DirectReceiver, open_sink, receive_stamps
from server.http.responses import JSON, http_error
from server.net.connections import HEALTH_PATHS, ConnectionLimits, RateLimitedLog

log = logging.getLogger(__name__)

INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")
# The same path as the raw URL, when it has no query string or fragment, no percent-escapes
# and only ASCII: the URL as sent is then the path as uvicorn would decode it.
_PLAIN_INFER_URL = re.compile(rb"/v2/models/([^/?#%\x80-\xff]+)(?:/versions/([0-9]+))?/infer")
# The request headers the infer path reads (uvicorn gives names in lower case).
_WANTED_HEADERS = {
    name.encode("latin-1"): name
    for name in (
        "content-length",
        "content-encoding",
        "inference-header-content-length",
        "accept-encoding",
        "traceparent",
        "transfer-encoding",
    )
}
# Above this size the payload is written on its own rather than joined to the headers (a copy).
_JOIN_LIMIT = 64 * 1024


def fast_path_supported() -> bool:
    """The uvicorn internals the fast path hooks into (stable since uvicorn 0.29)."""
    cycle_fields = (
        "body",
        "more_body",
        "message_event",
        "disconnected",
        "keep_alive",
        "waiting_for_100_continue",
        "flow",
        "on_response",
        "response_complete",
    )
    init = RequestResponseCycle.__init__.__code__.co_names
    return hasattr(HttpToolsProtocol, "_start_asgi_task") and all(
        name in init for name in cycle_fields
    )


def protocol_class(
    frontend: Any, limits: ConnectionLimits | None = None
) -> type[HttpToolsProtocol]:
    """A protocol class bound to one HttpFrontend (uvicorn builds one protocol per connection)
    and to the connection limits (server/net/connections.py)."""
    bound = {
        "frontend": frontend,
        "limits": limits or ConnectionLimits(),
        "_refusals": RateLimitedLog(log),
    }
    if not fast_path_supported():
        log.warning(
            "this uvicorn version lacks the hooks of the direct inference path; "
            "inference requests go through ASGI"
        )
        return type("BoundedHttpProtocol", (BoundedHttpProtocol,), bound)
    return type("InferHttpProtocol", (InferHttpProtocol,), bound)


def bounded_protocol_class(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's protocol with the connection limits alone (the metrics listener)."""
    return type(
        "BoundedHttpProtocol",
        (BoundedHttpProtocol,),
        {"limits": limits, "_refusals": RateLimitedLog(log)},
    )


async def _health_only(scope: Any, receive: Any, send: Any) -> None:
    """The answer on a connection past --http-max-connections to anything but a health check."""
    body = (
        b'{"error":"too many open connections (--http-max-connections); this connection '
        b'only answers /v2/health/live and /v2/health/ready"}'
    )
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", JSON.encode("latin-1")),
                (b"content-length", str(len(body)).encode("latin-1")),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# A connection in the health-check reserve waits at most this long for its request.
_HEALTH_ONLY_IDLE = 5.0


def _body_timeout_answer(cycle: RequestResponseCycle, timeout: float) -> bytes:
    """The 408 of a body abandoned by --http-body-timeout-secs, as one write."""
    body = (
        b'{"error":"request body not received in time: no bytes for %d s '
        b'(--http-body-timeout-secs)"}' % round(timeout)
    )
    return _closing_json_answer(cycle.default_headers, 408, body)


def _closing_json_answer(default_headers: Any, status: int, body: bytes) -> bytes:
    """A whole JSON answer after which the connection closes, as the bytes of one write."""
    head = [STATUS_LINE[status]]
    for key, value in default_headers:  # server, date
        head += [key, b": ", value, b"\r\n"]
    head += [
        b"content-type: application/json\r\ncontent-length: ",
        str(len(body)).encode("latin-1"),
        b"\r\nconnection: close\r\n\r\n",
        body,
    ]
    return b"".join(head)


class _HeadersTooLarge(Exception):
    """Raised from a parser callback when a request's line and headers pass the bound: 414 when
    the request line alone does, else 431."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


# After refusing bytes it could not parse, the server keeps reading (and dropping) what the
# client still sends for a moment before it closes: closing with unread bytes makes the kernel
# reset the connection, and a client still sending its headers would lose the answer.
_LINGER_SECS = 2.0
_LINGER_BYTES = 1 << 20


def _malformed_answer(default_headers: Any, reason: str, status: int = 400) -> bytes:
    """The answer to a request the HTTP parser cannot read (or whose headers are over the
    bound), as JSON like every other error; the connection is closed after it."""
    body = orjson.dumps({"error": reason if status != 400 else f"malformed HTTP request: {reason}"})
    return _closing_json_answer(default_headers, status, body)


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's protocol with connections bounded in number and in waiting time.

    A waiting connection is timed in uvicorn's keep-alive slot (`timeout_keep_alive_task`,
    which uvicorn cancels on every read): armed for the idle timeout when the connection opens,
    and, after a read that leaves the connection still waiting for a request's headers (a
    partial request, or blank lines), re-armed for what is left of the header (or idle /
    keep-alive) deadline. The wait after an answer is not armed per answer, as uvicorn does:
    the answer notes its deadline and one long-lived timer checks it (`on_response_complete`),
    so a request that arrives whole in one read costs no timer call at all.

    A body is timed by a second timer, armed by the first read that leaves a request's body
    incomplete (a request that arrives whole never arms it) and kept for the connection's later
    bodies: each read of an incomplete body notes the loop time, and the timer, when it fires,
    re-arms itself for what is left of --http-body-timeout-secs after that read, or abandons the
    body (`_abandon_body`). Time while this side has paused reading (flow control, a pipelined
    request) is not the client's and does not count.
    """

    limits: ConnectionLimits = ConnectionLimits()
    _refusals: RateLimitedLog = RateLimitedLog(log)
    _abandoned: RateLimitedLog = RateLimitedLog(log)  # bodies dropped by the body timeout
    _malformed: RateLimitedLog = RateLimitedLog(log)  # requests the parser refused
    _header_bytes: int = 0  # of the request being parsed: its URL and header names and values
    _lingering: int = -1  # after a refusal: bytes dropped since (-1: not refused)
    _in_head: bool = False  # a request has begun and its headers are not complete yet
    _head_fed: int = 0  # bytes fed to the parser since that request began
    # (waiting for a request's headers?, loop time by which the wait must end); None while a
    # request is being served (class defaults: no per-connection cost to set them up).
    _wait: tuple[bool, float] | None = None
    _health_only: bool = False  # admitted from the health-check reserve
    _body_timer: asyncio.TimerHandle | None = None
    _body_read_at: float = 0.0  # loop time of the last read of an incomplete body
    # After an answer, with nothing read since: the loop time the idle connection closes at
    # (--http-keep-alive-timeout-secs), checked by `_idle_timer` (on_response_complete).
    _idle_until: float | None = None
    _idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        limits = self.limits
        over = len(self.connections) - limits.max_connections
        idle = limits.idle_timeout
        if over > 0:
            if over > limits.health_reserve:
                self._refusals.warning(
                    "HTTP connection from %s closed at once: %d connections are open, the limit "
                    "is %d (--http-max-connections) plus %d reserved for health checks",
                    self.client[0] if self.client else "?",
                    len(self.connections) - 1,
                    limits.max_connections,
                    limits.health_reserve,
                )
                transport.close()
                return
            self._health_only = True
            idle = min(idle, _HEALTH_ONLY_IDLE)
        self._wait = (False, self.loop.time() + idle)
        self.timeout_keep_alive_task = self.loop.call_later(idle, self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        self._feed(data)  # cancels the timer; parses; may start a request
        cycle = self.cycle
        # (a request answered within this read began the wait after its answer: timed already)
        if self.timeout_keep_alive_task is None and self._idle_until is None:
            if cycle is None or cycle.response_complete:  # nothing to serve yet: still waiting
                self._arm_wait()
                return
        if cycle is not None and cycle.more_body and not cycle.response_complete:
            self._note_body_read()

    def _note_body_read(self) -> None:
        """A read of a body still incomplete: time it (--http-body-timeout-secs)."""
        self._body_read_at = self.loop.time()
        if self._body_timer is None:
            self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_timeout)

    def _feed(self, data: bytes) -> None:
        """uvicorn's `data_received`, with the parser's refusals logged at most once every few
        seconds (uvicorn logs each one: a flood of garbage would flood the log too)."""
        self._idle_until = None  # not idle since the last answer any more
        if self._lingering >= 0:  # refused: drop what still comes, for a bounded while
            self._lingering += len(data)
            if self._lingering > _LINGER_BYTES:
                self.transport.close()
            return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._malformed.warning(
                "HTTP request from %s refused: the parser could not read it",
                self.client[0] if self.client else "?",
            )
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._in_head:  # httptools buffers an unfinished header itself, unbounded: count it
            self._head_fed += len(data)
            if self._head_fed > self.limits.max_header_bytes:
                self._refuse(431, self._head_too_large("request headers"))

    # The request line and headers are counted as httptools hands them over, so a request whose
    # headers never end is refused once it has sent the bound, not when it finishes.
    def on_message_begin(self) -> None:
        self._header_bytes = 0
        self._in_head, self._head_fed = True, 0
        self._idle_until = None  # a request after an answer in the same read: not idle
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url), 414)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """Counted against the bound, then kept as uvicorn keeps it (lower-case name, value
        without trailing blanks, `Expect: 100-continue` noted), in one call instead of three:
        this runs for every header of every request (bench/FINDINGS.md 36)."""
        size = self._header_bytes = self._header_bytes + len(name) + len(value)
        if size > self.limits.max_header_bytes:
            raise _HeadersTooLarge(431)
        name = name.lower()
        value = value.rstrip(b" \t")  # llhttp leaves trailing blanks; RFC 9110 5.5 drops them
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def _count_header_bytes(self, size: int, status: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.limits.max_header_bytes:
            raise _HeadersTooLarge(status)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes its parser refused (a request line or header it cannot
        read), which it writes as plain text: JSON here, then the connection closed as there.

        uvicorn calls this from its `except httptools.HttpParserError` block and passes only a
        fixed text, so the parser's own reason ("Invalid method encountered", ...) is read from
        the exception being handled: for an error raised in uvicorn's callbacks, the parser
        error behind it ("url is too long: ..."), never another exception's text."""
        exc = sys.exc_info()[1]
        if isinstance(exc, httptools.HttpParserCallbackError):
            exc = exc.__context__
        if isinstance(exc, _HeadersTooLarge):
            what = "request URL" if exc.status == 414 else "request headers"
            self._refuse(exc.status, self._head_too_large(what))
            return
        reason = str(exc).strip() if isinstance(exc, httptools.HttpParserError) else ""
        self._refuse(400, reason or msg)

    def _head_too_large(self, what: str) -> str:
        bound = self.limits.max_header_bytes
        return f"{what} passed {bound} bytes (--http-max-header-size)"

    def _refuse(self, status: int, reason: str) -> None:
        self._in_head = False
        self.transport.write(_malformed_answer(self.server_state.default_headers, reason, status))
        self._linger_then_close()

    def _linger_then_close(self) -> None:
        """Send the answer and our FIN, drop what the client still sends, close soon after."""
        transport = self.transport
        self._lingering = 0
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
        try:
            transport.write_eof()
        except (NotImplementedError, OSError, RuntimeError):
            transport.close()
            return
        self.timeout_keep_alive_task = self.loop.call_later(_LINGER_SECS, transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        timer = self._body_timer
        if timer is not None:
            timer.cancel()
            self._body_timer = None
        idle = self._idle_timer
        if idle is not None:
            idle.cancel()
            self._idle_timer = None

    def on_response_complete(self) -> None:
        """uvicorn's, except for the keep-alive wait after an answer: uvicorn arms a timer
        after every answer and cancels it at the next request's first read, a pair of timer
        calls per request. Here the answer notes when the idle connection is due to close
        (`_idle_until`), a read clears that, and one timer per connection, armed when none is
        pending, checks it when it fires and re-arms itself for what is left."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        due = self._idle_until = self.loop.time() + self.timeout_keep_alive
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(due, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        due = self._idle_until
        if due is None:  # a request came since that answer: the next answer arms it again
            return
        left = due - self.loop.time()
        if left > 0:
            self._idle_timer = self.loop.call_later(left, self._idle_check)
            return
        self.timeout_keep_alive_handler()

    def _body_timeout(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if (
            cycle is None
            or not cycle.more_body
            or cycle.response_complete
            or cycle.disconnected
            or self.transport.is_closing()
        ):
            return  # no body being received: the next incomplete one arms the timer again
        now = self.loop.time()
        if self.flow.read_paused:  # this side stopped reading: the client is not late
            self._body_read_at = now
        left = self._body_read_at + self.limits.body_timeout - now
        if left > 0:
            self._body_timer = self.loop.call_later(left, self._body_timeout)
            return
        self._abandon_body(cycle)

    def _abandon_body(self, cycle: RequestResponseCycle) -> None:
        """A body whose bytes stopped arriving: 408 if no answer has started, then closed.

        The request's reader wakes to a disconnected cycle (the direct path raises, ASGI gets
        http.disconnect), so what it buffered is dropped and given back to the body budget.
        """
        self._abandoned.warning(
            "HTTP request body from %s abandoned: no bytes for %.0f s (--http-body-timeout-secs)",
            self.client[0] if self.client else "?",
            self.limits.body_timeout,
        )
        if not cycle.response_started:
            cycle.response_started = True
            self.transport.write(_body_timeout_answer(cycle, self.limits.body_timeout))
        cycle.keep_alive = False
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()

    def _arm_wait(self) -> None:
        transport = self.transport
        if transport.is_closing() or not self._is_transport_protocol():  # closed, upgraded
            return
        now = self.loop.time()
        scope = self.scope
        in_headers = scope is not None and "method" not in scope  # on_headers_complete sets it
        wait = self._wait
        if wait is None or (in_headers and not wait[0]):
            timeout = self.limits.header_timeout if in_headers else self.timeout_keep_alive
            if self._health_only:
                timeout = min(timeout, _HEALTH_ONLY_IDLE)
            wait = self._wait = (in_headers, now + timeout)
        self.timeout_keep_alive_task = self.loop.call_later(
            max(wait[1] - now, 0.0), self.timeout_keep_alive_handler
        )

    def _is_transport_protocol(self) -> bool:
        """Whether the transport still reads for this protocol (itself or its DirectReceiver),
        not for one it was upgraded to."""
        current = self.transport.get_protocol()
        return current is self or (isinstance(current, DirectReceiver) and current.protocol is self)

    def _new_parser(self) -> httptools.HttpRequestParser:
        """A parser as uvicorn makes one for a connection."""
        parser = httptools.HttpRequestParser(self)
        try:
            parser.set_dangerous_leniencies(lenient_data_after_close=True)
        except AttributeError:  # httptools < 0.6.3
            pass
        return parser

    def timeout_keep_alive_handler(self) -> None:
        if self._wait is not None and not self.transport.is_closing():
            log.debug(
                "closing HTTP connection from %s: no complete request headers in time",
                self.client[0] if self.client else "?",
            )
        super().timeout_keep_alive_handler()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self._wait = None
        if self._health_only:
            cycle.keep_alive = False  # one answer, then the reserve is free again
            if cycle.scope["path"] not in HEALTH_PATHS:
                app = _health_only
        super()._start_asgi_task(cycle, app)


class InferHttpProtocol(BoundedHttpProtocol):
    """uvicorn's protocol; infer POSTs run `_serve_infer` instead of the ASGI app.

    An infer body over server/http/receive.py's DIRECT_MIN with a declared Content-Length is
    received into a BodySink: what the parser already holds of it is copied in, and a
    DirectReceiver becomes the transport's protocol, so the reads after that go straight into
    the sink's array (`body_received`) while the parser is bypassed. Once the body is complete
    this protocol takes the transport back (small requests never see the receiver) and the
    connection gets a fresh parser (the old one still waits for the bytes it never saw). A body
    that never completes ends its connection, as it did before.
    """

    frontend: Any  # server.http.routes.HttpFrontend, set by protocol_class()
    # The body of the request being parsed, while it is received into its own array; read by
    # the DirectReceiver for every read (class default: no per-connection cost).
    direct_sink: BodySink | None = None
    # The infer request served with no task (server/http/infer_nowait.py), until answered.
    no_task: NoTaskInfer | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._infer_task: asyncio.Task | None = None

    def on_headers_complete(self) -> None:
        """An infer POST with a plain URL starts here, past uvicorn's generic request start
        (URL parsing and unquoting, the root path, the concurrency check, the ASGI hand-off
        and a second match of the path): those cost about a fifth of the connection's own CPU
        per small request (bench/FINDINGS.md 38). Its cycle is uvicorn's, made as uvicorn makes
        it; any other request, and any server option that changes the path or refuses
        requests, takes uvicorn's way."""
        self._in_head = False
        parser = self.parser
        url = self.url
        match = _PLAIN_INFER_URL.fullmatch(url)
        if (
            match is None
            or self._health_only
            or self.root_path
            or self.limit_concurrency is not None
            or parser.get_method() != b"POST"
            or parser.should_upgrade()
        ):
            HttpToolsProtocol.on_headers_complete(self)
            return
        http_version = parser.get_http_version()
        scope = self.scope
        scope["method"] = "POST"
        if http_version != "1.1":
            scope["http_version"] = http_version
        scope["path"] = url.decode("ascii")
        scope["raw_path"] = url
        scope["query_string"] = b""
        existing = self.cycle
        cycle = self.cycle = RequestResponseCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        if existing is not None and not existing.response_complete:  # pipelined: queued
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))
            return
        self._wait = None
        version = match.group(2)
        if not self._start_infer(
            cycle, match.group(1).decode("ascii"), version.decode("ascii") if version else ""
        ):
            BoundedHttpProtocol._start_asgi_task(self, cycle, self.app)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self._wait = None
        scope = cycle.scope
        # Not the 503 of limit_concurrency, nor a connection from the health-check reserve.
        if scope["method"] == "POST" and app is self.app and not self._health_only:
            match = INFER_PATH.fullmatch(scope["path"])
            if match is not None and self._start_infer(cycle, match.group(1), match.group(2) or ""):
                return
        super()._start_asgi_task(cycle, app)

    def _start_infer(self, cycle: RequestResponseCycle, name: str, version: str) -> bool:
        """Serve an infer request (with no task when it fits); False when the frontend's guard
        refuses it, which the ASGI app then answers."""
        scope = cycle.scope
        guard = self.frontend.guard
        if guard is not None and guard.refusal(scope["path"], scope["headers"]) is not None:
            return False
        headers = {
            _WANTED_HEADERS[key]: value.decode("latin-1")
            for key, value in scope["headers"]
            if key in _WANTED_HEADERS
        }
        sink = self._open_sink(cycle, headers)
        if (
            sink is None
            and cycle.more_body  # not a pipelined request started after its body came
            and not cycle.waiting_for_100_continue
            and self.frontend.nowait_fits(headers)
        ):
            self.no_task = NoTaskInfer(self, cycle, name, version, headers)
            return True
        task = self.loop.create_task(self._serve_infer(cycle, name, version, headers, sink))
        if sink is not None:  # given back even by a task cancelled before it ran
            task.add_done_callback(lambda _task: self._close_sink(sink))
        self._infer_task = task
        self.track(task)
        return True

    def track(self, task: asyncio.Task) -> None:
        """A task of this connection's, in the set uvicorn keeps (shutdown waits for it)."""
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        task = self._infer_task
        if task is not None and not task.done():
            task.cancel()  # the queued request is dropped; nobody is left to answer
        if self.no_task is not None:
            self.no_task.drop()

    def _open_sink(
        self, cycle: RequestResponseCycle, headers: Mapping[str, str]
    ) -> BodySink | None:
        """A sink for this request's body: when its length is declared (not chunked), large
        (server/http/receive.py) and within the limit, and it is the request being parsed.
        Anything else is read as before, and refused there when it must be."""
        declared = headers.get("content-length")
        if declared is None or len(declared) < 5 or not declared.isdigit():
            return None  # under 10,000 bytes, or refused by the reader
        size = int(declared)
        limit = self.frontend.body_limit
        if (
            size > limit.max_bytes
            or "transfer-encoding" in headers
            or cycle is not self.cycle
            or not cycle.more_body
            or not self._is_transport_protocol()
        ):
            return None
        sink = open_sink(size, limit.budget)
        if sink is None:
            return None
        if cycle.body:  # what the parser gave before the request started
            sink.add(cycle.body)
            cycle.body = bytearray()
        self.direct_sink = sink
        # from the next read on (uvloop and asyncio restart reading with the receiver's buffers)
        self.transport.set_protocol(DirectReceiver(self))
        return sink

    def _end_direct(self) -> None:
        """No body is received into a sink any more: reads go to this protocol again."""
        self.direct_sink = None
        transport = self.transport
        current = transport.get_protocol()
        if isinstance(current, DirectReceiver) and current.protocol is self:
            transport.set_protocol(self)

    def _close_sink(self, sink: BodySink) -> None:
        """The request is answered or gone: give its budget back. A body that did not all
        arrive leaves the parser behind the wire, so what still comes is dropped (the
        connection closes after the answer)."""
        if self.direct_sink is sink:
            self._end_direct()
            if self._lingering < 0:
                self._lingering = 0
        sink.release()

    def on_body(self, body: bytes) -> None:
        sink = self.direct_sink
        if sink is None:
            HttpToolsProtocol.on_body(self, body)
            return
        sink.add(body)
        self._charge(sink)  # the reader wakes at on_message_complete

    def _charge(self, sink: BodySink) -> bool:
        """Count a read against the body budget; False (and the reader woken to answer 503,
        reading stopped) once the budget refuses the body."""
        if sink.refusal is not None:
            return False
        try:
            sink.charge()
        except BodyBudgetExhausted as refusal:
            sink.refusal = refusal
            self.flow.pause_reading()
            self.cycle.message_event.set()
            return False
        return True

    def on_message_complete(self) -> None:
        if self.direct_sink is not None:  # the parser read the rest of the body itself
            self._end_direct()
        HttpToolsProtocol.on_message_complete(self)
        no_task = self.no_task
        if no_task is not None and not no_task.begun and no_task.cycle is self.cycle:
            no_task.begin()

    def body_received(self, nbytes: int) -> None:
        """A read that went straight into the open sink, past the parser."""
        sink = self.direct_sink
        cycle = self.cycle
        if sink is None or cycle is None:  # not reachable: the receiver read into the sink
            return
        self._unset_keepalive_if_required()
        sink.filled += nbytes
        if not self._charge(sink):
            return
        if sink.complete:
            self._end_direct()
            self.parser = self._new_parser()
            cycle.more_body = False
            cycle.message_event.set()  # the reader's one wake-up
        elif not cycle.response_complete:
            self._note_body_read()

    async def _serve_infer(
        self,
        cycle: RequestResponseCycle,
        name: str,
        version: str,
        headers: Mapping[str, str],
        sink: BodySink | None,
    ) -> None:
        """One infer request: `headers` are the ones it reads (names in lower case)."""
        start = time.monotonic_ns() if self.frontend.core.may_trace else 0
        held = 0  # body bytes charged to the frontend's budget, given back when answered
        try:
            body, held = await self._read_body(cycle, headers, sink)
            received = receive_stamps(start)
            payload, extra, media_type = await self.frontend.infer_body(
                name, version, headers, body, received
            )
            status = 200
        except asyncio.CancelledError:
            if not cycle.disconnected:
                raise  # shutdown or a real cancellation: let it propagate
            task = asyncio.current_task()
            if task is not None and hasattr(task, "uncancel"):  # handled: the client is gone
                task.uncancel()
            return
        except Exception as exc:
            if cycle.disconnected:
                return
            status, extra, payload = self.error_answer(cycle, exc)
            media_type = JSON
        finally:
            self._infer_task = None
            if held:
                self.frontend.body_limit.budget.held -= held
            if sink is not None:
                self._close_sink(sink)
        await self.respond(cycle, status, media_type, payload, extra)

    async def _read_body(
        self, cycle: RequestResponseCycle, headers: Mapping[str, str], sink: BodySink | None
    ) -> tuple[Any, int]:
        """The body uvicorn buffered, and its size charged to the body budget (the caller gives
        it back); waits for the rest only when it has not all arrived. A body received into
        its sink is the sink's array (the sink holds its charge).

        A small request arrives with its headers, so the usual case awaits nothing. Large ones
        are taken chunk by chunk (no copy: each chunk is uvicorn's own buffer), refused once
        they pass --http-max-input-size or the frontend's --http-max-inflight-body-size (its
        BodyLimit and BodyBudget, as on the routed path); a refused body's bytes are given back
        here.
        """
        limit = self.frontend.body_limit
        limit.check_declared(headers)
        if cycle.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        if sink is not None:
            return await self._read_sink(cycle, sink), 0
        if not cycle.more_body:
            return self.take_body(cycle)
        buffer = BodyBuffer(limit)
        try:
            while True:
                chunk = cycle.body
                if chunk:
                    cycle.body = bytearray()
                    buffer.add(chunk)
                if cycle.disconnected:
                    raise Cancelled("the client disconnected before sending the whole request")
                if not cycle.more_body:
                    break
                cycle.flow.resume_reading()
                await cycle.message_event.wait()
                cycle.message_event.clear()
        except BaseException:
            buffer.release()
            raise
        # A large body stays in its chunks: it goes to a parser process (server/http/parsers.py).
        total = buffer.total
        return buffer.parts if self.frontend.offload.wants(total) else buffer.join(), total

    def take_body(self, cycle: RequestResponseCycle) -> tuple[bytearray, int]:
        """The whole body uvicorn buffered, charged to the body budget (the caller gives the
        size back once answered): BodyBuffer.add, inlined, as this is every small request."""
        limit = self.frontend.body_limit
        body = cycle.body
        cycle.body = bytearray()
        size = len(body)
        if size > limit.max_bytes:
            raise limit.too_large()
        budget = limit.budget
        if budget.committed() + size > budget.max_bytes:
            raise budget.exhausted()
        budget.held += size
        return body, size

    async def _read_sink(self, cycle: RequestResponseCycle, sink: BodySink) -> Any:
        """Wait until the sink is full (the protocol charges its bytes to the budget as they
        come and wakes this once: complete, refused, or the client gone)."""
        while True:
            sink.charge()  # what _open_sink copied in from the parser
            if sink.refusal is not None:
                raise sink.refusal
            if cycle.disconnected:
                raise Cancelled("the client disconnected before sending the whole request")
            if sink.complete:
                break
            cycle.flow.resume_reading()  # paused behind a pipelined request, or by uvicorn
            await cycle.message_event.wait()
            cycle.message_event.clear()
        body = sink.body()
        return [body] if self.frontend.offload.wants(sink.size) else body

    def error_answer(
        self, cycle: RequestResponseCycle, exc: BaseException
    ) -> tuple[int, dict[str, str], bytes]:
        """A failed infer request's answer (the one error table); a request refused before
        its whole body came, or by the body budget, closes the connection after it."""
        status, extra, payload = http_error(exc, cycle.scope["path"], self.frontend.overload_status)
        if extra.pop("Connection", None) or cycle.more_body:
            cycle.keep_alive = False
        return status, extra, payload

    def answer(
        self,
        cycle: RequestResponseCycle,
        status: int,
        media_type: str,
        payload: Any,
        extra: Mapping[str, str],
    ) -> None:
        """`respond` from a callback: written now, or after the drain in a task when the
        client reads slowly."""
        if cycle.flow.write_paused and not cycle.disconnected:
            self.track(
                self.loop.create_task(self.respond(cycle, status, media_type, payload, extra))
            )
            return
        self.write_answer(cycle, status, media_type, payload, extra)

    async def respond(
        self,
        cycle: RequestResponseCycle,
        status: int,
        media_type: str,
        payload: Any,
        extra: Mapping[str, str],
    ) -> None:
        """`write_answer` once the transport takes writes again."""
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        self.write_answer(cycle, status, media_type, payload, extra)

    # The status line, uvicorn's default headers and the content type of the last answer, up
    # to its Content-Length: the same for every answer of a connection until uvicorn renews
    # its default headers (each second, for the date). Class default: no per-connection cost.
    _head: tuple[Any, int, str, bytes] = (None, 0, "", b"")

    def _answer_head(self, default_headers: Any, status: int, media_type: str) -> bytes:
        known, known_status, known_type, head = self._head
        if known is default_headers and known_status == status and known_type == media_type:
            return head
        pieces = [STATUS_LINE[status]]
        for key, value in default_headers:  # server, date
            pieces += [key, b": ", value, b"\r\n"]
        pieces += [b"content-type: ", media_type.encode("latin-1"), b"\r\ncontent-length: "]
        head = b"".join(pieces)
        self._head = (default_headers, status, media_type, head)
        return head

    def write_answer(
        self,
        cycle: RequestResponseCycle,
        status: int,
        media_type: str,
        payload: Any,
        extra: Mapping[str, str],
    ) -> None:
        """Status line, headers and a small body in a single write; a large one as its pieces
        in one `writelines` (the head, the JSON, views of the output arrays: nothing joined);
        then uvicorn's bookkeeping."""
        if cycle.disconnected:
            return
        parts: list[Any] = payload if type(payload) is list else [payload]
        size = sum(map(len, parts))  # bytes, or byte-cast memoryviews: len is the byte count
        head = [self._answer_head(cycle.default_headers, status, media_type)]
        head += [str(size).encode("latin-1"), b"\r\n"]
        for name, text in extra.items():  # our own names and values: no CR/LF in them
            head += [name.lower().encode("latin-1"), b": ", text.encode("latin-1"), b"\r\n"]
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if size <= _JOIN_LIMIT:
            head += parts
            self.transport.write(b"".join(head))
        else:
            # uvloop keeps each piece (a memoryview holds its array) until it is sent
            first = 1 if len(parts[0]) <= _JOIN_LIMIT else 0  # the JSON rides with the head
            head += parts[:first]
            self.transport.writelines([b"".join(head), *parts[first:]])
        if cycle.access_log:
            cycle.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(cycle.scope),
                "POST",
                get_path_with_query_string(cycle.scope),
                cycle.scope["http_version"],
                status,
            )
        cycle.response_started = cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        on_response, cycle.on_response = cycle.on_response, _nothing
        on_response()


def _nothing() -> None:
    """A finished cycle's on_response (uvicorn's run_asgi does the same)."""
