"""Bad input in both dialects: the documented status and body, and nothing raises past the contract layer."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basal.core.errors import RequestError
from basal.core.request.dialects import decode_body, parse_basal, parse_systemone
from basal.core.request.plan import DecisionRequest
from tests.core.model.test_render import json_values

SERVED = {"basal-demo": "basal-demo", "jev-latest": "basal-demo"}


def systemone(body: dict | list | bytes) -> DecisionRequest:
    raw = body if not isinstance(body, bytes) else decode_body(body, "systemone")
    return parse_systemone(raw, SERVED.get)


def basal(body) -> DecisionRequest:
    raw = body if not isinstance(body, bytes) else decode_body(body, "basal")
    return parse_basal(raw, lambda m: "basal-demo" if m in (None, "basal-demo") else None)


def error_of(fn, body) -> RequestError:
    with pytest.raises(RequestError) as e:
        fn(body)
    return e.value


def req(**questions) -> dict:
    return {"model": "basal-demo", "state": "Order 42 was late.", "questions": questions}


# -- /v1/systemone ------------------------------------------------------------------------------------------


def test_valid_request_plans_every_question():
    plan = systemone(
        req(
            a={"type": "noul", "instructions": "Late?"},
            b={"type": "choice", "criteria": {"x": None, "y": "why"}},
            c={"type": "score", "instructions": "How?", "criteria": ["lo", "hi"]},
        )
    )
    assert plan.model == "basal-demo" and [q.kind for q in plan.questions] == ["noul", "choice", "score"]


def test_unknown_top_level_fields_are_ignored_and_aliases_resolve():
    plan = systemone({**req(a={"type": "noul", "instructions": "?"}), "model": "jev-latest", "extra": 1})
    assert plan.model == "basal-demo"


@pytest.mark.parametrize(
    ("n", "status", "body"),
    [
        (0, 400, {"detail": "Choice question must have at least one choice: q"}),
        (256, 400, {"detail": "Too many choices. Must have at most 255 choices."}),
    ],
)
def test_choice_option_limits(n, status, body):
    e = error_of(systemone, req(q={"type": "choice", "criteria": {f"o{i}": None for i in range(n)}}))
    assert (e.status, e.body) == (status, body)


@pytest.mark.parametrize("n", [11, 255])
def test_choice_with_11_to_255_options_is_planned_whole(n):
    """The TypeSafe dialect takes up to 255 choices (asked in groups, basal.core.decision.large_choice)."""
    (q,) = systemone(req(q={"type": "choice", "criteria": {f"o{i}": None for i in range(n)}})).questions
    assert q.kind == "choice" and q.item.keys == tuple(f"o{i}" for i in range(n)) and q.needs_model


@pytest.mark.parametrize("n", [1, 2, 10])
def test_choice_with_1_to_10_options_is_planned(n):
    (q,) = systemone(req(q={"type": "choice", "criteria": {f"o{i}": None for i in range(n)}})).questions
    assert len(q.item.options) == n and q.needs_model == (n > 1)


def test_score_limits():
    e = error_of(systemone, req(q={"type": "score", "criteria": [str(i) for i in range(11)]}))
    assert (e.status, e.body) == (400, {"detail": "Too many score levels. Must have at most 10 levels."})
    e = error_of(systemone, req(q={"type": "score", "criteria": []}))
    assert e.status == 422 and e.body["detail"][0]["type"] == "too_short"
    e = error_of(systemone, req(q={"type": "score", "criteria": {"a": "b", "c": "d"}}))  # TypeSafe: lists only
    assert e.status == 422 and e.body["detail"][0]["type"] == "list_type"
    e = error_of(systemone, req(q={"type": "score", "criteria": ["ok", None]}))
    assert e.status == 422 and e.body["detail"][0]["loc"] == ["body", "questions", "q", "score", "criteria", 1]


def test_unknown_and_missing_type():
    e = error_of(systemone, req(q={"type": "banana", "criteria": ["a", "b"]}))
    message = "Invalid request: question 'q' has unknown type 'banana'; allowed types: noul, choice, score, multi, act."
    assert (e.status, e.body) == (400, {"detail": {"error_type": "api_usage_error", "message": message}})
    e = error_of(systemone, req(q={"instructions": "?", "criteria": ["a", "b"]}))
    assert e.status == 422
    assert e.body["detail"] == [{"type": "missing", "loc": ["body", "questions", "q", "type"], "msg": "Field required"}]


@pytest.mark.parametrize(
    "question",
    [
        {"type": "noul", "instructions": "?", "evidence": True},
        {"type": "box", "instructions": "Where?"},
    ],
)
def test_extensions_are_unsupported_not_crashes(question):
    e = error_of(systemone, req(q=question))
    assert e.status == 422 and e.body["error"] == "unsupported" and e.body["detail"]


def test_noul_needs_instructions_or_criteria():
    e = error_of(systemone, req(q={"type": "noul"}))
    assert (e.status, e.body) == (400, {"detail": "Noul question must have instructions or criteria: q"})
    e = error_of(systemone, req(q={"type": "noul", "instructions": None}))
    assert e.status == 400
    (q,) = systemone(req(q={"type": "noul", "criteria": {"true": "Late"}})).questions
    assert q.item.question_text == "" and q.item.options == ("Late", "No")


def test_shape_errors_are_all_reported_at_once():
    e = error_of(
        systemone, {"state": 5, "questions": {"a": {"type": "choice"}, "b": {"type": "noul", "instructions": 3}}}
    )
    locs = [d["loc"] for d in e.body["detail"]]
    assert e.status == 422
    assert locs == [
        ["body", "model"],
        ["body", "state"],
        ["body", "questions", "a", "choice", "criteria"],
        ["body", "questions", "b", "noul", "instructions"],
    ]


def test_unknown_question_keys_are_rejected():
    e = error_of(systemone, req(q={"type": "noul", "instructions": "?", "typo": 1}))
    assert e.status == 422 and e.body["detail"][0]["type"] == "extra_forbidden"


def test_unknown_model_is_400():
    e = error_of(systemone, {**req(q={"type": "noul", "instructions": "?"}), "model": "nope"})
    assert (e.status, e.body) == (400, {"detail": {"error_type": "api_usage_error", "message": "Unknown model: nope"}})


@pytest.mark.parametrize("body", [b"", b"{", b"nope", b'{"model": "basal-demo",', b"\xff\xfe", b"[" * 100_000])
def test_non_json_is_422_json_invalid(body):
    e = error_of(systemone, body)
    assert e.status == 422 and e.body["detail"][0]["type"] == "json_invalid"
    e = error_of(basal, body)
    assert e.status == 422 and "error" in e.body


@pytest.mark.parametrize("body", [[], "text", 1, None])
def test_body_not_an_object(body):
    assert error_of(systemone, body).status == 422
    assert error_of(basal, body).status == 422


def test_huge_strings_are_accepted_and_errors_do_not_echo_them():
    huge = "ż" * 2_000_000
    (q,) = systemone(req(q={"type": "noul", "instructions": huge})).questions
    assert len(q.item.question_text) == 2_000_000
    e = error_of(
        systemone, {"model": "basal-demo", "state": 7, "questions": {"q": {"type": "noul", "instructions": [huge]}}}
    )
    assert len(json.dumps(e.body)) < 2000


def test_deep_nesting_is_refused():
    deep: list = []
    for _ in range(200):
        deep = [deep]
    e = error_of(systemone, req(q={"type": "noul", "instructions": deep}))
    assert e.status == 422 and e.body["detail"][0]["type"] == "too_deep"
    assert error_of(basal, {"state": deep, "questions": {}}).status == 422


# -- /v1/basal (upstream dialect) ---------------------------------------------------------------------------


@pytest.mark.parametrize(("criteria", "n"), [(["critical"], 1), ([f"c{i:02}" for i in range(1, 12)], 11), ([], 0)])
def test_upstream_option_count_errors(criteria, n):
    e = error_of(basal, {"state": "x", "questions": {"alarm": {"type": "score", "criteria": criteria}}})
    assert e.status == 422
    assert e.body == {"error": f"question 'alarm': {n} options (supported: 2..10)"}
    assert e.upstream == f"ValueError: question 'alarm': {n} options (supported: 2..10)"


def test_upstream_is_lenient():
    plan = basal(
        {
            "state": "x",
            "questions": {
                "missing": {"type": "noul"},  # no instructions: empty question text
                "null": {"type": "noul", "instructions": None},  # explicit null renders as the text "null"
                "untyped": {"criteria": ["a", "b"]},  # missing type -> choice
                "odd": {"type": "weird", "criteria": ["a", "b"]},
            },
        }
    )  # unknown type -> choice with T = 1
    assert [q.item.question_text for q in plan.questions[:2]] == ["", "null"]
    assert [(q.kind, q.item.type) for q in plan.questions[2:]] == [("choice", "choice"), ("choice", "weird")]
    assert plan.model == "basal-demo"


def test_upstream_errors():
    assert error_of(basal, {"questions": {}}).body == {"error": 'the request has no "state"'}
    assert error_of(basal, {"state": "x", "questions": []}).status == 422
    assert error_of(basal, {"state": "x", "questions": {"q": 5}}).status == 422
    assert error_of(basal, {"model": "other", "state": "x", "questions": {}}).body == {"error": "unknown model: other"}
    e = error_of(basal, {"state": "x", "questions": {"q": {"criteria": ["a", "b"], "option_keys": "maybe"}}})
    assert e.body == {"error": 'option_keys must be "show" or "hide", got \'maybe\''}
    e = error_of(basal, {"state": "x", "questions": {"q": {"type": "multi"}}})
    assert e.body == {"error": "question 'q': multi needs criteria"}


# -- fuzz: any JSON, either dialect: a plan or a RequestError, never anything else -----------------------------

EXTENSION_FIELDS = ["threshold", "max", "min", "costs", "base", "max_error", "defer_action", "evidence"]
question_values = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["noul", "choice", "score", "multi", "act", "box", "x"]) | json_values,
        "instructions": json_values,
        "criteria": json_values,
        "option_keys": json_values,
        "levels": json_values,
        **dict.fromkeys(EXTENSION_FIELDS, json_values),
    },
)


@settings(max_examples=400, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "model": st.sampled_from(["basal-demo", "nope"]) | json_values,
            "state": json_values,
            "questions": st.dictionaries(st.text(max_size=5), question_values, max_size=3) | json_values,
        },
    )
)
def test_fuzz_never_raises_past_the_contract(body):
    for parse in (systemone, basal):
        try:
            plan = parse(body)
        except RequestError as e:
            assert e.status in (400, 422)
            json.dumps(e.body)
        else:
            assert all(2 <= len(i.options) <= 10 for q in plan.questions if q.needs_model for i in q.asked)
