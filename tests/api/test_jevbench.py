"""jevbench's ``examples`` suite against a live server: its five batch-independence relations hold with deviation
exactly 0.0; a negative control that moves each answer by its position in the batch fails them."""

from __future__ import annotations

import httpx
import pytest

jevbench = pytest.importorskip("jevbench")

BAT = ("batch_solo", "batch_order", "duplicate_question", "batch_content", "batch_size_sweep")


def deviations(report) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for o in report.result["outcomes"]:
        out.setdefault(o["relation"], []).append(o["deviation"])
    return out


def test_examples_suite_batch_independence_is_exact(server):
    url, _engines = server
    report = jevbench.evaluate(
        jevbench.systemone(url + "/v1/systemone", model="jev-latest"), "examples", relations=list(BAT), cache=None
    )
    assert not report.result["errors"]
    found = deviations(report)
    assert set(found) == set(BAT) and all(d == 0.0 for ds in found.values() for d in ds), found


def test_a_backend_that_depends_on_batch_position_fails_it(server):
    """Negative control: the same server's answers, each tilted by the question's position in the request."""
    url, _engines = server

    def tilted(state, questions):
        body = {"model": "jev-latest", "state": state, "questions": questions}
        answers = httpx.post(url + "/v1/systemone", json=body, timeout=60).json()["answers"]
        for position, answer in enumerate(answers.values()):
            if "probabilities" not in answer:  # a TypeSafe noul: its P(true) alone
                answer["noul"] = min(1.0, answer["noul"] + 0.2 * position)
                continue
            probs = answer["probabilities"]
            probs[next(iter(probs))] += 0.2 * position
            total = sum(probs.values())
            answer["probabilities"] = {k: v / total for k, v in probs.items()}
        return answers

    model = jevbench.from_callable(tilted, name="tilted")
    report = jevbench.evaluate(model, "examples", relations=list(BAT), cache=None)
    assert any(d > 0.0 for ds in deviations(report).values() for d in ds)
    assert any(o["violated"] for o in report.result["outcomes"])
