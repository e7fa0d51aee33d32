"""`GET /v1/shadow`: what each shadow model has answered beside its primary (basal.core.engine.shadow)."""

from __future__ import annotations

from litestar import Request, Response, get

from basal.api.decisions import ApiSettings, check_auth
from basal.core.engine.shadow import ShadowFront
from basal.core.errors import RequestError


def shadow_routes(shadow: ShadowFront | None, settings: ApiSettings) -> list:
    """The summary route; none when no model is shadowed (the path is then a 404 like any unknown one)."""
    if shadow is None:
        return []

    @get("/v1/shadow", summary="Shadow models: agreement with their primaries", tags=["models"])
    async def summary(request: Request) -> Response:
        try:
            check_auth(request, settings, "systemone")
        except RequestError as e:
            return Response(e.body, status_code=e.status)
        return Response(shadow.summary())

    return [summary]
