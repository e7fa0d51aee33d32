"""`GET /v1/shadow`: what each shadow model has answered beside its primary (`basal.core.engine.shadow`)."""

from __future__ import annotations

from litestar import Request, Response, get
from litestar.handlers import HTTPRouteHandler

from basal.api.context import api_context
from basal.api.http.auth import check_auth
from basal.core.engine.shadow import ShadowFront


async def summary(request: Request) -> Response:
    context = api_context(request)
    check_auth(request, context.settings, "systemone")  # a refusal is answered by the app's `refusal_response`
    assert context.shadow is not None  # the route is registered only with a shadowing front
    return Response(context.shadow.summary())


def shadow_routes(shadow: ShadowFront | None) -> list[HTTPRouteHandler]:
    """The summary route; none when no model is shadowed (the path is then a 404 like any unknown one)."""
    if shadow is None:
        return []
    return [get("/v1/shadow", summary="Shadow models: agreement with their primaries", tags=["models"])(summary)]
