"""Errors that say what to do, over HTTP in both dialects: each message names the problem and the fix, and the
body keeps its dialect's shape (docs/http-api.md §4)."""

from __future__ import annotations

import gzip
import json

import pytest
import zstandard

from basal.api.routes.decisions import MAX_WARNINGS_HEADER
from tests.api.test_http import REQUEST, post

SERVED = "served: basal-synthetic-demo; aliases jev-latest, jev-preview -> basal-synthetic-demo"
NOUL = {"type": "noul", "instructions": "Czy zwrot?"}


def test_unknown_typesafe_type_names_the_question_and_the_allowed_types(client):
    r = post(client, {**REQUEST, "questions": {"refund": {"type": "yesno", "instructions": "?"}}})
    assert r.status_code == 400
    detail = r.json()["detail"]
    assert detail["error_type"] == "api_usage_error"
    assert detail["message"] == (
        "Invalid request: question 'refund' has unknown type 'yesno'; allowed types: noul, choice, score, multi, act."
    )


@pytest.mark.parametrize(
    ("path", "read"),
    [("/v1/systemone", lambda b: b["detail"]["message"]), ("/v1/basal", lambda b: b["error"])],
)
def test_unknown_model_lists_the_served_models_and_aliases(client, path, read):
    r = post(client, {**REQUEST, "model": "basal-1.5-max"}, path)
    message = read(r.json())
    assert r.status_code == (400 if path == "/v1/systemone" else 422)
    assert message.lower().startswith("unknown model: basal-1.5-max (")
    assert SERVED in message and "GET /v1/models" in message


def test_basal_unknown_type_is_named(client):
    r = post(client, {"state": "x", "questions": {"q": {"type": "yesno", "instructions": "?"}}}, "/v1/basal")
    assert r.status_code == 422 and list(r.json()) == ["error"]
    assert r.json()["error"] == (
        "question 'q': 0 options (supported: 2..10); type 'yesno' is not one of choice, noul, score, multi, act, "
        "so it was asked as a choice"
    )
    ok = post(client, {"state": "x", "questions": {"q": {"type": "yesno", "criteria": ["a", "b"]}}}, "/v1/basal")
    assert ok.status_code == 200 and "type 'yesno' is not one of" in ok.headers["x-basal-warnings"]


def test_basal_known_type_keeps_upstreams_message_and_a_misspelled_field_is_named(client):
    r = post(client, {"state": "x", "questions": {"q": {"type": "score", "criteria": ["a"]}}}, "/v1/basal")
    assert r.json() == {"error": "question 'q': 1 options (supported: 2..10)"}
    r = post(client, {"state": "x", "questions": {"q": {"critera": {"a": None, "b": None}}}}, "/v1/basal")
    assert r.json() == {
        "error": "question 'q': 0 options (supported: 2..10); ignored field 'critera' (did you mean 'criteria'?)"
    }


def test_typesafe_misspelled_field_suggests_the_nearest(client):
    r = post(client, {**REQUEST, "questions": {"q": {"type": "noul", "instrutions": "?", "zzz": 1}}})
    assert r.status_code == 422
    errors = {tuple(e["loc"]): (e["type"], e["msg"]) for e in r.json()["detail"]}
    assert errors[("body", "questions", "q", "noul", "instrutions")] == (
        "extra_forbidden",
        "Extra inputs are not permitted (did you mean 'instructions'?)",
    )
    assert errors[("body", "questions", "q", "noul", "zzz")] == ("extra_forbidden", "Extra inputs are not permitted")
    body = {"model": "jev-latest", "state": "x", "questoins": {"q": NOUL}}
    (missing,) = post(client, body).json()["detail"]
    assert missing == {
        "type": "missing",
        "loc": ["body", "questions"],
        "msg": "Field required (the body has 'questoins'; did you mean 'questions'?)",
    }


def test_basal_ignored_fields_are_reported_in_a_header(client):
    body = {"state": "x", "modle": "m", "questions": {"q": {**NOUL, "instrucions": "?", "criteria": None}}}
    r = post(client, body, "/v1/basal")
    assert r.status_code == 200
    assert r.headers["x-basal-warnings"] == (
        "ignored field 'modle' (did you mean 'model'?); "
        "question 'q': ignored field 'instrucions' (did you mean 'instructions'?)"
    )
    assert "x-basal-warnings" not in post(client, {"state": "x", "questions": {"q": NOUL}}, "/v1/basal").headers


def test_basal_warnings_stay_small_with_thousands_of_unknown_keys(client, caplog):
    keys = {f"k{i}-ż\r\n" + "x" * 60: i for i in range(3000)}
    r = post(client, {"state": "x", **keys, "questions": {"q": {**NOUL, **keys}}}, "/v1/basal")
    assert r.status_code == 200
    header = r.headers["x-basal-warnings"]
    assert len(header) <= MAX_WARNINGS_HEADER and header.isascii() and "\r" not in header
    assert header.endswith("5995 more not listed")  # 6000 ignored, 5 listed
    assert "5995 more not listed" in caplog.text


@pytest.mark.parametrize(
    ("path", "read"),
    [
        ("/v1/systemone", lambda b: b["detail"][0]["msg"]),
        ("/v1/basal", lambda b: b["error"]),
    ],
)
def test_empty_and_compressed_bodies_say_what_to_do(client, path, read):
    raw = json.dumps(REQUEST).encode()
    cases = {
        b"": "empty body",
        b"  \n": "empty body",
        gzip.compress(raw): "the body is gzip data: set Content-Encoding: gzip",
        zstandard.ZstdCompressor().compress(raw): "the body is zstd data: set Content-Encoding: zstd",
    }
    for body, reason in cases.items():
        r = post(client, body, path)
        assert r.status_code == 422 and read(r.json()).endswith(f": {reason}"), r.text
    r = post(client, b"{not json", path)
    assert read(r.json()) == ("JSON decode error" if path == "/v1/systemone" else r.json()["error"])
    assert "empty" not in r.text and "Content-Encoding" not in r.text


def test_basal_encoding_errors_keep_the_basal_shape(client):
    r = post(client, b"{}", "/v1/basal", **{"content-encoding": "br"})
    assert r.status_code == 415 and list(r.json()) == ["error"] and "gzip, deflate or zstd" in r.json()["error"]
    r = post(client, b"not gzip", "/v1/basal", **{"content-encoding": "gzip"})
    assert r.status_code == 400 and list(r.json()) == ["error"]
