"""`basal eval`: its numbers against an independent computation, the report's files (self-contained HTML that renders
in headless Chromium without a network request), `--fail-on`, and the command end to end with a comparison."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from basal.calibration.collect import Observed
from basal.calibration.evaluate import calibrated, compare, evaluate
from basal.calibration.labelled import LabelledLine, Readout
from basal.calibration.report import fail_conditions, failed, write_report
from basal.cli import main
from basal.core.model.model_dir import Calibration
from tests.browser import Browser
from tests.calibration.labelled_data import write_labelled

KEYS = {"choice": ("billing", "technical", "sales"), "noul": ("true", "false"), "score": ("0", "1", "2", "3")}


def _observed(n: int = 400, seed: int = 0) -> list[Observed]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = ("choice", "noul", "score")[i % 3]
        keys = KEYS[t]
        p = rng.dirichlet(np.ones(len(keys)) * 0.7)
        gold = int(rng.choice(len(keys), p=p))
        line = LabelledLine(i + 1, f"r{i}", f"g{i % 37}", b"{}", ())
        out.append(Observed(line, Readout(i + 1, "team" if t == "choice" else f"q-{t}", None, t, keys, gold), p, 1.0))
    return out


CAL = Calibration({"choice": 1.3, "noul": 0.8, "score": 2.0})


def _independent(observed: list[Observed], cal: Calibration) -> dict:
    """The metrics by hand: p^(1/T) normalised, plain loops, bins by position in the sorted order."""
    rows = []
    for o in observed:
        p = np.maximum(o.p_avg, 1e-12) ** (1 / cal.temperatures[o.readout.type])
        p = p / p.sum()
        decided = max(range(len(p)), key=lambda k: (p[k], -k))
        rows.append((p, o.readout.gold, decided))
    n = len(rows)
    acc = sum(d == g for _, g, d in rows) / n
    ll = sum(-math.log(p[g]) for p, g, _ in rows) / n
    brier = sum(sum((p[k] - (k == g)) ** 2 for k in range(len(p))) for p, g, _ in rows) / n
    ranked = sorted(rows, key=lambda r: max(r[0]))
    ece = 0.0
    for b in range(10):  # n is a multiple of 10: every bin holds n / 10 answers
        part = ranked[b * n // 10 : (b + 1) * n // 10]
        conf = sum(max(p) for p, _, _ in part) / len(part)
        hit = sum(d == g for _, g, d in part) / len(part)
        ece += len(part) / n * abs(hit - conf)
    return {"accuracy": acc, "log_loss": ll, "brier": brier, "ece": ece, "rows": rows}


def test_the_numbers_equal_an_independent_computation() -> None:
    observed = _observed()
    report = evaluate(observed, calibrated(observed, CAL))
    want = _independent(observed, CAL)
    for key in ("accuracy", "log_loss", "brier", "ece"):
        assert report["overall"][key] == pytest.approx(want[key], rel=1e-12, abs=1e-15), key
    choice = [(r, o) for r, o in zip(want["rows"], observed, strict=True) if o.readout.type == "choice"]
    matrix = np.zeros((3, 3), dtype=int)
    for (_, g, d), _o in choice:
        matrix[g, d] += 1
    assert report["confusion"]["team"]["matrix"] == matrix.tolist()
    assert report["by_type"]["choice"]["accuracy"] == pytest.approx(np.trace(matrix) / matrix.sum())
    billing = report["by_label"]["choice:billing"]
    assert billing["support"] == matrix[0].sum() and billing["recall"] == pytest.approx(matrix[0, 0] / matrix[0].sum())
    curve = report["coverage"]["all"]
    assert curve[-1]["coverage"] == 1.0 and curve[-1]["accuracy"] == pytest.approx(want["accuracy"])
    top = sorted(want["rows"], key=lambda r: -max(r[0]))[0]
    assert curve[0]["accuracy"] == float(top[1] == top[2])


def test_a_comparison_pairs_answers_and_lists_flips() -> None:
    """Side b: the same labelled questions answered differently (another model, or rewritten questions), in
    another order; answers are paired by line id and question."""
    observed = _observed()
    rng = np.random.default_rng(9)
    b_observed = [
        Observed(o.line, o.readout, rng.dirichlet(np.ones(len(o.p_avg)) * 0.7), 1.0) for o in reversed(observed)
    ]
    a, b = calibrated(observed, CAL), calibrated(b_observed, CAL)
    result = compare(observed, a, b_observed, b, reps=200)
    want_a = _independent(observed, CAL)
    want_b = _independent(list(reversed(b_observed)), CAL)
    assert result["paired"] == 400
    for key in ("accuracy", "log_loss", "brier"):
        m = result["metrics"][key]
        assert m["delta"] == pytest.approx(want_b[key] - want_a[key], rel=1e-9, abs=1e-12)
        assert m["low"] <= m["delta"] <= m["high"]
    flips = {(f["id"], f["question"]) for f in result["flips"]}
    expected = {
        (o.line.id, o.readout.question)
        for o, ra, rb in zip(observed, want_a["rows"], want_b["rows"], strict=True)
        if ra[2] != rb[2]
    }
    assert flips == expected and len(flips) > 50
    # a temperature alone never moves a decision: no flips
    assert compare(observed, a, observed, calibrated(observed, Calibration({"choice": 0.5})), reps=10)["flips"] == []


def test_fail_on() -> None:
    conditions = fail_conditions("ece>0.05, accuracy<0.9")
    assert failed(conditions, {"ece": 0.1, "accuracy": 0.95}) == ["ece = 0.1000 > 0.05"]
    assert failed(conditions, {"ece": 0.01, "accuracy": 0.95}) == []
    with pytest.raises(ValueError, match="'recall>1' is not METRIC OP NUMBER"):
        fail_conditions("recall>1")


def test_the_report_renders_in_chromium_without_the_network(tmp_path: Path) -> None:
    observed = _observed()
    report = evaluate(observed, calibrated(observed, CAL))
    report |= {
        "model": {"name": "m"},
        "calibration": {"kind": "custom", "file": "c.json"},
        "data": {"file": "labelled.jsonl"},
    }
    files = {p.name for p in write_report(tmp_path / "report", report)}
    assert {"report.json", "summary.md", "report.html", "reliability.png", "coverage.png", "confusion-1.png"} <= files
    page = (tmp_path / "report" / "report.html").read_text()
    assert "http://" not in page and "https://" not in page
    assert json.loads((tmp_path / "report" / "report.json").read_text())["overall"]["count"] == 400
    browser = Browser(tmp_path / "chromium")
    try:
        browser.goto((tmp_path / "report" / "report.html").as_uri())
        browser.wait_for("document.images.length > 0 && [...document.images].every(i => i.complete)")
        assert browser.evaluate("[...document.images].every(i => i.naturalWidth > 100)")
        shown = browser.evaluate("JSON.parse(document.getElementById('report').textContent).overall.accuracy")
        assert shown == pytest.approx(report["overall"]["accuracy"])
        assert "accuracy" in browser.evaluate("document.getElementById('headline').textContent")
        requests = browser.requests
        assert any(u.startswith("file:") for u in requests)  # the page itself was seen: the list is live
        assert all(u.startswith(("file:", "data:", "about:")) for u in requests), requests
    finally:
        browser.close()


def test_the_command_end_to_end(tmp_path: Path, capsys) -> None:
    labelled = write_labelled(tmp_path / "labelled.jsonl", 30, 6)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"temperature_per_prim": {"choice": 0.5, "noul": 1.0, "score": 3.0}}))
    args = ["eval", str(labelled), "-o", str(tmp_path / "r"), "--against", str(other), "--quiet", "--bootstrap", "100"]
    assert main([*args, "--fail-on", "ece>=0"]) == 2
    assert "fails: ece" in capsys.readouterr().err
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["overall"]["count"] == 150 and report["comparison"]["paired"] == 150
    assert report["calibration"]["kind"] == "shipped"
