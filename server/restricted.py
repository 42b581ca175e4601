"""Restricted APIs: `--http-restricted-api` and `--grpc-restricted-protocol`, as Triton has them.

Why: model loading (whose file overrides can carry a `model.py`, i.e. code), shared-memory
registration and the log/trace settings are for operators, while the inference port is often
reachable by anyone. Each flag names categories of the API and a header (HTTP: `<key>`; gRPC
metadata: `triton-grpc-protocol-<key>`) whose value a request in those categories must carry.
The value is compared in constant time. With no flag nothing is installed on the request path.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

_MODEL = r"/v2/models/[^/]+(?:/versions/[^/]+)?"
# The first pattern a path matches gives its category (statistics before metadata: a model path
# would also match /v2/models/stats).
_HTTP_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p + r"/?"), c)
    for p, c in (
        (r"/v2/health/(?:live|ready)", "health"),
        (_MODEL + r"/ready", "health"),
        (r"/v2/models/stats", "statistics"),
        (_MODEL + r"/stats", "statistics"),
        (_MODEL + r"/(?:infer|generate|generate_stream)", "inference"),
        (_MODEL + r"/config", "model-config"),
        (_MODEL + r"/trace/setting", "trace"),
        (r"/v2/trace/setting", "trace"),
        (r"/v2/logging", "logging"),
        (r"/v2/(?:system|cuda)sharedmemory(?:/.*)?", "shared-memory"),
        (r"/v2/repository(?:/.*)?", "model-repository"),
        # Beyond Triton: the gray-release API changes which versions serve, so it goes with loads.
        (r"/v2/models/[^/]+/traffic", "model-repository"),
        (_MODEL, "metadata"),
        (r"/v2", "metadata"),
    )
]

_GRPC_METHODS: dict[str, str] = {
    **dict.fromkeys(("ServerLive", "ServerReady", "ModelReady"), "health"),
    **dict.fromkeys(("ServerMetadata", "ModelMetadata"), "metadata"),
    **dict.fromkeys(("ModelInfer", "ModelStreamInfer"), "inference"),
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    **dict.fromkeys(
        ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"), "model-repository"
    ),
    **dict.fromkeys(
        (
            "SystemSharedMemoryStatus",
            "SystemSharedMemoryRegister",
            "SystemSharedMemoryUnregister",
            "CudaSharedMemoryStatus",
            "CudaSharedMemoryRegister",
            "CudaSharedMemoryUnregister",
        ),
        "shared-memory",
    ),
    "TraceSetting": "trace",
    "LogSettings": "logging",
}
_GRPC_SERVICES = {
    "inference.GRPCInferenceService": None,
    "grpc.health.v1.Health": "health",
    "ascend.traffic.v1.TrafficService": "model-repository",
}


@dataclass(frozen=True)
class Restriction:
    """The header (lower case) and value a request in a restricted category must carry."""

    header: str
    value: str

    def allows(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.value.encode())


def parse_restrictions(
    specs: Iterable[str], flag: str, header_prefix: str = ""
) -> dict[str, Restriction]:
    """`<category>[,<category>...]:<key>=<value>` per flag -> category -> Restriction.
    ValueError (a startup error) for a malformed spec, an unknown category, or a category
    named in two groups."""
    restrictions: dict[str, Restriction] = {}
    for spec in specs:
        categories, sep, pair = spec.partition(":")
        key, eq, value = pair.partition("=")
        if not sep or not eq or not categories or not key.strip():
            raise ValueError(f"{flag}: expected '<api>[,<api>...]:<key>=<value>', got '{spec}'")
        restriction = Restriction((header_prefix + key.strip()).lower(), value)
        for category in (c.strip() for c in categories.split(",")):
            if category not in CATEGORIES:
                raise ValueError(
                    f"{flag}: unknown API '{category}' in '{spec}'; expected one "
                    f"of {', '.join(CATEGORIES)}"
                )
            if category in restrictions:
                raise ValueError(f"{flag}: '{category}' is named in more than one group")
            restrictions[category] = restriction
    return restrictions


def http_category(path: str) -> str | None:
    for pattern, category in _HTTP_PATTERNS:
        if pattern.fullmatch(path):
            return category
    return None


def grpc_category(method: str) -> str | None:
    """The category of a full method name, `/inference.GRPCInferenceService/ModelInfer`."""
    _, service, name = method.split("/", 2) if method.count("/") >= 2 else ("", "", method)
    if service not in _GRPC_SERVICES:
        return None
    return _GRPC_SERVICES[service] or _GRPC_METHODS.get(name)


class HttpGuard:
    """The HTTP side: which request paths need which header."""

    def __init__(self, restrictions: Mapping[str, Restriction]) -> None:
        self.restrictions = dict(restrictions)

    def refusal(self, path: str, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """None when the request may go on; otherwise the error text of Triton's 403."""
        category = http_category(path)
        restriction = self.restrictions.get(category) if category else None
        if restriction is None:
            return None
        wanted = restriction.header.encode("latin-1")
        for name, value in headers:
            if name.lower() == wanted:
                if restriction.allows(value.decode("latin-1")):
                    return None
                break
        return f"This API is restricted, expecting header '{restriction.header}'"


class RestrictionMiddleware:
    """ASGI middleware: a restricted request without its header is answered 403 before any
    routing (so a wrong method on a restricted path is 403, not 405)."""

    def __init__(self, app: Any, guard: HttpGuard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            text = self.guard.refusal(scope["path"], scope["headers"])
            if text is not None:
                body = orjson.dumps({"error": text})
                await send(
                    {
                        "type": "http.response.start",
                        "status": 403,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
