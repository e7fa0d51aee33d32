"""``/playground``: a page for the people who write decisions, and ``/`` sending a browser there.

The page is plain HTML, CSS and JavaScript shipped in the package (``static/``), with no build step: nothing to
install to change it, nothing it loads from elsewhere, so it works offline. Its Content-Security-Policy allows only
this server, so a browser refuses any other host even if a later edit tried one, and no other site may frame it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from litestar import Response, get, route
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath
from litestar.response import Redirect

from basal.api.errors import not_found

STATIC = Path(__file__).parents[1] / "static"  # basal/api/static: the page's files
PLAYGROUND_PATH = "/playground"
MEDIA_TYPES = {".html": "text/html", ".css": "text/css", ".js": "text/javascript"}  # Litestar adds the charset
HEADERS = {  # no other site may frame the page either (clickjacking): frame-ancestors, and X-Frame-Options for old
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-frame-options": "DENY",
    "cache-control": "no-cache",
    "x-content-type-options": "nosniff",
}


@cache
def _assets() -> dict[str, bytes]:
    """Every file the page is made of, read once (a few kilobytes)."""
    return {p.name: p.read_bytes() for p in sorted(STATIC.iterdir()) if p.suffix in MEDIA_TYPES}


def _asset(name: str) -> Response:
    assets = _assets()
    if name not in assets:
        raise not_found()
    return Response(assets[name], media_type=MEDIA_TYPES[Path(name).suffix], headers=HEADERS)


async def page() -> Response:
    return _asset("index.html")


async def playground_file(name: FromPath[str]) -> Response:
    return _asset(name)


async def root() -> Redirect:
    return Redirect(PLAYGROUND_PATH.lstrip("/"), status_code=302)


def playground_routes() -> list[HTTPRouteHandler]:
    """The page, its assets, and the redirect from ``/`` (relative, so it holds behind a proxy's path prefix)."""
    return [
        route(PLAYGROUND_PATH, http_method=["GET", "HEAD"], include_in_schema=False)(page),
        route(f"{PLAYGROUND_PATH}/{{name:str}}", http_method=["GET", "HEAD"], include_in_schema=False)(playground_file),
        get("/", include_in_schema=False)(root),
    ]
