"""``/playground``: a page for the people who write decisions, and ``/`` sending a browser there.

The page is plain HTML, CSS and JavaScript shipped in the package (``static/``), with no build step: nothing to
install to change it, nothing it loads from elsewhere, so it works offline. Its Content-Security-Policy allows only
this server, so a browser refuses any other host even if a later edit tried one.
"""

from __future__ import annotations

from pathlib import Path

from litestar import Response, get, route
from litestar.exceptions import NotFoundException
from litestar.params import FromPath
from litestar.response import Redirect

STATIC = Path(__file__).with_name("static")
PLAYGROUND_PATH = "/playground"
MEDIA_TYPES = {".html": "text/html", ".css": "text/css", ".js": "text/javascript"}  # Litestar adds the charset
HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'",
    "cache-control": "no-cache",
    "x-content-type-options": "nosniff",
}


def _assets() -> dict[str, bytes]:
    """Every file the page is made of, read once (a few kilobytes)."""
    return {p.name: p.read_bytes() for p in sorted(STATIC.iterdir()) if p.suffix in MEDIA_TYPES}


def playground_routes() -> list:
    """The page, its assets, and the redirect from ``/`` (relative, so it holds behind a proxy's path prefix)."""
    assets = _assets()

    def asset(name: str) -> Response:
        if name not in assets:
            raise NotFoundException(f"no playground file {name!r}")
        return Response(assets[name], media_type=MEDIA_TYPES[Path(name).suffix], headers=HEADERS)

    @route(PLAYGROUND_PATH, http_method=["GET", "HEAD"], include_in_schema=False)
    async def page() -> Response:
        return asset("index.html")

    @route(f"{PLAYGROUND_PATH}/{{name:str}}", http_method=["GET", "HEAD"], include_in_schema=False)
    async def playground_file(name: FromPath[str]) -> Response:
        return asset(name)

    @get("/", include_in_schema=False)
    async def root() -> Redirect:
        return Redirect(PLAYGROUND_PATH.lstrip("/"), status_code=302)

    return [page, playground_file, root]
