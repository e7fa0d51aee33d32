"""`basal replay`: a configuration against itself says zero differences, exactly; a changed calibration moves
every probability as the temperatures say and flips nothing; another model's flips are the ones its own answers
show; a running server's URL answers as its model offline; `--fail-on` gates."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from basal.cli import main
from tests.servers import live_server, make_engines

STATES = [
    f"Order {i}: the parcel arrived {'damaged' if i % 2 else 'late'} and the customer wants money back."
    for i in range(5)
]
QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "team": {
        "type": "choice",
        "instructions": "Who handles it?",
        "criteria": {"billing": "Money", "shipping": "Parcels", "support": "Other"},
    },
    "severity": {"type": "score", "instructions": "How severe?", "criteria": ["low", "mid", "high"]},
}


@pytest.fixture
def capture(tmp_path):
    path = tmp_path / "capture.jsonl"
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/basal",
            "body": {"model": "prod-name", "state": s, "questions": QUESTIONS},
        }
        for i, s in enumerate(STATES)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def replay(capture, a, b, out, *extra) -> tuple[int, dict]:
    code = main(["replay", str(capture), "--a", str(a), "--b", str(b), "-o", str(out), *extra])
    return code, json.loads((out / "report.json").read_text())


def test_a_configuration_against_itself_reports_zero_differences_exactly(capture, demo_dir, tmp_path):
    code, report = replay(capture, demo_dir, demo_dir, tmp_path / "out", "--fail-on", "changed>0,flips>0")
    s = report["summary"]
    assert code == 0
    assert (s["questions"], s["identical"], s["changed"], s["flips"], s["max_abs_dp"]) == (15, 15, 0, 0, 0.0)
    assert report["worst"] == [] and s["unanswered"] == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert (
        "all 15 answers are bitwise identical" in page
        and "no differences" in (tmp_path / "out" / "summary.md").read_text()
    )


def test_a_perturbed_calibration_moves_probabilities_as_its_temperatures_say(capture, demo_dir, tmp_path):
    hotter = tmp_path / "hotter"
    shutil.copytree(demo_dir, hotter)
    calibration = json.loads((hotter / "CALIBRATION.json").read_text())
    t = calibration["temperature_per_prim"]
    calibration["temperature_per_prim"] = {k: v * 2.5 for k, v in t.items()}
    (hotter / "CALIBRATION.json").write_text(json.dumps(calibration))
    code, report = replay(capture, demo_dir, hotter, tmp_path / "out", "--fail-on", "max_abs_dp>0.5")
    s = report["summary"]
    # a temperature is a power of the distribution: p' = p^(Ta/Tb) normalised. It never reorders options, so no
    # decision flips; every probability moves by what that power predicts
    assert code == 0 and s["flips"] == 0 and s["changed"] == 15
    records = _records(capture, demo_dir, tmp_path)
    predicted = []
    for answers in records:
        for name, q in QUESTIONS.items():
            kind = q["type"]
            p = np.array(list(answers[name]["probabilities"].values()), dtype=np.float64)
            top = int(np.argmax(p))
            moved = p ** (1 / 2.5)
            moved /= moved.sum()
            predicted.append(abs(p[top] - moved[top]))
            assert kind in s["types"]
    assert s["max_abs_dp"] == pytest.approx(max(predicted), rel=1e-6)


def _records(capture, model_dir, tmp_path) -> list[dict]:
    """The answers of one configuration, computed offline without the replay (`basal run-batch`)."""
    out = tmp_path / f"records-{model_dir.name}.jsonl"
    lines = [json.loads(x) for x in capture.read_text().splitlines()]
    for line in lines:
        line["body"].pop("model")
    plain = tmp_path / f"plain-{model_dir.name}.jsonl"
    plain.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["run-batch", str(plain), "-o", str(out), "--model", str(model_dir)]) == 0
    by_id = {r["custom_id"]: r["response"]["body"]["answers"] for r in map(json.loads, out.read_text().splitlines())}
    return [by_id[f"r{i}"] for i in range(len(STATES))]


def test_another_model_flips_what_its_own_answers_show_and_fail_on_gates(capture, demo_dir, biased_model, tmp_path):
    other = biased_model.path
    code, report = replay(capture, demo_dir, other, tmp_path / "out", "--fail-on", "flips>0")
    a, b = _records(capture, demo_dir, tmp_path), _records(capture, other, tmp_path)
    expected = 0
    for left, right in zip(a, b, strict=True):
        for name in QUESTIONS:
            pl, pr = left[name]["probabilities"], right[name]["probabilities"]
            expected += max(pl, key=pl.get) != max(pr, key=pr.get)
    assert report["summary"]["flips"] == expected
    assert code == (2 if expected else 0)
    assert report["fail_on"] == ([f"flips>0 (flip_rate = {expected / 15:g})"] if expected else [])


def test_a_running_server_answers_as_its_model_offline(capture, demo_dir, demo_model, tmp_path):
    with live_server(make_engines(demo_model)) as url:
        code, report = replay(capture, demo_dir, url, tmp_path / "out")
    assert code == 0 and report["summary"]["identical"] == 15 and report["b"] == url


def test_bad_arguments_fail_before_any_run(capture, tmp_path, capsys):
    out = str(tmp_path / "o")
    assert main(["replay", str(capture), "--a", "demo", "--b", "demo", "-o", out, "--fail-on", "flops>1"]) == 2
    assert "unknown measure 'flops'; measures: flips, changed" in capsys.readouterr().err
    assert main(["replay", str(capture), "--a", str(tmp_path / "nothing"), "--b", "demo", "-o", out]) == 2
    assert "not a model directory, `demo`, a configuration file or an http(s):// URL" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["replay", str(tmp_path / "empty.jsonl"), "--a", "demo", "--b", "demo", "-o", out]) == 2
    assert "the file is empty" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_capture_is_read_from_its_file_as_it_runs(capture):
    """The capture is indexed, not held: its lines (their model dropped), unreadable lines and states as captured
    are read from the file when asked."""
    from basal.replay.run import read_capture

    with open(capture, "ab") as f:
        f.write(b"{broken\n")
    captured = read_capture(capture)
    try:
        assert len(captured.lines) == 5 and [b.number for b in captured.unreadable] == [6]
        lines = list(captured.each())
        assert sorted(line.custom_id for line in lines) == [f"r{i}" for i in range(5)]
        assert all(
            json.loads(line.body) == {"state": STATES[int(line.custom_id[1:])], "questions": QUESTIONS}
            for line in lines
        )
        assert captured.states["r3"] == STATES[3] and captured.states.get("nope", "") == ""
        assert dict(captured.states) == {f"r{i}": s for i, s in enumerate(STATES)}
    finally:
        captured.close()


def test_a_large_capture_is_not_held_in_memory(tmp_path):
    """25 MB of captured lines (6,000 of 4 KB): indexed in a few MB of Python allocations (the 1 MiB block read,
    ~300 B of index per line), and run through a chunk at a time; read whole it peaked at ~170 MB."""
    import tracemalloc

    from basal.replay.run import read_capture

    path = tmp_path / "capture.jsonl"
    with open(path, "w") as f:
        for i in range(6000):
            body = {"model": "m", "state": f"Ticket {i % 50}: " + "x" * 4000, "questions": QUESTIONS}
            f.write(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/basal", "body": body}) + "\n")
    tracemalloc.start()
    try:
        captured = read_capture(path)
        indexed = tracemalloc.get_traced_memory()[1]
        try:
            assert sum(1 for _ in captured.each()) == 6000
            assert captured.states["c51"] == "Ticket 1: " + "x" * 4000
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            captured.close()
    finally:
        tracemalloc.stop()
    assert indexed < 6e6, f"indexing peaked at {indexed / 1e6:.1f} MB"
    assert peak < 8e6, f"running through peaked at {peak / 1e6:.1f} MB"
