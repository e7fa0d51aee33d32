"""The pages under ``/schema``: the OpenAPI document itself, and interactive viewers that say what they need.

Litestar's viewers (Swagger UI, Redoc, Stoplight Elements, RapiDoc) load their scripts from public CDNs, so
without internet they render blank. No small pure-Python package ships a current build of one (Swagger UI 4,
the one that is packaged small, cannot read OpenAPI 3.1), so basal does not serve the scripts: ``/schema``
itself is a plain page that works offline and links the document, and every viewer says where its scripts
come from (docs/http-api.md §7).
"""

from __future__ import annotations

from html import escape
from typing import Any

from litestar import Request
from litestar.openapi.plugins import (
    JsonRenderPlugin,
    OpenAPIRenderPlugin,
    RapidocRenderPlugin,
    RedocRenderPlugin,
    StoplightRenderPlugin,
    SwaggerRenderPlugin,
    YamlRenderPlugin,
)

SCHEMA_PATH = "/schema"
VIEWERS = (  # (path, name, where its scripts come from, Litestar's plugin)
    ("/swagger", "Swagger UI", "cdn.jsdelivr.net", SwaggerRenderPlugin),
    ("/redoc", "Redoc", "cdn.redoc.ly", RedocRenderPlugin),
    ("/elements", "Stoplight Elements", "unpkg.com", StoplightRenderPlugin),
    ("/rapidoc", "RapiDoc", "unpkg.com", RapidocRenderPlugin),
)
OFFLINE_NOTE = (
    "<p style='font:14px sans-serif;margin:8px'>This viewer loads its scripts from {host}; without internet it "
    "stays blank. The OpenAPI document itself: <a href='{schema}/openapi.json'>{schema}/openapi.json</a> "
    "(all pages: <a href='{schema}'>{schema}</a>).</p>"
)


class SchemaIndexPlugin(OpenAPIRenderPlugin):
    """``/schema``: the document's links and the viewers, in plain HTML (nothing loaded from elsewhere)."""

    def __init__(self) -> None:
        super().__init__(path="/", favicon="", style="")

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        title = escape(f"{openapi_schema['info']['title']} {openapi_schema['info']['version']}")
        s = SCHEMA_PATH
        viewers = "".join(
            f"<li><a href='{s}{path}'>{name}</a> (scripts from {host})</li>" for path, name, host, _ in VIEWERS
        )
        page = (
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title} API</title></head>"
            "<body style='font:15px sans-serif;max-width:48em;margin:2em auto'>"
            f"<h1>{title} API</h1>"
            f"<p>The OpenAPI 3.1 document: <a href='{s}/openapi.json'>{s}/openapi.json</a> "
            f"(YAML: <a href='{s}/openapi.yaml'>{s}/openapi.yaml</a>). It works offline; load it into any "
            "OpenAPI tool.</p>"
            "<p>Interactive viewers. They load their scripts from public CDNs and stay blank without internet:</p>"
            f"<ul>{viewers}</ul></body></html>"
        )
        return page.encode()


def _with_note(plugin: type[OpenAPIRenderPlugin], host: str) -> type[OpenAPIRenderPlugin]:
    """`plugin` whose page starts with `OFFLINE_NOTE` (the viewer draws below it once its scripts load)."""
    note = OFFLINE_NOTE.format(host=host, schema=SCHEMA_PATH).encode()

    def render(self: OpenAPIRenderPlugin, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        page = plugin.render(self, request, openapi_schema)
        return page.replace(b"<body>", b"<body>" + note, 1)

    return type(plugin.__name__, (plugin,), {"render": render})


def schema_pages() -> list[OpenAPIRenderPlugin]:
    """The render plugins of ``/schema``: the index, the JSON and YAML documents, the viewers."""
    viewers = [_with_note(plugin, host)(path=path) for path, _, host, plugin in VIEWERS]
    return [SchemaIndexPlugin(), JsonRenderPlugin(), YamlRenderPlugin(), *viewers]
