"""A state longer than the served model can read is refused before `facts: "auto"` scans it: the parsers know each
model's prompt limit (through `ModelInfo`), so the answer is the refusal admission gives, without the facts work."""

from __future__ import annotations

import pytest

import basal.core.facts.request as facts_request
from tests.api.test_http import post


@pytest.fixture
def facts_runs(monkeypatch) -> list[int]:
    """Counts the facts extractions (each still runs, so a request that gets past the check is answered as before)."""
    calls: list[int] = []
    inject = facts_request.inject

    def counted(text: str) -> str:
        calls.append(len(text))
        return inject(text)

    monkeypatch.setattr(facts_request, "inject", counted)
    return calls


def _over_the_model(engines) -> tuple[str, int, int]:
    engine = engines.engines[engines.default]
    unit = "Kwota 100 zł. "
    state = unit * (engine.prompt_char_limit // len(unit) + 1)
    assert len(state) > engine.prompt_char_limit
    return state, engine.prompt_char_limit, engine.context


@pytest.mark.parametrize("path", ["/v1/systemone", "/v1/basal"])
def test_a_state_over_the_models_prompt_limit_is_refused_before_facts(client, engines, facts_runs, path):
    state, chars, context = _over_the_model(engines)
    body = {"state": state, "facts": "auto", "questions": {"q": {"type": "noul", "instructions": "Czy?"}}}
    if path == "/v1/systemone":
        body["model"] = "jev-latest"
    r = post(client, body, path)
    message = f"a prompt has over {chars} characters; the model reads at most {context} tokens"
    if path == "/v1/systemone":
        assert r.status_code == 400 and r.json() == {
            "detail": {"error_type": "max_tokens_exceeded", "message": message}
        }, r.text
    else:
        assert r.status_code == 422 and r.json() == {"error": message}, r.text
    assert facts_runs == []


@pytest.mark.parametrize("path", ["/v1/systemone", "/v1/basal"])
def test_a_state_within_the_limit_still_gets_its_facts(client, facts_runs, path):
    body = {"state": "Kwota 100 zł.", "facts": "auto", "questions": {"q": {"type": "noul", "instructions": "Czy?"}}}
    if path == "/v1/systemone":
        body["model"] = "jev-latest"
    r = post(client, body, path)
    assert r.status_code == 200, r.text
    assert facts_runs == [len("Kwota 100 zł.")]


def test_a_question_that_does_not_run_the_model_is_not_refused_by_its_limit(client, engines, facts_runs):
    """A one-option choice never runs the model (p = 1), so a long state is no reason to refuse it."""
    state, _chars, _context = _over_the_model(engines)
    body = {"model": "jev-latest", "state": state, "questions": {"q": {"type": "choice", "criteria": {"only": "x"}}}}
    r = post(client, body)
    assert r.status_code == 200, r.text
