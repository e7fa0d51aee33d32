"""The pages under ``/schema``: the OpenAPI document itself, and interactive viewers that say what they need.

Litestar's viewers (Swagger UI, Redoc, Stoplight Elements, RapiDoc) load their scripts from public CDNs, so
without internet they render blank. No small pure-Python package ships a current build of one (Swagger UI 4,
the one that is packaged small, cannot read OpenAPI 3.1), so basal does not serve the scripts: ``/schema``
itself is a plain page that works offline and links the document, and every viewer says where its scripts
come from (docs/http-api.md §7). ``/schema/reference`` is basal's own viewer for the offline case: every operation,
its parameters, request examples and responses with their schemas, rendered here as plain HTML (no script).
"""

from __future__ import annotations

import json
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
# every page under /schema: never framed by another site, no <base> or form elsewhere (the viewers' scripts load
# from their CDNs, so scripts are not limited here); basal's own pages add `PAGE_POLICY`, which allows no script
FRAMING_POLICY = "frame-ancestors 'none'; base-uri 'none'; form-action 'none'; object-src 'none'"
SCHEMA_HEADERS = {"content-security-policy": FRAMING_POLICY, "x-frame-options": "DENY"}
PAGE_POLICY = "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">"
VIEWERS = (  # (path, name, where its scripts come from, Litestar's plugin)
    ("/swagger", "Swagger UI", "cdn.jsdelivr.net", SwaggerRenderPlugin),
    ("/redoc", "Redoc", "cdn.redoc.ly", RedocRenderPlugin),
    ("/elements", "Stoplight Elements", "unpkg.com", StoplightRenderPlugin),
    ("/rapidoc", "RapiDoc", "unpkg.com", RapidocRenderPlugin),
)
OFFLINE_NOTE = (
    "<p style='font:14px sans-serif;margin:8px'>This viewer loads its scripts from {host}; without internet it "
    "stays blank. The OpenAPI document itself: <a href='{schema}/openapi.json'>{schema}/openapi.json</a>; "
    "offline, read it at <a href='{schema}/reference'>{schema}/reference</a> "
    "(all pages: <a href='{schema}'>{schema}</a>).</p>"
)
REFERENCE_STYLE = (
    "body{font:14px/1.45 system-ui,sans-serif;max-width:64em;margin:2em auto;padding:0 1em;color:#1d2330}"
    "details{border:1px solid #d9dde5;border-radius:4px;margin:6px 0;padding:4px 8px}summary{cursor:pointer}"
    "pre{background:#f0f2f5;padding:6px;overflow:auto;font-size:12px}code{font-size:13px}"
    ".m{display:inline-block;min-width:4em;font-weight:600}"
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
            f"<!DOCTYPE html><html><head><meta charset='utf-8'>{PAGE_POLICY}<title>{title} API</title></head>"
            "<body style='font:15px sans-serif;max-width:48em;margin:2em auto'>"
            f"<h1>{title} API</h1>"
            f"<p>The OpenAPI 3.1 document: <a href='{s}/openapi.json'>{s}/openapi.json</a> "
            f"(YAML: <a href='{s}/openapi.yaml'>{s}/openapi.yaml</a>). It works offline; load it into any "
            "OpenAPI tool.</p>"
            f"<p>Offline: <a href='{s}/reference'>{s}/reference</a> shows every operation, its request examples "
            "and responses with their schemas, drawn by this server with no script. To keep the document: "
            f"<code>curl -o openapi.json SERVER{s}/openapi.json</code>.</p>"
            "<p>Interactive viewers. They load their scripts from public CDNs and stay blank without internet:</p>"
            f"<ul>{viewers}</ul></body></html>"
        )
        return page.encode()


class ReferencePlugin(OpenAPIRenderPlugin):
    """``/schema/reference``: the document as plain HTML, one folded section per operation; works offline."""

    def __init__(self) -> None:
        super().__init__(path="/reference", favicon="", style="")

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        info = openapi_schema["info"]
        title = escape(f"{info['title']} {info['version']}")
        parts = [
            f"<!DOCTYPE html><html><head><meta charset='utf-8'>{PAGE_POLICY}<title>{title} API reference</title>"
            f"<style>{REFERENCE_STYLE}</style></head><body><h1>{title} API reference</h1>"
            f"<p>The OpenAPI document, as this server describes itself: <a href='{SCHEMA_PATH}/openapi.json'>"
            f"{SCHEMA_PATH}/openapi.json</a>. Schemas are shown as JSON; <code>$ref</code> names point into "
            "<a href='#components'>components</a> below.</p>"
        ]
        for path, operations in openapi_schema.get("paths", {}).items():
            for method, op in operations.items():
                if isinstance(op, dict) and "responses" in op:
                    parts.append(_operation(path, method, op))
        schemas = openapi_schema.get("components", {}).get("schemas", {})
        parts.append("<h2 id='components'>components</h2>")
        parts.extend(f"<details id='{escape(n)}'><summary><code>{escape(n)}</code></summary>{_json(s)}</details>"
                     for n, s in schemas.items())  # fmt: skip
        parts.append("</body></html>")
        return "".join(parts).encode()


def _json(value: Any) -> str:
    return f"<pre>{escape(json.dumps(value, indent=2, ensure_ascii=False))}</pre>"


def _operation(path: str, method: str, op: dict[str, Any]) -> str:
    """One operation: summary, parameters, request body (schema and examples), every response."""
    out = [f"<details><summary><span class='m'>{method.upper()}</span> <code>{escape(path)}</code> "]
    out.append(f"{escape(op.get('summary', ''))}</summary>")
    if op.get("description"):
        out.append(f"<p>{escape(op['description'])}</p>")
    if op.get("parameters"):
        out.append("<h4>parameters</h4>" + _json(op["parameters"]))
    for media, content in op.get("requestBody", {}).get("content", {}).items():
        out.append(f"<h4>request body ({escape(media)})</h4>" + _json(content.get("schema", {})))
        for name, example in content.get("examples", {}).items():
            out.append(f"<h4>example: {escape(name)}</h4>" + _json(example.get("value", example)))
    for status, response in op["responses"].items():
        out.append(f"<h4>{escape(str(status))}: {escape(response.get('description', ''))}</h4>")
        for media, content in response.get("content", {}).items():
            out.append(f"<p><code>{escape(media)}</code></p>" + _json(content.get("schema", {})))
    out.append("</details>")
    return "".join(out)


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
    return [SchemaIndexPlugin(), JsonRenderPlugin(), YamlRenderPlugin(), ReferencePlugin(), *viewers]
