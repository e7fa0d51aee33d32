"""Drift series: they move with the input mix and equal an independent count over the same answers' JSON; question
names and labels stay within their bounds; background answers are not counted; the answers are untouched."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import msgspec
import pytest

from basal.core.engine.drift import OTHER, DriftFront, DriftRecorder, max_error_confidence, with_drift
from basal.core.engine.metrics import Metrics
from basal.core.request.dialects import parse_systemone
from basal.core.request.model_names import ServedModels
from tests.cascade_models import QUESTIONS, two_engines

STATES = [f"Ticket {i}: my payouts have failed {i} times and support does not answer." for i in range(8)]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    front = two_engines(tmp_path_factory.mktemp("models"))
    yield front
    front.close()


def _request(front, state: str, questions=QUESTIONS, model: str = "small"):
    return parse_systemone(
        {"model": model, "state": state, "questions": questions}, ServedModels(tuple(front.names), front.default)
    )


def _independent(body: bytes, limit: float) -> tuple[Counter, Counter, Counter]:
    """(question, label) counts, summed confidence and answers below `limit` by question, from the JSON alone."""
    labels, confidence, below = Counter(), Counter(), Counter()
    for name, a in json.loads(body)["answers"].items():
        if a["type"] == "noul":
            label, c = ("true" if a["noul"] >= 0.5 else "false"), max(a["noul"], 1 - a["noul"])
        elif a["type"] == "multi":
            label, c = "+".join(sorted(a["selected"])) or "(none)", a["set_confidence"]
        elif a["type"] == "choice":
            label, c = a["choice"], max(a["probabilities"].values())
        else:  # score: the most probable level
            label, c = max(a["probabilities"], key=a["probabilities"].__getitem__), max(a["probabilities"].values())
        labels[name, label] += 1
        confidence[name] += c
        below[name] += c < limit
    return labels, confidence, below


def _series(metrics: Metrics, model: str = "small") -> tuple[Counter, Counter, Counter]:
    labels, confidence, below = Counter(), Counter(), Counter()
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.labels.get("model") != model:
                continue
            if s.name == "basal_drift_answers_total":
                labels[s.labels["question"], s.labels["label"]] = s.value
            elif s.name == "basal_drift_confidence_total":
                confidence[s.labels["question"]] = s.value
            elif s.name == "basal_drift_below_max_error_total":
                below[s.labels["question"]] = s.value
    return labels, confidence, below


def test_max_error_confidence_is_the_smallest_targets():
    assert max_error_confidence({"0.05": {"confidence": 0.74}, "0.01": {"confidence": 0.93}}) == 0.93
    assert max_error_confidence({"0.01": {"nothing": 1}, "0.1": {"confidence": 0.5}, "x": {}}) == 0.5
    assert max_error_confidence({}) is None


def test_series_move_with_the_input_mix_and_equal_an_independent_count(engines):
    front = with_drift(engines, 64, 16)
    assert isinstance(front, DriftFront)
    metrics = engines.metrics
    limit = max_error_confidence(engines.model_info("small").calibration.thresholds)
    assert limit is not None
    before = _series(metrics)
    totals = [Counter(), Counter(), Counter()]
    shares = []
    for half in (STATES[:4], STATES[4:]):
        start = _series(metrics)
        mix = Counter()
        for state in half:
            result = asyncio.run(front.run(_request(front, state)))
            plain = asyncio.run(engines.run(_request(engines, state)))
            body = msgspec.json.encode(result.response)
            assert body == msgspec.json.encode(plain.response)  # the answer is untouched
            for total, part in zip(totals, _independent(body, limit), strict=True):
                total.update(part)
            mix.update(_independent(body, limit)[0])
        now = _series(metrics)
        moved = Counter({k: v - start[0][k] for k, v in now[0].items() if v != start[0][k]})
        assert moved == mix  # this half's answers, label by label
        shares.append({k: v / len(half) for k, v in mix.items()})
    assert shares[0] != shares[1]  # the two halves' answers differ: the series moved differently
    after = _series(metrics)
    for got, was, want in zip(after, before, totals, strict=True):
        for key in want:
            assert got[key] - was[key] == pytest.approx(want[key], abs=1e-9), key
    assert sum(totals[2].values()) > 0  # the demo's confidences are below its 0.93 threshold


def test_background_answers_are_not_counted(engines):
    front = with_drift(engines, 64, 16)
    before = _series(engines.metrics)
    asyncio.run(front.run(_request(front, STATES[0]), has_slot=True, background=True))
    assert _series(engines.metrics) == before


def test_question_names_and_labels_are_bounded():
    metrics = Metrics(process=False)
    recorder = DriftRecorder(metrics, max_questions=3, max_labels=2, thresholds_of=lambda model: {})
    from basal.core.decision.answers import BasalChoiceAnswer

    for q in range(10):
        for label in "abcde":
            recorder.record("m", f"q{q}", BasalChoiceAnswer(label, {label: 0.9, "z": 0.1}, 0.9))
    labels, confidence, below = _series(metrics, "m")
    assert {q for q, _ in labels} == {"q0", "q1", "q2", OTHER}
    assert all(len({lab for q2, lab in labels if q2 == q}) <= 3 for q, _ in labels)  # 2 by name and _other
    assert labels["q0", "a"] == 1 and labels["q0", OTHER] == 3
    assert labels[OTHER, "a"] == 7 and labels[OTHER, OTHER] == 21
    assert sum(labels.values()) == 50  # every answer counted once
    assert sum(confidence.values()) == pytest.approx(45.0) and not below  # no thresholds: nothing below


def test_the_app_serves_through_the_drift_front_and_metrics_show_it(engines):
    from litestar.testing import TestClient

    from basal.api.app import create_app
    from basal.api.settings import ApiSettings

    front = with_drift(engines, 64, 16)
    body = {"model": "large", "state": STATES[1], "questions": {"angry": QUESTIONS["angry"]}}
    with TestClient(create_app(front, ApiSettings(metrics=True))) as client:
        r = client.post("/v1/systemone", json=body)
        assert r.status_code == 200, r.text
        label = "true" if r.json()["answers"]["angry"]["noul"] >= 0.5 else "false"
        text = client.get("/metrics").text
    line = f'basal_drift_answers_total{{label="{label}",model="large",question="angry"}}'
    assert any(row.startswith(line) for row in text.splitlines()), text[-2000:]


def test_the_server_composition_records_drift_unless_switched_off():
    from basal.serve.config import parse_config
    from basal.serve.server import _server, build_engines

    config = parse_config({"metrics": True, "drift_max_questions": 8, "drift_max_labels": 4})
    engines = build_engines(config)
    try:
        front = _server(engines, config).engines
        assert isinstance(front, DriftFront) and front.inner is engines
        assert (front.recorder.max_questions, front.recorder.max_labels) == (8, 4)
    finally:
        engines.close()
    off = parse_config({"drift_max_questions": 0})
    engines = build_engines(off)
    try:
        assert _server(engines, off).engines is engines
    finally:
        engines.close()


def test_the_threshold_follows_a_calibration_reload(tmp_path):
    """A SIGHUP reload that changes the smallest target's certified confidence: the next answers are counted below
    the new threshold (as an independent count from their JSON says), not the old one; the answer cache empties."""
    from basal.api.settings import ApiSettings
    from basal.core.engine.answer_cache import AnswerCache, Stored
    from basal.core.model.synth import synth_model
    from basal.serve.config import ModelConfig
    from basal.serve.reload import reload_calibrations
    from basal.serve.server import forget_calibrations, model_directory
    from tests.servers import make_engines

    model_path = synth_model(tmp_path / "model", "demo", seed=0)
    doc = json.loads((model_path / "CALIBRATION.json").read_text())
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(doc))
    config = ModelConfig(path=str(model_path), calibration=str(mine))
    model = model_directory(config)
    engines = make_engines(model)
    engines.start()
    cache = AnswerCache(8, 1 << 20, 60.0)
    front = with_drift(engines, 64, 16)
    forget = forget_calibrations(ApiSettings(answer_cache=cache), front)
    questions = {"angry": QUESTIONS["angry"]}
    try:
        limits = []
        for confidence in (0.0, 0.99, None):  # the demo's 0.93, then no answer below, then every answer below
            limit = max_error_confidence(front.model_info(model.name).calibration.thresholds)
            start = _series(engines.metrics, model.name)[2]
            expected = Counter()
            for state in STATES:
                result = asyncio.run(front.run(_request(front, state, questions, model.name)))
                expected.update(_independent(msgspec.json.encode(result.response), limit)[2])
            assert _series(engines.metrics, model.name)[2] - start == expected
            limits.append((limit, sum(expected.values())))
            if confidence is not None:
                cache.put(b"k", Stored(b"{}", b"", b"", False, 0))
                doc["thresholds"]["0.01"]["confidence"] = confidence
                mine.write_text(json.dumps(doc))
                assert reload_calibrations(engines, {model.name: config}, forget) == {model.name: "changed"}
                assert len(cache) == 0
        assert limits == [(0.93, len(STATES)), (0.0, 0), (0.99, len(STATES))]
    finally:
        engines.close()


def test_answers_served_from_the_answer_cache_are_counted(tmp_path):
    """An answer served again from the exact-answer cache is an answer in the stream: each response, hit or miss,
    is counted as an independent count over its JSON says; the hit's bytes are the miss's."""
    from litestar.testing import TestClient

    from basal.api.app import create_app
    from basal.api.settings import ApiSettings
    from basal.core.engine.answer_cache import AnswerCache

    engines = two_engines(tmp_path)  # the app closes them at its end
    front = with_drift(engines, 64, 16)
    limit = max_error_confidence(engines.model_info("small").calibration.thresholds)
    cache = AnswerCache(64, 1 << 20, 600.0)
    before = _series(engines.metrics)
    expected = [Counter(), Counter(), Counter()]
    seen = []
    with TestClient(create_app(front, ApiSettings(metrics=True, answer_cache=cache))) as client:
        for state in (STATES[2], STATES[2], STATES[3], STATES[2], STATES[3]):
            r = client.post("/v1/systemone", json={"model": "small", "state": state, "questions": QUESTIONS})
            assert r.status_code == 200, r.text
            seen.append(r.headers["x-basal-cache"])
            answers = json.dumps({"answers": r.json()["answers"]})
            for total, part in zip(expected, _independent(answers, limit), strict=True):
                total.update(part)
    assert seen == ["miss", "hit", "miss", "hit", "hit"]
    after = _series(engines.metrics)
    for got, was, want in zip(after, before, expected, strict=True):
        assert {k: got[k] - was[k] for k in want} == pytest.approx(dict(want), abs=1e-9)
        assert not {k for k in got if got[k] != was[k]} - set(want)  # nothing else moved
    assert sum(expected[0].values()) == 5 * len(QUESTIONS)  # five responses, each answer counted


def test_a_stored_answer_keeps_its_marks_and_counts_their_bytes():
    from basal.core.engine.answer_cache import Stored

    assert Stored(b"{}", b"", b"", False, 0).marks == ()  # behind a front without drift: no marks
    assert Stored(b"{}", b"", b"", False, 0, (("q", "yes", 0.9),)).size > Stored(b"{}", b"", b"", False, 0).size
