"""The playground's labelled-file page in headless Chromium: its headline numbers equal basal's numpy metrics on
the same answers, a rephrased question is compared over the whole file, and nothing leaves the server."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from basal.calibration import metrics
from tests.browser import Browser
from tests.calibration.labelled_data import write_labelled
from tests.servers import live_server, make_engines


@pytest.fixture(scope="module")
def server(demo_model):
    engines = make_engines(demo_model)
    with live_server(engines) as url:
        yield url


def _answers(url: str, lines: list[dict], rewrite: tuple[str, str] | None = None) -> list[tuple]:
    """(type, question, probabilities, gold index) of every scored question, from the server directly."""
    rows = []
    for line in lines:
        body = json.loads(json.dumps(line))
        gold = {name: q.pop("gold") for name, q in body["questions"].items()}
        body.pop("id"), body.pop("group")
        if rewrite:
            body["questions"][rewrite[0]]["instructions"] = rewrite[1]
        answers = httpx.post(url + "/v1/systemone", json=body, timeout=60).json()["answers"]
        for name, q in body["questions"].items():
            a = answers[name]
            p = {"true": a["noul"], "false": 1 - a["noul"]} if q["type"] == "noul" else a["probabilities"]
            g = ("true" if gold[name] else "false") if isinstance(gold[name], bool) else str(gold[name])
            rows.append((q["type"], name, np.array(list(p.values())), list(p).index(g)))
    return rows


def test_the_page_scores_a_labelled_file(server, tmp_path) -> None:
    path = write_labelled(tmp_path / "labelled.jsonl", 12, 4)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    rows = _answers(server, lines)
    browser = Browser(tmp_path / "chromium")
    try:
        browser.goto(f"{server}/playground/labelled.html")
        browser.fill("#text", path.read_text())
        browser.fill("#rephrase-name", "q1")
        browser.fill("#rephrase-text", "Which department should answer this message?")
        browser.click("#score")
        report = browser.wait_for("window.basalLabelled", timeout=120)
        probs, gold = [r[2] for r in rows], np.array([r[3] for r in rows])
        want = metrics.summary(probs, gold)
        for key in ("count", "accuracy", "log_loss", "brier", "ece"):
            assert report["overall"][key] == pytest.approx(want[key], rel=1e-9), key
        for t in ("choice", "noul", "score"):
            idx = [i for i, r in enumerate(rows) if r[0] == t]
            assert report["by_type"][t]["ece"] == pytest.approx(
                metrics.top_label_ece([probs[i] for i in idx], gold[idx])
            )
        other = _answers(server, lines, ("q1", "Which department should answer this message?"))
        flips = sum(
            int(np.argmax(a[2])) != int(np.argmax(b[2])) for a, b in zip(rows, other, strict=True) if a[1] == "q1"
        )
        assert report["rephrased"]["flips"] == flips
        assert "accuracy" in browser.evaluate("document.getElementById('headline').textContent")
        assert browser.evaluate("document.querySelectorAll('svg').length") == 2
        assert all(u.startswith(server) or u.startswith(("data:", "about:")) for u in browser.requests)
    finally:
        browser.close()
