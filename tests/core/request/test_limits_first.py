"""Every limit that sizes alone can check is checked before the work it limits: facts ("auto") are not injected
into a state whose prompts cannot fit, and a multi's branches (labels x questions) are not built when their
prompts cannot fit either."""

from __future__ import annotations

import pytest

import basal.core.facts.request as facts_request
import basal.core.request.extensions as ext
from basal.core.errors import RequestError
from basal.core.request.dialects import parse_basal, parse_systemone
from basal.core.request.limits import Limits

LIMITS = Limits(max_request_chars=10_000)


def parse(raw, dialect: str, limits: Limits = LIMITS):
    if dialect == "systemone":
        return parse_systemone({"model": "demo", **raw}, lambda m: m, limits=limits)
    return parse_basal(raw, lambda m: "demo", limits=limits)


@pytest.fixture
def no_work(monkeypatch):
    """The work that must not start: injecting facts, building branch items."""

    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the limit check")

    monkeypatch.setattr(facts_request, "inject", forbidden)
    monkeypatch.setattr(ext, "branch_items", forbidden)


@pytest.mark.parametrize("dialect", ["systemone", "basal"])
def test_facts_are_not_injected_into_a_state_over_the_limit(no_work, dialect):
    raw = {"state": "Kwota 100 zł. " * 400, "facts": "auto", "questions": {"q": {"type": "noul", "instructions": "?"}}}
    with pytest.raises(RequestError) as e:
        parse(raw, dialect)
    assert e.value.status == (400 if dialect == "systemone" else 422)
    assert "at least" in str(e.value.body)


@pytest.mark.parametrize("dialect", ["systemone", "basal"])
def test_branches_are_not_built_past_the_limit(no_work, dialect):
    questions = {f"m{i}": {"type": "multi", "criteria": [f"l{j}" for j in range(1000)]} for i in range(16)}
    with pytest.raises(RequestError) as e:
        parse({"state": "s", "questions": questions}, dialect)
    assert "at least" in str(e.value.body)


def test_a_prompt_limit_is_checked_before_facts(no_work):
    raw = {"state": "x" * 600, "facts": "auto", "questions": {"q": {"type": "noul", "instructions": "?"}}}
    with pytest.raises(RequestError, match="max_prompt_chars"):
        parse(raw, "basal", Limits(max_prompt_chars=500))


@pytest.mark.parametrize("dialect", ["systemone", "basal"])
def test_requests_within_the_limits_are_planned(dialect):
    questions = {"m": {"type": "multi", "criteria": ["a", "b"]}, "n": {"type": "noul", "instructions": "?"}}
    plan = parse({"state": "Kwota 100 zł.", "facts": "auto", "questions": questions}, dialect)
    assert len(plan.questions) == 2 and len(plan.questions[0].branches) == 2
