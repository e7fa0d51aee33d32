"""The native SDK's fields over HTTP: a refusal is 422 ``{"error": ...}`` (the /v1/basal shape), never a 200 with
only a warning header; ``lang`` is honoured."""

from __future__ import annotations

from tests.api.test_http import post

NOUL = {"type": "noul", "instructions": "Was it late?"}


def test_media_is_refused_in_the_dialects_shape(client):
    body = {"state": "x", "questions": {"q": NOUL}, "media": [{"type": "image", "data": "aGk="}]}
    r = post(client, body, "/v1/basal")
    assert r.status_code == 422 and list(r.json()) == ["error"] and "media" in r.json()["error"]
    assert "x-basal-warnings" not in r.headers


def test_lang_is_honoured_without_a_warning(client):
    answers = {}
    for lang in ("pl", "en"):
        r = post(client, {"state": "The order was late.", "lang": lang, "questions": {"q": NOUL}}, "/v1/basal")
        assert r.status_code == 200 and "x-basal-warnings" not in r.headers
        answers[lang] = r.json()["answers"]["q"]["noul"]
    assert answers["pl"] != answers["en"]  # another prompt (Polish system text and Tak/Nie), another answer
