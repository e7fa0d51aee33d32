"""Every field the native SDK (basal-client 0.6.0) can send on /v1/basal is honoured or refused with 422 in the
dialect's shape; genuinely unknown fields stay lenient (a warning, as upstream)."""

from __future__ import annotations

import msgspec
import pytest

from basal.core.decision.act import NO_THRESHOLD, choose_action
from basal.core.errors import RequestError
from basal.core.request.dialects import parse_basal

STATE = "The order arrived late and the box was damaged."
NOUL = {"type": "noul", "instructions": "Was the order late?"}
MULTI = {"type": "multi", "instructions": "Which issues?", "criteria": {"late": "Late", "box": "Damaged box"}}
THRESHOLDS = {"0.01": {"confidence": 0.93}, "0.05": {"confidence": 0.74}}


def plan(body: dict):
    return parse_basal({"state": STATE, **body}, lambda _m: "demo")


def refusal(body: dict) -> dict:
    with pytest.raises(RequestError) as e:
        plan(body)
    assert e.value.status == 422 and list(e.value.body) == ["error"]
    return e.value.body


@pytest.mark.parametrize("lang", ["pl", "en"])
def test_lang_overrides_language_detection(lang):
    questions = {"n": NOUL, "m": MULTI, "a": {"type": "act", "instructions": "?", "costs": {"wrong": 2, "defer": 1}}}
    request = plan({"lang": lang, "questions": questions})
    items = [item for q in request.questions for item in (q.item, *q.branches)]
    assert {item.lang for item in items} == {lang} and not request.warnings
    noul = request.questions[0].item
    assert noul.options == (("Tak", "Nie") if lang == "pl" else ("Yes", "No"))
    assert noul.prompt((0, 1)) != plan({"questions": {"n": NOUL}, "lang": "en" if lang == "pl" else "pl"}).questions[
        0
    ].item.prompt((0, 1))


def test_lang_absent_or_null_detects_and_a_wrong_value_is_refused():
    assert plan({"questions": {"n": NOUL}}).questions[0].item.lang == "en"
    assert plan({"questions": {"n": NOUL}, "lang": None}).questions[0].item.lang == "en"
    assert '"lang" must be "pl" or "en"' in refusal({"questions": {"n": NOUL}, "lang": "de"})["error"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"media": [{"type": "image", "data": "aGk="}]}, '"media": media inputs'),
        ({"detail": "high"}, '"detail": media detail'),
        ({"stream": True}, '"stream": streaming'),
        ({"questions": {"t": {"type": "tool", "instructions": "?", "tools": []}}}, "tool questions are not supported"),
        ({"questions": {"t": {"type": "classify", "criteria": ["a", "b"]}}}, "classify tasks are not supported"),
        ({"questions": {"t": {"type": "extract", "schema": {}}}}, "extract tasks are not supported"),
        ({"questions": {"m": {**MULTI, "objective": "f1"}}}, "multi objective 'f1' is not supported"),
        ({"questions": {"m": {**MULTI, "exclusive": ["late"]}}}, "multi 'exclusive' is not supported"),
        ({"questions": {"m": {**MULTI, "fallback": "late"}}}, "multi 'fallback' is not supported"),
        ({"questions": {"m": {**MULTI, "fallback_threshold": 0.3}}}, "multi 'fallback_threshold' is not supported"),
    ],
)
def test_what_basal_does_not_do_is_refused(body, says):
    assert says in refusal({"questions": {"n": NOUL}, **body})["error"]


def test_threshold_objective_and_stream_false_are_what_basal_does():
    request = plan({"stream": False, "questions": {"m": {**MULTI, "objective": "threshold"}}})
    assert not request.warnings and request.questions[0].kind == "multi"


def test_unknown_fields_stay_lenient_with_a_warning():
    request = plan({"questions": {"n": {**NOUL, "colour": "red"}}, "priority": 1})
    assert request.warnings == ("ignored field 'priority'", "question 'n': ignored field 'colour'")


def act_spec(max_error):
    q = {"type": "act", "instructions": "?", "costs": {"wrong": 2, "defer": 1}, "max_error": max_error}
    return plan({"questions": {"a": q}}).questions[0].spec


@pytest.mark.parametrize(("p", "action"), [(0.95, "true"), (0.8, "defer"), (0.6, "defer")])
def test_max_error_list_certifies_each_target(p, action):
    """[0.01, 0.05]: both certified (0.93, 0.74); the answer must meet both, so the strictest decides."""
    answer = msgspec.to_builtins(choose_action({"true": p, "false": 1 - p}, act_spec([0.05, 0.01]), THRESHOLDS, True))
    assert answer["action"] == action and "max_error" not in answer
    assert answer.get("refused") == ("true" if action == "defer" else None)
    single = choose_action({"true": p, "false": 1 - p}, act_spec(0.05), THRESHOLDS, True)
    assert single.action == ("true" if p >= 0.74 else "defer")


def test_max_error_list_with_an_uncertified_target_says_so():
    answer = choose_action({"true": 0.99, "false": 0.01}, act_spec([0.01, 0.2]), THRESHOLDS, True)
    assert answer.max_error == NO_THRESHOLD and answer.action == "true"


@pytest.mark.parametrize("bad", [[], ["0.01"], [True]])
def test_max_error_list_must_hold_numbers(bad):
    assert (
        "max_error must be a number or a non-empty list"
        in refusal({"questions": {"a": {"type": "act", "instructions": "?", "costs": {"wrong": 2}, "max_error": bad}}})[
            "error"
        ]
    )
