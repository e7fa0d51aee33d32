"""check-reference rebuilds the injected state of ``facts: "auto"`` records instead of skipping them."""

from __future__ import annotations

from basal.core.facts import inject
from basal.export.reference import ReferenceChecker

STATE = "Doręczono 20 marca 2027 r., termin 7 dni."


def record(state_text: str, **request) -> dict:
    question = {"type": "noul", "instructions": "W terminie?", "evidence": True}
    return {
        "request": {"state": STATE, "facts": "auto", "questions": {"q": question}, **request},
        "items": [{"name": "q", "state_text": state_text}],
    }


def test_facts_state_texts_are_checked():
    checker = ReferenceChecker()
    checker.check_facts_state(record(inject(STATE)), "r")
    assert checker.report.ok and checker.report.passed["facts state text"] == 1


def test_a_wrong_state_text_is_a_mismatch():
    checker = ReferenceChecker()
    checker.check_facts_state(record(inject(STATE).replace("sobota", "niedziela")), "r")
    assert checker.report.failed["facts state text"] == 1 and "niedziela" not in inject(STATE)


def test_records_without_facts_auto_are_left_to_the_other_checks():
    checker = ReferenceChecker()
    checker.check_facts_state(record(STATE, facts="off"), "r")
    assert not checker.report.passed and not checker.report.failed
