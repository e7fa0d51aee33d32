"""The official client, typesafe-sdk, against a live basal server on loopback."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from typesafe_sdk import Choice, Noul, RetryPolicy, Score, TypeSafeClient
from typesafe_sdk._core.errors import (
    TypeSafeAuthenticationError,
    TypeSafeBadRequestError,
    TypeSafeInternalServerError,
    TypeSafeUnprocessableEntityError,
)

from basal.api.settings import ApiSettings
from tests.servers import live_server, make_engines


def sdk(url: str, **kw) -> TypeSafeClient:
    return TypeSafeClient(api_key=kw.pop("api_key", "test-key"), base_url=url, retry=RetryPolicy(max_retries=0), **kw)


def test_every_question_type_and_the_models_list(server):
    url, _ = server
    with sdk(url) as client:  # no model given: the SDK sends its default, jev-latest
        r = client.system_one(
            state={"msg": "My card was charged twice for order 5512."},
            questions={
                "billing": Noul(instructions="Is this about billing?", criteria={"true": "A payment problem"}),
                "team": Choice(instructions="Which team?", criteria={"billing": "Payments", "tech": None}),
                "anger": Score(instructions="How angry?", criteria=["calm", {"level": "angry"}, ["very", "angry"]]),
                "plain": {"type": "noul", "instructions": "Is it urgent?"},
            },
        )
        assert r.model == "basal-synthetic-demo"
        assert 0 <= r.nouls["billing"].noul <= 1 and 0 <= r.nouls["plain"].noul <= 1
        assert r.choices["team"].choice in ("billing", "tech")
        assert abs(sum(r.choices["team"].probabilities.values()) - 1) < 1e-9
        assert r.scores["anger"].legend == {0: "calm", 1: {"level": "angry"}, 2: ["very", "angry"]}
        assert 0 <= r.scores["anger"].score <= 2
        assert r.request_id.startswith("req_")
        assert [m.name for m in client.models.list().models] == ["basal-synthetic-demo"]


def test_the_readme_sdk_example(server, capsys):
    """The README's SDK example, as written there, run against the live server at its own address."""
    url, _ = server
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'base_url="http://127.0.0.1:8000"' in code  # the address `make serve` listens on
    namespace: dict = {}
    exec(compile(code.replace("http://127.0.0.1:8000", url), "README.md", "exec"), namespace)
    result = namespace["result"]
    assert result.model == "basal-synthetic-demo" and 0 <= result.nouls["urgent"].noul <= 1
    assert result.choices["team"].choice in ("billing", "technical")
    assert capsys.readouterr().out.split()[1] == result.choices["team"].choice  # what its print shows


def test_compressed_requests_from_the_sdk(server):
    url, _ = server
    with sdk(url, compression="zstd") as client:
        r = client.system_one(
            state="Zamówienie dotarło uszkodzone. " * 60, questions={"q": Noul(instructions="Zwrot?")}
        )
        assert 0 <= r.nouls["q"].noul <= 1


def test_error_classes_400_and_422(server):
    url, _ = server
    with sdk(url) as client:
        with pytest.raises(TypeSafeBadRequestError, match=r"Unknown model: gpt-9 \(served: .*GET /v1/models"):
            client.system_one(state="x", questions={"q": Noul(instructions="?")}, model="gpt-9")
        with pytest.raises(TypeSafeBadRequestError, match="question 'q' has unknown type 'yesno'; allowed types"):
            client.system_one(state="x", questions={"q": {"type": "yesno", "instructions": "?"}})
        with pytest.raises(TypeSafeBadRequestError, match="Too many score levels"):
            client.system_one(state="x", questions={"q": Score(instructions="?", criteria=[str(i) for i in range(11)])})
        with pytest.raises(TypeSafeUnprocessableEntityError, match=r"q\.noul\.critera: .*did you mean 'criteria'"):
            client.system_one(state="x", questions={"q": {"type": "noul", "instructions": "?", "critera": {}}})


def test_error_class_529_when_overloaded(demo_model):
    engines = make_engines(demo_model, max_inflight=1, slow_s=0.4)
    with live_server(engines) as url:
        body = {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}
        blocker = threading.Thread(target=lambda: httpx.post(f"{url}/v1/systemone", json=body, timeout=30))
        blocker.start()
        deadline = time.monotonic() + 10
        while engines.inflight < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        r = httpx.post(f"{url}/v1/systemone", json=body, timeout=30)
        assert r.status_code == 529
        assert r.headers["retry-after"] == "1" and r.headers["retry-after-ms"] == "1000"
        assert r.json()["detail"]["error_type"] == "overloaded_error"
        with sdk(url) as client, pytest.raises(TypeSafeInternalServerError) as e:
            client.system_one(state="x", questions={"q": Noul(instructions="?")})
        assert e.value.status == 529
        blocker.join()


def test_auth_errors_map_to_sdk_classes(demo_model):
    with live_server(make_engines(demo_model), ApiSettings(api_keys=("k1",))) as url:
        with sdk(url, api_key="wrong") as client, pytest.raises(TypeSafeAuthenticationError):
            client.system_one(state="x", questions={"q": Noul(instructions="?")})
        r = httpx.post(f"{url}/v1/systemone", json={"model": "m", "state": "x", "questions": {}})
        assert r.status_code == 403
        with sdk(url, api_key="k1") as client:
            assert client.system_one(state="x", questions={"q": Noul(instructions="?")}).nouls["q"].noul >= 0


def test_multi_and_act_answers_are_dropped_by_the_sdk_but_in_its_raw_response(server):
    """What docs/http-api.md says of typesafe-sdk 0.7.5: it has no class for `multi` or `act` answers and leaves them
    out of `answers` (a logged warning only); the server answered them, and the raw response holds them."""
    url, _ = server
    with sdk(url) as client:
        r = client.system_one(
            state="My card was charged twice and the app crashes.",
            questions={
                "topics": {"type": "multi", "instructions": "Which topics?", "criteria": ["billing", "app"]},
                "next": {"type": "act", "instructions": "Is it fraud?", "costs": {"wrong": 10, "defer": 1}},
                "urgent": Noul(instructions="Is it urgent?"),
            },
        )
        assert set(r.answers) == {"urgent"}
        raw = r.raw_http_response.json()["answers"]
        assert raw["topics"]["type"] == "multi" and raw["next"]["type"] == "act"
