"""A labelled file through the batch path in process: every readout gets the server's own order average (multi
labels and act readouts included), equal requests run once, an interrupted run resumes, and a line the server
refuses at run time is an error naming it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from basal.api.decide import body_decider
from basal.api.settings import ApiSettings
from basal.calibration.collect import run_labelled
from basal.calibration.labelled import LabelledError, read_labelled
from basal.core.decision.distribution import calibrate
from basal.core.request.dialects import parse_systemone
from tests.servers import make_engines

STATE = "Customer 4 writes: the refund for order 17 never arrived."
LINE = {
    "model": "jev-latest",
    "state": STATE,
    "questions": {
        "tags": {"type": "multi", "instructions": "Which?", "criteria": {"refund": "r", "delay": "d", "spam": "z"},
                 "gold": ["refund", "delay"]},
        "gate": {"type": "act", "instructions": "Approve?", "costs": {"wrong": 5, "defer": 1}, "gold": False},
        "team": {"type": "choice", "instructions": "Team?", "criteria": {"a": "Payments", "b": "Bugs"}, "gold": "a"},
        "one": {"type": "choice", "instructions": "Only one", "criteria": {"x": "the only option"}, "gold": "x"},
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def engines(demo_model):
    e = make_engines(demo_model)
    e.start()
    yield e
    e.close(drain=False)


def _file(tmp_path: Path, lines: list[dict]) -> Path:
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_every_readout_gets_the_servers_order_average(engines, demo_model, tmp_path) -> None:
    lines = [dict(LINE, id=f"r{i}") for i in range(3)]  # three equal requests: run once
    labelled = read_labelled(_file(tmp_path, lines), "systemone", demo_model.name)
    records = tmp_path / "records.jsonl"
    decide = body_decider(engines, ApiSettings(), dialect="systemone", diagnostics=True)
    got = asyncio.run(run_labelled(labelled, decide, records))
    assert len(records.read_text().splitlines()) == 1
    assert [(o.readout.question, o.readout.label, o.readout.type, o.readout.gold) for o in got[:5]] == [
        ("tags", "refund", "noul", 0),
        ("tags", "delay", "noul", 0),
        ("tags", "spam", "noul", 1),
        ("gate", None, "noul", 1),
        ("team", None, "choice", 0),
    ]
    assert len(got) == 15  # the single-option question is answered with p = 1: nothing to learn
    # independently: the same request answered alone by the pipeline (no batching, no engine); its calibrated
    # probabilities are the collected order average under the served temperature, to the bit
    plan = parse_systemone(json.loads(labelled.lines[0].body), lambda _m: demo_model.name)
    answers = engines.engines[demo_model.name].pipeline.decide(plan).answers
    t = demo_model.calibration.temperature("choice")
    team = next(o for o in got if o.readout.question == "team")
    assert list(calibrate(team.p_avg, t)) == list(answers["team"].probabilities.values())
    noul = demo_model.calibration.temperature("noul")
    assert [float(calibrate(o.p_avg, noul)[0]) for o in got[:3]] == [
        answers["tags"].probabilities[k] for k in ("refund", "delay", "spam")
    ]


def test_an_interrupted_run_resumes(engines, demo_model, tmp_path) -> None:
    lines = [dict(LINE, id=f"r{i}", state=f"{STATE} ({i})") for i in range(4)]
    labelled = read_labelled(_file(tmp_path, lines), "systemone", demo_model.name)
    records = tmp_path / "records.jsonl"
    decide = body_decider(engines, ApiSettings(), dialect="systemone", diagnostics=True)
    first = asyncio.run(run_labelled(labelled, decide, records))
    kept = records.read_text().splitlines()
    records.write_text(kept[0] + "\n" + kept[1][:40])  # three lines lost, one torn by the interruption
    ran: list[int] = []
    again = asyncio.run(run_labelled(labelled, decide, records, before=lambda todo, done: ran.append(todo)))
    assert ran == [3] and len(records.read_text().splitlines()) == 4
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.p_avg, b.p_avg)  # the same bits from a resumed run


def test_a_line_the_server_refuses_names_it(engines, demo_model, tmp_path) -> None:
    from basal.core.request.limits import Limits

    lines = [dict(LINE, id="r0"), dict(LINE, id="r1", state="x" * 5000)]
    labelled = read_labelled(_file(tmp_path, lines), "systemone", demo_model.name)
    limits = Limits(max_request_chars=20_000)  # the server's limit, tighter than the file was checked with
    decide = body_decider(engines, ApiSettings(limits=limits), dialect="systemone", diagnostics=True)
    with pytest.raises(LabelledError, match=r"line 2: the server answered HTTP 4"):
        asyncio.run(run_labelled(labelled, decide, tmp_path / "records.jsonl"))


def test_without_the_letter_mass_the_lines_run_the_online_path_to_the_bit(engines, demo_model, tmp_path) -> None:
    """`basal calibrate` reads only the orders' average: its lines skip the whole-head product of the letter mass
    (none is computed, the diagnostics say null) and keep every bit of the answers and averages."""
    lines = [dict(LINE, id=f"r{i}", state=f"{STATE} ({i})") for i in range(3)]
    labelled = read_labelled(_file(tmp_path, lines), "systemone", demo_model.name)
    backend = engines.engines[demo_model.name].pipeline.backend
    heads: list[int] = []
    whole_head = backend.vocab_logsumexp

    def counted(states):
        heads.append(len(states))
        return whole_head(states)

    runs = {}
    for letter_mass in (True, False):
        decide = body_decider(engines, ApiSettings(), dialect="systemone", diagnostics=True, letter_mass=letter_mass)
        records = tmp_path / f"records.{letter_mass}.jsonl"
        heads.clear()
        backend.vocab_logsumexp = counted
        try:
            runs[letter_mass] = (asyncio.run(run_labelled(labelled, decide, records)), records, len(heads))
        finally:
            del backend.vocab_logsumexp
    (with_mass, with_records, with_heads), (without, records, without_heads) = runs[True], runs[False]
    assert with_heads > 0 and without_heads == 0
    masses = [
        o["letter_mass"]
        for raw in records.read_text().splitlines()
        for q in json.loads(raw)["response"]["body"]["diagnostics"]["questions"].values()
        for r in q["readouts"]
        for o in r.get("orders", [])
    ]
    assert masses and all(m is None for m in masses)
    for a, b in zip(with_mass, without, strict=True):
        np.testing.assert_array_equal(a.p_avg, b.p_avg)

    def answers(path: Path) -> dict[str, dict]:
        out = {}
        for raw in path.read_text().splitlines():
            body = json.loads(raw)["response"]["body"]
            body.pop("diagnostics"), body.pop("latency_ms", None)
            out[json.loads(raw)["custom_id"]] = body
        return out

    assert answers(records) == answers(with_records)
    for line in labelled.lines:  # and each answer is the one the request gets alone, without diagnostics
        plan = parse_systemone(json.loads(line.body), lambda _m: demo_model.name)
        alone = engines.engines[demo_model.name].pipeline.decide(plan).answers
        got = answers(records)[line.key]["answers"]
        for name, answer in alone.items():
            assert got[name]["probabilities"] == answer.probabilities
