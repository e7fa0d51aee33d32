"""/playground over HTTP, without a browser: `/` redirects there, the page and its assets are served from the
package with a same-origin-only Content-Security-Policy, nothing in them names another host, and none of it is in
the OpenAPI document. (The page at work in Chromium: test_playground_browser.py.)"""

from __future__ import annotations

import re

import pytest

from basal.api.routes.playground import STATIC

EXTERNAL = re.compile(r"""https?://|(?:src|href|action)\s*=\s*["']?//|@import|url\(\s*["']?(?:https?:)?//""")
ASSETS = {"playground.css": "text/css", "playground.js": "text/javascript", "index.html": "text/html"}
ASSETS |= {"labelled.html": "text/html", "labelled.js": "text/javascript"}


def test_root_redirects_to_the_playground(client):
    r = client.get("/", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (302, "playground")
    assert client.get("/").url.path == "/playground"


def test_the_page_and_its_assets(client):
    page = client.get("/playground")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == (STATIC / "index.html").read_text()
    for name in re.findall(r'(?:src|href)="playground/([^"]+)"', page.text):
        r = client.get(f"/playground/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(ASSETS[name])
        assert "default-src 'self'" in r.headers["content-security-policy"]
    assert "default-src 'self'" in page.headers["content-security-policy"]


@pytest.mark.parametrize("path", ["/playground", "/playground/playground.js", "/playground/playground.css"])
def test_head_and_one_charset(client, path):
    """HEAD answers as GET does, without a body; the content type names its charset once."""
    got, head = client.get(path), client.head(path)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["content-length"] == str(len(got.content))
    assert got.headers["content-type"].count("charset") == 1 and got.headers["content-type"].endswith("charset=utf-8")


def test_models_say_which_are_synthetic(client):
    """The demo model is synthetic (the playground says so); /v1/models tells every client."""
    assert [m["synthetic"] for m in client.get("/v1/models").json()["models"]] == [True]


@pytest.mark.parametrize("name", ["nope.js", "..%2Fplayground.py", "playground.py", "%2e%2e"])
def test_other_files_are_404(client, name):
    assert client.get(f"/playground/{name}").status_code == 404


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_no_asset_names_another_host(name):
    assert EXTERNAL.findall((STATIC / name).read_text()) == []


def test_the_external_url_check_sees_one():
    """Negative control: the pattern finds the ways a page would load from a CDN."""
    planted = ['<script src="https://cdn.example/x.js">', "<link href='//cdn.example/a.css'>", "url(//x/y.png)"]
    assert [bool(EXTERNAL.search(s)) for s in planted] == [True, True, True]


def test_not_in_the_openapi_document(client):
    paths = client.get("/schema/openapi.json").json()["paths"]
    assert not [p for p in paths if p == "/" or p.startswith("/playground")]
