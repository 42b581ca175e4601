"""The metrics listener (:8002): GET /metrics in Prometheus text format 0.0.4."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.observability.metrics import ServerMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def build_metrics_app(metrics: ServerMetrics) -> Starlette:
    async def scrape(request: Request) -> Response:
        return Response(await metrics.scrape(), media_type=CONTENT_TYPE)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        text = {404: "Not Found", 405: "Method Not Allowed"}.get(status, "error")
        return Response(f'{{"error":"{text}"}}', status_code=status, media_type="application/json")

    routes = [
        Route("/metrics", scrape, methods=["GET"]),
        Route("/metrics/", scrape, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={404: not_allowed, 405: not_allowed})
