"""`GET /v1/models`: each served model, what it answers (`wire/capabilities.py`) and what decides its bits."""

from __future__ import annotations

from litestar import Request, Response, route
from litestar.handlers import HTTPRouteHandler

from basal.api.context import api_context
from basal.api.errors import OVERLOADED_HEADERS
from basal.api.http.auth import check_auth
from basal.api.settings import ApiSettings
from basal.api.wire.capabilities import capabilities
from basal.api.wire.openapi import documented, json_content
from basal.api.wire.schema_types import ModelsResponse, SystemOneError

DESCRIPTION = "basal typed-decision model (choice / noul / score / act / multi), Polish and English"
LOADING = "The models are still loading. Retry after a short delay (GET /health/ready says when)."


async def models(request: Request) -> Response:
    context = api_context(request)
    engines, settings = context.engines, context.settings
    check_auth(request, settings, "systemone")  # a refusal is answered by the app's `refusal_response`
    if engines.progress:  # what a model computes with is known once its backend has loaded
        return Response({"detail": LOADING}, status_code=503, headers=OVERLOADED_HEADERS)
    return Response(
        {
            "models": [
                {
                    "name": info.name,
                    "release_date": settings.release_date,
                    "description": settings.descriptions.get(info.name, DESCRIPTION),
                    "mode": "basal",
                    "early_exit": [],
                    "synthetic": info.synthetic,
                    **capabilities(info),
                    "compute": info.compute,
                }
                for info in map(engines.model_info, engines.names)
            ]
        }
    )


def model_routes(settings: ApiSettings) -> list[HTTPRouteHandler]:
    keys = bool(settings.api_keys)
    responses = {
        "200": {"description": "served models", "content": json_content(ModelsResponse)},
        "503": {"description": "the models are still loading", "content": json_content(SystemOneError)},
    }
    if keys:
        for status, what in (("401", "wrong API key"), ("403", "no API key")):
            responses[status] = {"description": what, "content": json_content(SystemOneError)}
    return [
        route(
            "/v1/models",
            http_method=["GET", "HEAD"],
            operation_class=documented(responses, secured=keys),
            summary="Served models",
            tags=["models"],
        )(models)
    ]
