"""Cascades: escalation rules at their boundaries, several levels, failures of a later step, and the answers of
two real (synthetic) models: every answer is bitwise the answering model's own, alone."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from basal.core.decision.answers import (
    BasalChoiceAnswer,
    BasalNoulAnswer,
    BasalResponse,
    BasalUsage,
    MultiAnswer,
    NoulAnswer,
)
from basal.core.engine.cascade import Cascade, CascadeError, CascadeFront, Rule, Step, decide, top_probability
from basal.core.engine.front import Result
from basal.core.errors import Overloaded
from basal.core.model.prompt import Item
from basal.core.request.plan import DecisionRequest, Question
from tests.cascade_models import QUESTIONS, STATE, two_engines


def _question(name: str, kind: str = "choice") -> Question:
    item = Item(name, "noul" if kind == "noul" else "choice", ("a", "b"), ("A", "B"), "en", "state", "question")
    return Question(kind, item)  # type: ignore[arg-type]


def _request(*questions: Question, model: str = "casc", diagnostics: bool = False) -> DecisionRequest:
    return DecisionRequest("basal", model, questions, diagnostics=diagnostics)


def _fake_run(confidences: dict[str, dict[str, float]], calls: list | None = None, fail: dict | None = None):
    """A stand-in for one model's front: each model answers each question with the given top probability."""

    async def run(sub: DecisionRequest) -> Result:
        if calls is not None:
            calls.append((sub.model, [q.name for q in sub.questions]))
        if fail and sub.model in fail:
            raise fail[sub.model]
        answers = {}
        for q in sub.questions:
            p = confidences[sub.model][q.name]
            answers[q.name] = BasalChoiceAnswer("a", {"a": p, "b": 1 - p}, p)
        return Result(
            BasalResponse(sub.model, answers, BasalUsage(10 * len(answers), 0, len(answers), 1, 1.0)), 0, 0, 1
        )

    return run


def test_a_confidence_equal_to_the_threshold_stays_and_one_just_below_goes_on():
    cascade = Cascade("casc", (Step("small", Rule("confidence", 0.75)), Step("large", None)))
    below = float.fromhex("0x1.7ffffffffffffp-1")  # the float just under 0.75
    conf = {"small": {"at": 0.75, "under": below, "over": 0.9}, "large": {"under": 0.6}}
    calls: list = []
    result = asyncio.run(decide(cascade, _request(*map(_question, conf["small"])), _fake_run(conf, calls), dict))
    assert calls == [("small", ["at", "under", "over"]), ("large", ["under"])]
    assert result.cascade.answered_by == {"at": "small", "under": "large", "over": "small"}
    assert list(result.response.answers) == ["at", "under", "over"]  # the request's order, not the steps'
    assert result.response.answers["under"].answered_by == "large"
    assert result.response.answers["under"].confidence == 0.6
    assert result.response.usage.input_tokens == 40
    assert [(s.model, s.questions, s.answered) for s in result.response.usage.steps] == [
        ("small", 3, 2),
        ("large", 1, 1),
    ]
    assert result.cascade.answered_by_header() == "small=2, large=1"


def test_three_levels_each_with_its_own_rule_per_type():
    cascade = Cascade(
        "casc",
        (
            Step("mini", Rule("confidence", None, {"choice": 0.8})),  # yes/no questions stop at mini
            Step("mid", Rule("confidence", 0.9)),
            Step("max", None),
        ),
    )
    qs = [_question("c1"), _question("c2"), _question("n1", "noul")]
    conf = {"mini": {"c1": 0.7, "c2": 0.85, "n1": 0.51}, "mid": {"c1": 0.89}, "max": {"c1": 0.55}}
    calls: list = []
    result = asyncio.run(decide(cascade, _request(*qs), _fake_run(conf, calls), dict))
    assert calls == [("mini", ["c1", "c2", "n1"]), ("mid", ["c1"]), ("max", ["c1"])]
    assert result.cascade.answered_by == {"c1": "max", "c2": "mini", "n1": "mini"}


def test_a_certified_error_target_escalates_below_its_threshold():
    cascade = Cascade("casc", (Step("small", Rule("error", 0.05)), Step("large", None)))
    thresholds = {"small": {"0.05": {"confidence": 0.74}}}
    conf = {"small": {"a": 0.74, "b": 0.7399}, "large": {"b": 0.6}}
    result = asyncio.run(decide(cascade, _request(_question("a"), _question("b")), _fake_run(conf), thresholds.get))
    assert result.cascade.answered_by == {"a": "small", "b": "large"}


def test_a_later_step_that_fails_keeps_the_earlier_answers_and_says_why():
    cascade = Cascade("casc", (Step("small", Rule("confidence", 0.8)), Step("large", None)))
    conf = {"small": {"a": 0.7, "b": 0.9}}
    run = _fake_run(conf, fail={"large": Overloaded()})
    result = asyncio.run(decide(cascade, _request(_question("a"), _question("b")), run, dict))
    assert result.cascade.answered_by == {"a": "small", "b": "small"}
    assert result.response.answers["a"].confidence == 0.7
    assert result.cascade.answered_by_header() == "small=2"
    assert result.cascade.failure_header().startswith("large: 529")
    assert [s.model for s in result.response.usage.steps] == ["small"]


def test_the_first_steps_failure_is_the_requests():
    cascade = Cascade("casc", (Step("small", Rule("confidence", 0.8)), Step("large", None)))
    with pytest.raises(Overloaded):
        asyncio.run(decide(cascade, _request(_question("a")), _fake_run({}, fail={"small": Overloaded()}), dict))


def test_the_confidence_a_rule_reads_is_the_top_probability_in_both_dialects():
    assert top_probability(NoulAnswer(0.3)) == 0.7  # TypeSafe's yes/no carries P(true) only
    assert top_probability(BasalNoulAnswer(0.3, {"true": 0.3, "false": 0.7}, 0.7)) == 0.7
    assert top_probability(MultiAnswer(["x"], {"x": 0.9, "y": 0.2}, 0.5, 0.72)) == 0.72


def test_malformed_cascades_are_refused():
    with pytest.raises(CascadeError, match="at least two"):
        Cascade("c", (Step("a", None),))
    with pytest.raises(CascadeError, match="every step but the last"):
        Cascade("c", (Step("a", None), Step("b", None)))
    with pytest.raises(CascadeError, match="appears twice"):
        Cascade("c", (Step("a", Rule("confidence", 0.5)), Step("a", None)))


# -- two real models --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    front = two_engines(tmp_path_factory.mktemp("models"))
    yield front
    front.close()


def _ask(front, dialect: str, model: str, diagnostics: bool = False) -> tuple[dict, Result]:
    from basal.core.request.dialects import parse_basal, parse_systemone
    from basal.core.request.model_names import ServedModels

    resolve = ServedModels(tuple(front.names), front.default)
    raw = {"model": model, "state": STATE, "questions": QUESTIONS}
    parse = parse_systemone if dialect == "systemone" else parse_basal
    request = parse(raw, resolve)
    if diagnostics:
        from dataclasses import replace

        request = replace(request, diagnostics=True)
    result = asyncio.run(front.run(request))
    return json.loads(msgspec.json.encode(result.response)), result


@pytest.mark.parametrize("dialect", ["systemone", "basal"])
def test_every_answer_is_bitwise_the_answering_models_own(engines, dialect):
    """Yes/no questions escalate (below 1.0 always holds), the rest stay: each answer's bytes are those of its
    model asked the whole request alone; the same request escalates the same questions every time."""
    cascade = Cascade(
        "casc", (Step("small", Rule("confidence", None, {"noul": 1.0, "multi": 1.0})), Step("large", None))
    )
    front = CascadeFront(engines, [cascade])
    alone = {m: _ask(engines, dialect, m)[0]["answers"] for m in ("small", "large")}
    assert alone["small"] != alone["large"]  # the two models differ, so the test can tell who answered
    first, result = _ask(front, dialect, "casc")
    again, _ = _ask(front, dialect, "casc")
    assert again["answers"] == first["answers"]
    expected_by = {"urgent": "large", "team": "small", "angry": "large", "severity": "small", "topics": "large"}
    assert result.cascade.answered_by == expected_by
    assert list(first["answers"]) == list(QUESTIONS)
    for name, answer in first["answers"].items():
        if dialect == "basal":
            assert answer.pop("answered_by") == expected_by[name]
        assert msgspec.json.encode(answer) == msgspec.json.encode(alone[expected_by[name]][name]), name
    assert first["model"] == "casc"


def test_diagnostics_show_each_steps_confidence_and_rule(engines):
    cascade = Cascade("casc", (Step("small", Rule("confidence", None, {"noul": 1.0})), Step("large", None)))
    front = CascadeFront(engines, [cascade])
    _, result = _ask(front, "basal", "casc", diagnostics=True)
    steps = result.diagnostics.cascade
    assert [s.model for s in steps["urgent"]] == ["small", "large"]
    assert steps["urgent"][0].escalated and "below confidence 1.0" in steps["urgent"][0].rule
    assert [s.model for s in steps["team"]] == ["small"] and not steps["team"][0].escalated
    assert "no rule for type choice" in steps["team"][0].rule
    _, large_alone = _ask(engines, "basal", "large", diagnostics=True)
    assert result.diagnostics.questions["urgent"] == large_alone.diagnostics.questions["urgent"]


def test_the_front_lists_cascades_and_refuses_bad_ones(engines):
    cascade = Cascade("casc", (Step("small", Rule("confidence", 0.9)), Step("large", None)))
    front = CascadeFront(engines, [cascade])
    assert front.names == ["small", "large", "casc"]
    info = front.model_info("casc")
    assert info.cascade == ({"model": "small", "escalate_below": 0.9}, {"model": "large"})
    small = engines.model_info("small")
    assert (info.prompt_char_limit, info.context) == (small.prompt_char_limit, small.context)
    with pytest.raises(CascadeError, match="no served model 'huge'"):
        CascadeFront(engines, [Cascade("c", (Step("small", Rule("confidence", 0.9)), Step("huge", None)))])
    with pytest.raises(CascadeError, match="also a served model"):
        CascadeFront(engines, [Cascade("small", (Step("small", Rule("confidence", 0.9)), Step("large", None)))])


def test_a_calibration_reload_makes_every_wrapper_read_its_thresholds_again():
    """A cascade keeps each model's thresholds between requests; a reload that changed a calibration (what
    `serve`'s SIGHUP and the Ray front's reload call) reaches it through the drift front around it, so an
    `escalate_above_error` rule reads the new certified confidence, not the one the server started with."""
    from types import SimpleNamespace

    from basal.api.settings import ApiSettings
    from basal.core.engine.drift import with_drift
    from basal.core.engine.metrics import Metrics
    from basal.serve.server import forget_calibrations

    served = {"0.01": {"confidence": 0.9}}
    inner = SimpleNamespace(
        names=["small", "large"],
        metrics=Metrics(),
        model_info=lambda name: SimpleNamespace(calibration=SimpleNamespace(thresholds=dict(served))),
    )
    front = CascadeFront(inner, [Cascade("casc", (Step("small", Rule("error", 0.01)), Step("large", None)))])
    outer = with_drift(front, 64, 16)
    assert front.thresholds("small")["0.01"]["confidence"] == 0.9
    served["0.01"] = {"confidence": 0.5}  # the file changed and the engines reloaded it
    assert front.thresholds("small")["0.01"]["confidence"] == 0.9  # read once, kept between requests
    forget_calibrations(ApiSettings(), outer)()
    assert front.thresholds("small")["0.01"]["confidence"] == 0.5
