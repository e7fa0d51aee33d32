"""`GET /metrics`: the Prometheus text of the engines' series (`basal.core.engine.metrics`), when switched on."""

from __future__ import annotations

import anyio
from litestar import Request, Response, route
from litestar.handlers import HTTPRouteHandler

from basal.api.context import api_context
from basal.api.http.auth import service_key
from basal.api.settings import ApiSettings
from basal.api.wire.openapi import documented, json_content
from basal.api.wire.schema_types import SystemOneError

METRICS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"
METRICS_OFF = "Metrics are off: start the server with basal serve --metrics (YAML: metrics: true)."


async def metrics(request: Request) -> Response:
    context = api_context(request)
    if not context.settings.metrics:
        return Response({"detail": METRICS_OFF}, status_code=404, media_type="application/json")
    service_key(request)
    # off the loop: the process collector reads /proc, and a Ray front's collector asks its replicas
    text = await anyio.to_thread.run_sync(context.engines.metrics.render)
    return Response(text, media_type=METRICS_MEDIA_TYPE)


def metrics_routes(settings: ApiSettings) -> list[HTTPRouteHandler]:
    keyed = bool(settings.api_keys) and not settings.public_metrics_and_schema
    if settings.metrics:
        responses = {
            "200": {
                "description": "Prometheus text format",
                "content": {METRICS_MEDIA_TYPE: {"schema": {"type": "string"}}},
            }
        }
        if keyed:
            for status, what in (("401", "wrong API key"), ("403", "no API key")):
                responses[status] = {"description": what, "content": json_content(SystemOneError)}
    else:
        responses = {
            "404": {"description": "metrics are off (basal serve --metrics)", "content": json_content(SystemOneError)}
        }
    return [
        route(
            "/metrics",
            http_method=["GET"],
            operation_class=documented(responses, secured=keyed and settings.metrics),
            summary="Prometheus metrics (enable with --metrics)",
            tags=["service"],
            media_type=METRICS_MEDIA_TYPE,
        )(metrics)
    ]
