"""No other site may frame the playground or the schema pages (clickjacking), and basal's own schema pages run
no script at all: Content-Security-Policy `frame-ancestors 'none'` and `X-Frame-Options: DENY` on every one."""

from __future__ import annotations

import pytest

PAGES = ["/playground", "/playground/playground.js", "/playground/playground.css", "/schema", "/schema/reference",
         "/schema/swagger", "/schema/openapi.json", "/schema/openapi.yaml"]  # fmt: skip


@pytest.mark.parametrize("path", PAGES)
def test_no_page_can_be_framed(client, path):
    r = client.get(path)
    assert r.status_code == 200, path
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize("path", ["/schema", "/schema/reference"])
def test_basal_s_own_schema_pages_allow_no_script(client, path):
    page = client.get(path).text
    from basal.api.wire.schema_pages import PAGE_POLICY

    assert PAGE_POLICY in page and "content=\"default-src 'none'; style-src 'unsafe-inline'\"" in PAGE_POLICY
    assert "<script" not in page
