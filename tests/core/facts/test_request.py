"""The ``facts`` field on both dialects: accepted values, refusals, computation errors, and what questions see."""

from __future__ import annotations

import pytest

from basal.core.errors import RequestError
from basal.core.facts import inject
from basal.core.request.dialects import parse_basal, parse_systemone

SERVED = {"basal-demo": "basal-demo"}
DATES = "Dziś jest 15 kwietnia 2026 r. Towar wydano 21 marca 2026 r."
VALUE_ERROR = 'facts must be "off" or "auto"'


def basal(**fields):
    body = {"state": DATES, "questions": {"q": {"type": "noul", "instructions": "?"}}, **fields}
    return parse_basal(body, lambda m: "basal-demo")


def systemone(**fields):
    body = {"model": "basal-demo", "state": DATES, "questions": {"q": {"type": "noul", "instructions": "?"}}, **fields}
    return parse_systemone(body, SERVED.get)


def refusal(fn, **fields) -> RequestError:
    with pytest.raises(RequestError) as e:
        fn(**fields)
    return e.value


def state_of(plan) -> str:
    return plan.questions[0].item.state_text


@pytest.mark.parametrize("fn", [basal, systemone])
def test_off_and_absent_leave_the_state(fn):
    assert state_of(fn()) == DATES and state_of(fn(facts="off")) == DATES


@pytest.mark.parametrize("fn", [basal, systemone])
def test_auto_injects_once_for_every_question(fn):
    plan = fn(
        facts="auto",
        questions={
            "a": {"type": "noul", "instructions": "?"},
            "b": {"type": "choice", "criteria": {"x": None, "y": None}},
        },
    )
    assert all(q.item.state_text == inject(DATES) for q in plan.questions) and "\n- " in inject(DATES)


@pytest.mark.parametrize("value", ["yes", "AUTO", None, True, 1, [], {}])
def test_basal_refuses_anything_but_off_and_auto(value):
    e = refusal(basal, facts=value)
    assert (e.status, e.body, e.upstream) == (422, {"error": VALUE_ERROR}, f"ValueError: {VALUE_ERROR}")


def test_systemone_takes_null_as_off_and_refuses_other_values():
    assert state_of(systemone(facts=None)) == DATES
    e = refusal(systemone, facts="yes")
    assert (e.status, e.body) == (
        422,
        {"detail": [{"type": "literal_error", "loc": ["body", "facts"], "msg": VALUE_ERROR}]},
    )


def test_systemone_collects_the_facts_error_after_the_questions_container():
    with pytest.raises(RequestError) as e:
        parse_systemone({"model": "basal-demo", "state": "x", "facts": 1}, SERVED.get)
    assert [d["loc"] for d in e.value.body["detail"]] == [["body", "questions"], ["body", "facts"]]


@pytest.mark.parametrize(
    ("state", "text", "kind"),
    [
        ("Dziś jest 2 stycznia 0001 r. 3 dni temu był pożar.", "date value out of range", "OverflowError"),
        ("Data 29.02.9996 i 5 lat.", "year 10001 is out of range", "ValueError"),
        ("Kwota 100000000000000000000000000 zł, VAT 23%.", "[<class 'decimal.InvalidOperation'>]", "InvalidOperation"),
    ],
)
def test_computation_errors_in_each_dialect(state, text, kind):
    e = refusal(basal, facts="auto", state=state)
    assert (e.status, e.body, e.upstream) == (422, {"error": text}, f"{kind}: {text}")
    e = refusal(systemone, facts="auto", state=state)
    assert (e.status, e.body) == (422, {"detail": [{"type": "value_error", "loc": ["body", "state"], "msg": text}]})


@pytest.mark.parametrize("fn", [basal, systemone])
def test_a_structured_state_is_rendered_then_injected(fn):
    plan = fn(facts="auto", state={"termin": "20 marca 2027 r."})
    assert state_of(plan) == inject('{"termin": "20 marca 2027 r."}')
    assert state_of(plan).endswith("- 20 marca 2027 r. to sobota")


@pytest.mark.parametrize("fn", [basal, systemone])
def test_the_block_takes_part_in_language_detection(fn):
    english = {"q": {"type": "noul", "instructions": "Late?"}}
    polish_block = fn(facts="auto", state="Shipped 2024-04-03.", questions=english)  # "... to środa"
    plain_block = fn(facts="auto", state="Shipped 2024-02-06.", questions=english)  # "... to wtorek"
    assert polish_block.questions[0].item.lang == "pl" and plain_block.questions[0].item.lang == "en"
    assert fn(state="Shipped 2024-04-03.", questions=english).questions[0].item.lang == "en"
