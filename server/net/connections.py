"""Bounds on HTTP connections: how many may be open, and how long one may wait without a request.

A client that connects and sends nothing, or drips a request's headers a byte at a time
(slowloris), holds a descriptor for as long as the server lets it; about a thousand of them used
to exhaust the process's descriptor limit and lock out HTTP and gRPC alike. The HTTP protocol
(server/http/fast_path.py) enforces these limits per connection:

- idle timeout: a new connection must start a request within `idle_timeout` seconds;
- header timeout: a request's headers must be complete `header_timeout` seconds after they began;
- keep-alive timeout: after a response, the next request must start within this (uvicorn's);
- body timeout: once a request's headers are complete, its body's bytes may stop arriving for
  at most `body_timeout` seconds (nginx's client_body_timeout); then it is answered 408 if no
  answer has started, the connection is closed and the body's memory released;
- header size: a request line and headers together larger than `max_header_bytes` are answered
  431 and the connection closed (uvicorn's httptools protocol has no such bound: a 200 KB header
  was accepted, and one connection could send megabytes of headers within the header timeout);
- `max_connections` open at once; past it, `health_reserve` more connections are accepted that
  may only ask `/v2/health/live` or `/v2/health/ready` (anything else: 503, then closed), so that
  liveness probes keep answering while the limit is hit; past those, new connections are closed
  at once and the refusals are logged at most once every few seconds.
"""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

HEALTH_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
DEFAULT_MAX_CONNECTIONS = 4096
# Descriptors kept for everything that is not an HTTP connection: gRPC and metrics connections,
# model files, worker pipes, shared memory, logs.
MIN_DESCRIPTOR_MARGIN = 256
_NOFILE_CEILING = 1 << 20  # never ask for more than this when raising the soft limit


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    health_reserve: int = 16
    idle_timeout: float = 60.0
    header_timeout: float = 30.0
    body_timeout: float = 60.0
    max_header_bytes: int = 65536


def descriptor_limit(raise_soft: bool = True) -> int | None:
    """RLIMIT_NOFILE's soft limit, first raised to the hard limit (as Go does) where allowed."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):  # not on this platform
        return None
    if raise_soft and soft != resource.RLIM_INFINITY:
        target = _NOFILE_CEILING if hard == resource.RLIM_INFINITY else min(hard, _NOFILE_CEILING)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (OSError, ValueError):
                pass
    return None if soft == resource.RLIM_INFINITY else int(soft)


def descriptor_margin(nofile: int) -> int:
    return max(MIN_DESCRIPTOR_MARGIN, nofile // 4)


def resolve_max_connections(
    requested: int | None,
    health_reserve: int,
    nofile: int | None,
    share: int = 1,
    flag: str = "--http-max-connections",
) -> int:
    """The connection limit to use: `requested`, or by default DEFAULT_MAX_CONNECTIONS capped so
    that the limit, the health reserve and a margin for everything else fit in the descriptors,
    `share` listeners (HTTP, gRPC) each taking as many."""
    if nofile is None:
        return requested or DEFAULT_MAX_CONNECTIONS
    room = (nofile - descriptor_margin(nofile)) // max(share, 1) - health_reserve
    if requested:
        if requested > room:
            log.warning(
                "%s %d (+%d reserved for health checks) leaves fewer than %d of the %d "
                "descriptors (ulimit -n) for everything else",
                flag,
                requested,
                health_reserve,
                descriptor_margin(nofile),
                nofile,
            )
        return requested
    limit = max(1, min(DEFAULT_MAX_CONNECTIONS, room))
    if limit < 1000:
        log.warning(
            "the descriptor limit (ulimit -n %d) allows only %d connections by default "
            "(%s); raise it for more",
            nofile,
            limit,
            flag,
        )
    return limit


class RateLimitedLog:
    """Logs a warning at most once per `interval` seconds, with how many were left unsaid."""

    def __init__(self, logger: logging.Logger, interval: float = 5.0) -> None:
        self.logger = logger
        self.interval = interval
        self._next = 0.0
        self._suppressed = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next:
            self._suppressed += 1
            return
        suppressed, self._suppressed = self._suppressed, 0
        self._next = now + self.interval
        if suppressed:
            message += " (and %d more like it since the last report)"
            args = (*args, suppressed)
        self.logger.warning(message, *args)
