"""The API docs under /schema: a document whose references all resolve, request examples that are answered, and
pages that work offline or say that they need the internet."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.api.test_http import post

VIEWERS = ("/schema/swagger", "/schema/redoc", "/schema/elements", "/schema/rapidoc")


@pytest.fixture(scope="module")
def document(client) -> dict[str, Any]:
    r = client.get("/schema/openapi.json")
    assert r.status_code == 200
    return r.json()


def references(node: Any) -> list[str]:
    """Every ``$ref`` and every discriminator mapping target in `node`."""
    found: list[str] = []
    stack = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if isinstance(x.get("$ref"), str):
                found.append(x["$ref"])
            mapping = x.get("discriminator", {}).get("mapping", {}) if isinstance(x.get("discriminator"), dict) else {}
            found.extend(mapping.values())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return found


def resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def test_every_reference_resolves(document):
    refs = references(document)
    assert len(refs) > 5  # the components' answer unions are referenced
    for ref in refs:
        assert isinstance(resolve(document, ref), dict), ref
    assert "$defs" not in json.dumps(document)


def test_the_question_union_keeps_its_discriminator(document):
    body = document["paths"]["/v1/systemone"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    union = body["properties"]["questions"]["additionalProperties"]
    assert union["discriminator"] == {"propertyName": "type"}
    tags = [variant["properties"]["type"]["enum"] for variant in union["anyOf"]]
    assert tags == [["noul"], ["choice"], ["score"], ["multi"], ["act"]]


def test_references_to_a_missing_target_are_caught():
    """Negative control: the resolver fails on the kind of reference the document used to have."""
    with pytest.raises(KeyError):
        resolve({"components": {}}, "#/$defs/NoulQuestion")


@pytest.mark.parametrize("path", ["/v1/systemone", "/v1/basal"])
def test_request_examples_are_answered(client, document, path):
    examples = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["examples"]
    assert len(examples) == 2
    for name, example in examples.items():
        r = post(client, example["value"], path)
        assert r.status_code == 200, (name, r.text)
        assert set(r.json()["answers"]) == set(example["value"]["questions"])


def test_schema_index_works_offline_and_links_the_document(client):
    r = client.get("/schema")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "<script" not in page and "http://" not in page and "https://" not in page  # nothing loaded from elsewhere
    assert "stay blank without internet" in page
    links = re.findall(r"href='([^']+)'", page)
    assert set(links) == {"/schema/openapi.json", "/schema/openapi.yaml", "/schema/reference", *VIEWERS}
    for link in links:
        assert client.get(link).status_code == 200, link


def test_the_reference_shows_every_operation_offline(client):
    """/schema/reference draws the document itself (no script): every operation, every request example, every
    response status, every component schema."""
    document = client.get("/schema/openapi.json").json()
    r = client.get("/schema/reference")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "<script" not in page and "<link" not in page
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            section = page[page.index(f"<span class='m'>{method.upper()}</span> <code>{path}</code>") :]
            section = section[: section.index("</details>")]
            for status in op["responses"]:
                assert f"<h4>{status}: " in section, (path, method, status)
            for content in op.get("requestBody", {}).get("content", {}).values():
                for name in content.get("examples", {}):
                    assert f"<h4>example: {name}</h4>" in section
    assert all(f"<details id='{name}'>" in page for name in document["components"]["schemas"])


@pytest.mark.parametrize("path", VIEWERS)
def test_each_viewer_says_it_needs_its_cdn(client, path):
    page = client.get(path).text
    assert "without internet it stays blank" in page and "href='/schema/openapi.json'" in page
    assert "href='/schema/reference'" in page
    assert page.index("<body>") < page.index("without internet")  # in the page, whether or not the scripts load
