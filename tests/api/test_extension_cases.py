"""The sixteen basal-1.5 extension requests of the upstream reference set, sent to the demo model as a newcomer
would send them to `make serve`: every one is answered, with the documented answer type, `evidence` exactly where
it was asked for, and usage counting every question (multi labels as branches)."""

from __future__ import annotations

import pytest

from tests.api.test_http import post
from tests.conftest import golden_records

CASES = {c["id"]: c["request"] for c in golden_records("systemone_cases_1.5.jsonl")}
TRUTHY_FALSE = (None, False, 0, 0.0, "", [], {})


def test_the_reference_set_holds_the_sixteen_extension_cases():
    assert len(CASES) == 16 and all(case_id.startswith("m15-") for case_id in CASES)


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_each_extension_request_is_answered_on_the_demo_model(client, demo_model, case_id):
    request = {**CASES[case_id], "model": demo_model.name}
    r = post(client, request, "/v1/basal")
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["model", "answers", "usage"]
    questions = request["questions"]
    assert list(body["answers"]) == list(questions)
    branches = 0
    for name, question in questions.items():
        answer = body["answers"][name]
        assert answer["type"] == question.get("type", "choice")
        asked = question.get("evidence") not in TRUTHY_FALSE
        assert ("evidence" in answer) == asked
        if asked:
            assert list(answer)[-1] == "evidence" and len(answer["evidence"]) <= 3
        labels = question.get("criteria") if question.get("type") == "multi" else None
        branches += len(labels) if labels is not None else 1
    assert body["usage"]["questions"] == len(questions)
    assert body["usage"]["branches"] == branches
