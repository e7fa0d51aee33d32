"""multi and act decision logic: the golden vectors exactly, through the parser of each dialect, and properties."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basal.core.decision.act import NEEDS_DEFER, choose_action
from basal.core.decision.multi import multi_answer, select
from basal.core.decision.respond import answer_act
from basal.core.errors import RequestError
from basal.core.model.model_dir import Calibration
from basal.core.request.dialects import parse_basal, parse_systemone
from basal.core.request.extensions import MultiSpec
from tests.conftest import DATA

VECTORS = [json.loads(line) for line in (DATA / "extensions" / "multi_act.jsonl").read_text().splitlines()]
TEMPERATURES = {"noul": 1.39, "choice": 1.14, "score": 1.54}


def _of(kind: str) -> list[dict]:
    return [v for v in VECTORS if v["kind"] == kind]


def _plan(dialect: str, question: dict):
    body = {"model": "m", "state": "x", "questions": {"q": question}}
    parse = parse_basal if dialect == "basal" else parse_systemone
    return parse(body, lambda _name: "m").questions[0]


def _encoded(answer) -> dict:
    return json.loads(msgspec.json.encode(answer))  # keeps the key order of the wire


# -- multi -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("v", _of("multi_select"), ids=lambda v: v["id"])
def test_multi_select_vectors(v):
    """Upstream semantics (/v1/basal): the rule goes through the parser (int() of max/min, float() of threshold)."""
    question = _plan("basal", {"type": "multi", "criteria": list(v["p_yes"]), **v["rule"]})
    answer = _encoded(multi_answer(v["p_yes"], question.spec))
    assert answer == v["expected"] and list(answer) == list(v["expected"])
    assert list(answer["probabilities"]) == list(v["p_yes"])
    if "basal_rs" in v:  # the TypeSafe dialect follows the Rust engine (negative max clamps to 0)
        rust = _plan("systemone", {"type": "multi", "criteria": list(v["p_yes"]), **v["rule"]})
        assert _encoded(multi_answer(v["p_yes"], rust.spec)) == v["basal_rs"]


def test_multi_branches_are_yes_no_questions_about_each_label():
    q = _plan(
        "basal", {"type": "multi", "instructions": "Które tematy?", "criteria": {"login": "Logowanie", "x": None}}
    )
    assert [b.question_text for b in q.branches] == [
        "Które tematy?\nCzy dotyczy: „Logowanie”?",
        "Które tematy?\nCzy dotyczy: „x”?",
    ]
    assert all(b.options == ("Tak", "Nie") and b.keys == ("true", "false") and b.type == "noul" for b in q.branches)
    en = _plan("systemone", {"type": "multi", "criteria": ["late"]})
    assert en.branches[0].question_text == '\nDoes this apply: "late"?' and en.branches[0].options == ("Yes", "No")
    assert en.needs_model and en.branch_count == 1


def test_multi_upstream_number_semantics():
    q = _plan("basal", {"type": "multi", "criteria": ["a"], "threshold": "0.7", "max": "2", "min": True})
    assert (q.spec.threshold, q.spec.max, q.spec.min) == (0.7, 2, 1)
    with pytest.raises(RequestError) as e:
        _plan("basal", {"type": "multi", "criteria": ["a"], "threshold": None})
    assert e.value.body == {"error": "float() argument must be a string or a real number, not 'NoneType'"}
    # int() of max fails only when upstream builds the answer; nothing runs before it here, so it fails at once
    with pytest.raises(RequestError) as e:
        _plan("basal", {"type": "multi", "criteria": ["a"], "max": "1.9"})
    assert e.value.body == {"error": "invalid literal for int() with base 10: '1.9'"}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=12),
    st.floats(0, 1),
    st.none() | st.integers(-5, 15),
    st.none() | st.integers(-5, 15),
    st.booleans(),
)
def test_selection_respects_min_and_max(ps, threshold, max_, min_, clamp):
    p_yes = {f"k{i}": p for i, p in enumerate(ps)}
    selected = select(p_yes, MultiSpec(tuple(p_yes), threshold, max_, min_, clamp))
    order = sorted(p_yes, key=lambda k: -p_yes[k])
    assert selected == order[: len(selected)]  # always the most probable labels, in descending order
    passing = sum(p >= threshold for p in ps)
    cap = passing if max_ is None else len(order[:passing][: max(max_, 0) if clamp else max_])
    if min_ is not None and cap < min_:
        assert len(selected) == min(min_, len(ps))  # min fills up from the most probable (after max)
    else:
        assert len(selected) == cap
        if max_ is not None and max_ >= 0:
            assert len(selected) <= max_


# -- act -------------------------------------------------------------------------------------------------------


def _act_question(v: dict) -> dict:
    keys = list(v["probabilities"])
    question = {"type": "act", "option_keys": v.get("option_keys", "show")}
    if v.get("base", "noul") == "noul":
        question["base"] = "noul"
    else:
        question.update(base=v["base"], criteria=dict.fromkeys(keys))
    question["costs"] = v.get("costs") or v["cost_matrix"]
    if v.get("defer_action") and v.get("cost_matrix") and v["defer_action"] not in v["cost_matrix"]:
        question["defer_action"] = v["defer_action"]
    if v.get("max_error") is not None:
        question["max_error"] = v["max_error"]
    return question


def _thresholds(v: dict) -> dict:
    certified = v.get("certified_confidence")
    if certified is None and isinstance(v.get("threshold"), str) and "exists" in v["threshold"]:
        certified = 0.5  # "the certified confidence exists and is <= the confidence (fixture: e.g. 0.5)"
    return {} if certified is None else {str(v["max_error"]): {"confidence": certified}}


@pytest.mark.parametrize("v", _of("act_decide"), ids=lambda v: v["id"])
@pytest.mark.parametrize("dialect", ["basal", "systemone"])
def test_act_decide_vectors(v, dialect):
    question = _plan(dialect, _act_question(v))
    assert question.spec.outcomes == tuple(v["probabilities"])
    calibration = Calibration(TEMPERATURES if v["temperatures_present"] else {}, _thresholds(v))
    if "error" in v["expected"]:
        with pytest.raises(RequestError) as e:
            answer_act(question, _dist(v["probabilities"]), calibration, dialect)
        message = v["expected"]["error"]
        body = e.value.body
        assert (body == {"error": message}) if dialect == "basal" else body["detail"][0]["msg"] == message
        return
    answer = _encoded(
        choose_action(v["probabilities"], question.spec, calibration.thresholds, v["temperatures_present"])
    )
    assert answer == v["expected"] and list(answer) == list(v["expected"])


def _dist(p: dict):
    import numpy as np

    from basal.core.decision.distribution import Distribution

    values = np.asarray(list(p.values()))
    return Distribution([], values, values)


def test_act_refusal_replaces_the_action_and_keeps_its_position():
    question = _plan(
        "basal",
        {
            "type": "act",
            "costs": {"approve": {"true": 0, "false": 10}, "human": {"true": 3, "false": 3}},
            "max_error": 0.01,
        },
    )
    answer = _encoded(choose_action({"true": 0.9, "false": 0.1}, question.spec, {"0.01": {"confidence": 0.95}}, True))
    assert list(answer)[:2] == ["type", "action"] and answer["action"] == "human" and answer["refused"] == "approve"
    assert list(answer)[-2:] == ["refused", "calibration"]


def test_expected_costs_are_summed_in_row_order_and_rounded_as_python():
    question = _plan(
        "basal", {"type": "act", "costs": {"a": {"false": 0.3, "true": 0.1}, "b": {"true": 0.2, "false": 0.2}}}
    )
    assert [z for z, _ in question.spec.rows[0][1]] == ["false", "true"]  # the row's own order, not outcome order
    answer = choose_action({"true": 0.25, "false": 0.75}, question.spec, {}, False)
    assert answer.expected_costs == {"a": round(0 + 0.75 * 0.3 + 0.25 * 0.1, 6), "b": 0.2}


def test_act_short_form_rows_and_defer():
    q = _plan("basal", {"type": "act", "criteria": ["x", "y", "z"], "costs": {"wrong": "4", "defer": 1}})
    assert q.spec.rows == (
        ("x", (("x", 0.0), ("y", 4.0), ("z", 4.0))),
        ("y", (("x", 4.0), ("y", 0.0), ("z", 4.0))),
        ("z", (("x", 4.0), ("y", 4.0), ("z", 0.0))),
        ("defer", (("x", 1.0), ("y", 1.0), ("z", 1.0))),
    )
    assert q.spec.defer_action == "defer" and q.item.type == "choice" and not q.spec.validated_readout
    full = _plan("basal", {"type": "act", "costs": {"wrong": {"true": 1, "false": 2}}})  # an action called wrong
    assert full.spec.rows == (("wrong", (("true", 1.0), ("false", 2.0))),) and full.spec.defer_action is None
    human = _plan("basal", {"type": "act", "costs": {"a": {"true": 1, "false": 2}, "human": {"true": 1, "false": 1}}})
    assert human.spec.defer_action == "human"


@pytest.mark.parametrize(
    ("question", "error"),
    [
        ({"type": "act"}, "question 'q': act needs costs"),
        ({"type": "act", "costs": {}}, "question 'q': act needs costs"),
        ({"type": "act", "costs": {"defer": 1}}, "'wrong'"),
        ({"type": "act", "costs": {"wrong": "x"}}, "could not convert string to float: 'x'"),
        (
            {"type": "act", "costs": {"approve": {"true": 0}}},
            "question 'q': costs['approve'] must give a cost for every outcome ['true', 'false']",
        ),
        (
            {"type": "act", "criteria": [f"o{i}" for i in range(11)], "costs": {"wrong": 1}},
            "question 'q': 11 options (supported: 2..10)",
        ),
        ({"type": "multi", "criteria": {}}, "question 'q': multi needs criteria"),
        (
            {"type": "multi", "criteria": ["a"], "evidence": True},
            "evidence is not available for this model (no evidence_head.pt)",
        ),
        (
            {"type": "noul", "instructions": "?", "evidence": 1},
            "evidence is not available for this model (no evidence_head.pt)",
        ),
    ],
)
def test_upstream_act_and_multi_errors(question, error):
    with pytest.raises(RequestError) as e:
        _plan("basal", question)
    assert (e.value.status, e.value.body) == (422, {"error": error})


def test_upstream_evidence_waits_for_an_act_that_may_need_a_defer_action():
    """An act with max_error and no defer action may fail after the run, and upstream builds every answer before
    it checks for an evidence head: such a request is planned (and refused after the run, see the HTTP tests)."""
    questions = {
        "e": {"type": "noul", "instructions": "?", "evidence": True},
        "a": {"type": "act", "costs": {"x": {"true": 0, "false": 1}}, "max_error": 0.01},
    }
    plan = parse_basal({"state": "s", "questions": questions}, lambda _name: "m")
    assert plan.questions[0].evidence
    questions["a"]["defer_action"] = "x"  # now nothing can fail before the evidence check: refused at once
    with pytest.raises(RequestError) as e:
        parse_basal({"state": "s", "questions": questions}, lambda _name: "m")
    assert e.value.body == {"error": "evidence is not available for this model (no evidence_head.pt)"}
    assert NEEDS_DEFER.startswith("max_error needs a defer action")


_numbers = st.none() | st.booleans() | st.integers(-3, 12) | st.floats(-2, 12) | st.sampled_from(["0.5", "x", "2"])
_costs = st.dictionaries(
    st.sampled_from(["wrong", "defer", "human", "a", "true", "false"]),
    _numbers | st.dictionaries(st.sampled_from(["true", "false", "a", "b"]), _numbers, max_size=3),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["multi", "act"]),
    st.none() | st.lists(st.sampled_from(["a", "b", "true", "false"]), max_size=4) | st.just({"true": "T"}),
    st.fixed_dictionaries(
        {},
        optional={
            "threshold": _numbers,
            "max": _numbers,
            "min": _numbers,
            "costs": _costs,
            "base": st.sampled_from(["noul", "choice", "score", "rank"]) | _numbers,
            "max_error": _numbers,
            "defer_action": st.sampled_from(["human", ""]) | _numbers,
        },
    ),
    st.floats(0.0, 1.0),
)
def test_any_multi_or_act_plans_and_answers_or_is_a_clear_error(qtype, criteria, fields, p):
    """Both dialects: a RequestError at planning or after the run, or an answer that encodes — never a crash."""
    import numpy as np

    from basal.core.decision.distribution import Distribution
    from basal.core.decision.respond import answer_multi

    question = {"type": qtype, **({} if criteria is None else {"criteria": criteria}), **fields}
    calibration = Calibration(TEMPERATURES, {"0.01": {"confidence": 0.9}, "2": {"confidence": 0.5}})
    for dialect in ("basal", "systemone"):
        try:
            q = _plan(dialect, question)
            if q.deferred_error is not None:
                raise q.deferred_error
            dists = []
            for item in q.asked:
                k = len(item.options)
                values = np.asarray([p, *([(1 - p) / (k - 1)] * (k - 1))] if k > 1 else [1.0])
                dists.append(Distribution([], values, values))
            answer = answer_multi(q, dists) if q.kind == "multi" else answer_act(q, dists[0], calibration, dialect)
            msgspec.json.encode(answer)
        except RequestError as e:
            assert e.status in (400, 422) and json.dumps(e.body)


def test_multi_label_count_is_bounded_before_any_work():
    labels = [f"l{i}" for i in range(1001)]
    with pytest.raises(RequestError) as e:
        _plan("basal", {"type": "multi", "criteria": labels})
    assert e.value.body == {"error": "question 'q': 1001 labels (basal asks at most 1000 per multi)"}
    with pytest.raises(RequestError) as e:
        _plan("systemone", {"type": "multi", "criteria": labels})
    assert e.value.status == 422 and e.value.body["detail"][0]["type"] == "unsupported_label_count"
    assert len(_plan("systemone", {"type": "multi", "criteria": labels[:1000]}).branches) == 1000
