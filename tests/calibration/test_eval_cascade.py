"""`basal eval --cascade` on two synthetic models: the cascade's measured accuracy, each model's alone and every
point of the threshold sweep against a computation by hand from each model's own answers (the response bodies)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from basal.calibration.labelled import read_labelled
from basal.cli import main
from tests.calibration.labelled_data import write_labelled
from tests.cascade_models import write_models

BELOW = 0.5  # escalates part of the questions of these synthetic models (checked below)


def _config(tmp_path: Path, below: float = BELOW) -> Path:
    models = tmp_path / "models"
    if not models.exists():
        write_models(models)
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"models:\n  - path: {models / 'small'}\n  - path: {models / 'large'}\n"
        f"cascades:\n  - name: duo\n    steps:\n      - model: small\n        escalate_below: {below!r}\n"
        "      - model: large\n"
    )
    return config


def _answers(labelled: Path, records: Path, model: str) -> list[tuple[float, bool]]:
    """(confidence, right) per labelled question, in file order, from the answers as the client reads them."""
    by_id = {}
    for raw in records.read_text().splitlines():
        rec = json.loads(raw)
        by_id[rec["custom_id"]] = rec["response"]["body"]["answers"]
    out = []
    keys = [line.key for line in read_labelled(labelled, "systemone", model).lines]
    for key, raw in zip(keys, labelled.read_text().splitlines(), strict=True):
        answers = by_id[key]
        for name, q in json.loads(raw)["questions"].items():
            a = answers[name]
            if a["type"] == "noul":
                conf, decided = max(a["noul"], 1 - a["noul"]), a["noul"] >= 0.5
            else:
                p = a["probabilities"]
                conf = max(p.values())
                decided = next(k for k, v in p.items() if v == conf)
                decided = int(decided) if a["type"] == "score" else decided
            out.append((conf, decided == q["gold"]))
    return out


def _accuracy(small: list[tuple[float, bool]], large: list[tuple[float, bool]], t: float) -> float:
    return sum(s[1] if s[0] >= t else g[1] for s, g in zip(small, large, strict=True)) / len(small)


def test_the_cascade_and_the_sweep_equal_each_models_own_answers(tmp_path: Path) -> None:
    config = _config(tmp_path)
    labelled = write_labelled(tmp_path / "labelled.jsonl", 30, 6)
    out = tmp_path / "r"
    assert main(["eval", str(labelled), "--config", str(config), "--cascade", "duo", "-o", str(out), "--quiet"]) == 0
    c = json.loads((out / "report.json").read_text())["cascade"]
    small = _answers(labelled, out / "records.small.jsonl", "small")
    large = _answers(labelled, out / "records.large.jsonl", "large")
    escalated = sum(s[0] < BELOW for s in small) / len(small)
    assert 0.1 < escalated < 0.9  # the rule splits the questions: the test compares a real mix
    # the cascade as served: its accuracy, and who answered, equal the by-hand mix of each model's own answers
    assert c["rows"]["duo"]["accuracy"] == pytest.approx(_accuracy(small, large, BELOW), abs=1e-12)
    assert c["answered"] == pytest.approx({"small": 1 - escalated, "large": escalated}) and c["unmatched"] == 0
    assert c["rows"]["small"]["accuracy"] == pytest.approx(sum(s[1] for s in small) / len(small))
    assert c["rows"]["large"]["accuracy"] == pytest.approx(sum(g[1] for g in large) / len(large))
    # every point of the sweep; its ends are each model alone
    for p in c["sweep"]:
        assert p["accuracy"] == pytest.approx(_accuracy(small, large, p["threshold"]), abs=1e-12), p
        assert p["escalated"] == pytest.approx(sum(s[0] < p["threshold"] for s in small) / len(small)), p
    first, last = c["sweep"][0], c["sweep"][-1]
    assert first["threshold"] == 0 and first["escalated"] == 0 and first["accuracy"] == c["rows"]["small"]["accuracy"]
    assert last["threshold"] > 1 and last["escalated"] == 1 and last["accuracy"] == c["rows"]["large"]["accuracy"]
    rows = c["rows"]
    assert first["tokens_per_decision"] == rows["small"]["tokens_per_decision"]
    assert last["tokens_per_decision"] == pytest.approx(
        rows["small"]["tokens_per_decision"] + rows["large"]["tokens_per_decision"]
    )
    # Pareto points: each more accurate than every point escalating less
    assert c["pareto"] and c["pareto"][0] == first
    for p in c["pareto"]:
        assert all(q["accuracy"] < p["accuracy"] for q in c["sweep"] if q["escalated"] < p["escalated"])
    assert (out / "cascade.png").stat().st_size > 1000
    page = (out / "report.html").read_text()
    assert "Cascade duo against each model alone" in page and "Suggested thresholds" in page
    assert "http://" not in page and "https://" not in page and page.count("data:image/png;base64,") >= 4
    assert "Questions each step answered in duo" in (out / "summary.md").read_text()
    # another threshold into the same folder: the cascade runs again (its records are its rules'), the models resume
    other = next(p for p in c["sweep"] if 0 < p["escalated"] < 1 and abs(p["escalated"] - escalated) > 0.05)
    _config(tmp_path, other["threshold"])
    assert main(["eval", str(labelled), "--config", str(config), "--cascade", "duo", "-o", str(out), "--quiet"]) == 0
    again = json.loads((out / "report.json").read_text())["cascade"]
    assert again["rows"]["duo"]["accuracy"] == pytest.approx(other["accuracy"], abs=1e-12)
    assert again["answered"]["large"] == pytest.approx(other["escalated"])
    assert again["rows"]["small"]["seconds_per_decision"] is None  # resumed from its records


def test_a_cascade_the_config_lacks_is_refused(tmp_path: Path, capsys) -> None:
    config = _config(tmp_path)
    labelled = write_labelled(tmp_path / "labelled.jsonl", 6, 2)
    args = ["eval", str(labelled), "--config", str(config), "-o", str(tmp_path / "r"), "--quiet"]
    assert main([*args, "--cascade", "trio"]) != 0
    assert "--cascade 'trio': not in" in capsys.readouterr().err
    assert main(["eval", str(labelled), "-o", str(tmp_path / "r"), "--cascade", "duo"]) != 0
    assert "--cascade needs --config" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
