"""Decision math against the worked numbers of docs/contract.md §2.4 and TypeSafe's confidence formulas."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basal.core.decision.distribution import (
    calibrate,
    certain,
    choice_confidence,
    distribution,
    score_confidence,
    unpermute,
)
from basal.core.decision.respond import answer_basal, answer_systemone
from basal.core.model.prompt import option_orders
from basal.core.request.dialects import parse_basal, parse_systemone
from basal.core.request.plan import Question

T_MAX = {"choice": 1.4983070768766815, "noul": 1.5422108254079405, "score": 2.058604473286984}


def test_yn06_noul():
    d = distribution(
        [[23.98244857788086, 37.7738037109375], [35.58481979370117, 21.96352195739746]], option_orders(2), T_MAX["noul"]
    )
    np.testing.assert_allclose(d.p_avg, [1.1194007906724763e-06, 0.9999988805992094], rtol=0, atol=1e-12)
    np.testing.assert_allclose(d.p_cal, [0.00013841551467522572, 0.9998615844853248], rtol=0, atol=1e-12)


def test_sc05_score():
    d = distribution(
        [
            [32.435367584228516, 24.965274810791016, 21.999998092651367],
            [23.80449676513672, 25.934850692749023, 33.94016647338867],
        ],
        option_orders(3),
        T_MAX["score"],
    )
    np.testing.assert_allclose(
        d.p_avg, [0.9995139618334061, 0.00045154685958985735, 3.449130700405928e-05], rtol=0, atol=1e-12
    )
    np.testing.assert_allclose(
        d.p_cal, [0.9703866469987628, 0.023015257884312357, 0.006598095116924841], rtol=0, atol=1e-12
    )
    q = parse_systemone(
        {"model": "m", "state": "s", "questions": {"r": {"type": "score", "criteria": ["low", "medium", "high"]}}},
        lambda m: m,
    ).questions[0]
    a = answer_systemone(q, d)
    assert a.score == pytest.approx(0.036211, abs=1e-6)
    assert a.confidence == pytest.approx(0.94568, abs=1e-5)


def test_missing_instructions_example():
    d = distribution(
        [[31.952360153198242, 28.091594696044922], [23.353870391845703, 27.98292350769043]],
        option_orders(2),
        T_MAX["noul"],
    )
    np.testing.assert_allclose(d.p_avg, [0.9848562894304964, 0.015143710569503671], rtol=0, atol=1e-12)
    np.testing.assert_allclose(d.p_cal, [0.9374439779496285, 0.06255602205037145], rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("p_avg", "t", "p_cal"),
    [
        ([0.0007117931232021924, 0.9992882068767979], 1.3939382634489992, [0.005492047087780672, 0.9945079529122193]),
        ([7.372613257360534e-05, 0.9999262738674264], 1.7817974362806785, [0.004772230498627664, 0.9952277695013723]),
        ([0.9467934616279468, 0.05320653837205318], 1.1387886347566916, [0.9260840864182899, 0.0739159135817102]),
        (
            [0.7148310918953344, 0.1545238699400571, 0.13064503816460846],
            1.5422108254079405,
            [0.5873397996060319, 0.2175482026849341, 0.19511199770903398],
        ),
        (
            [0.9972516404516327, 0.0021060798103167927, 0.0006422797380505202],
            1.7562521603732995,
            [0.9567447876497028, 0.028673350467754467, 0.014581861882542726],
        ),
    ],
)
def test_calibration_other_models(p_avg, t, p_cal):
    np.testing.assert_allclose(calibrate(np.array(p_avg), t), p_cal, rtol=0, atol=1e-12)


def test_structured_state_answer_upstream():
    """§2.4 so-structured-state: the upstream answer (float32 upstream, so 1e-6) and TypeSafe's choice confidence."""
    req = {
        "state": {"x": "ą"},
        "questions": {
            "kind": {
                "type": "choice",
                "criteria": {"damage": "Uszkodzenie w transporcie", "late": "Opóźnienie", "other": None},
            }
        },
    }
    (q,) = parse_basal(req, lambda m: "m").questions
    d = distribution(
        [
            [34.1636962890625, 22.203643798828125, 26.62972640991211],
            [26.133867263793945, 23.15297508239746, 35.21171569824219],
        ],
        option_orders(3),
        T_MAX["choice"],
    )
    a = answer_basal(q, d)
    assert a.choice == "damage"
    assert a.confidence == pytest.approx(0.9950022101402283, abs=1e-6)
    assert list(a.probabilities) == ["damage", "late", "other"]
    typesafe = parse_systemone({"model": "m", **req}, lambda m: m).questions[0]
    assert answer_systemone(typesafe, d).confidence == pytest.approx(0.99250, abs=1e-5)


# docs/contract.md §2.3: Jev's published confidences, from displayed (rounded) probabilities, so ±0.011.
@pytest.mark.parametrize(
    ("kind", "p", "confidence"),
    [
        ("choice", [0.88, 0.12, 0.0], 0.81),
        ("choice", [0.04, 0.35, 0.61], 0.42),
        ("choice", [0, 0.26, 0, 0, 0.74], 0.67),
        ("choice", [0.34, 0.4, 0.02, 0.24], 0.2),
        ("choice", [0.98, 0.02], 0.96),
        ("score", [0.0, 0.95, 0.05], 0.92),
        ("score", [0.0, 0.57, 0.43], 0.35),
        ("score", [0.0, 0.89, 0.11], 0.84),
        ("score", [0.0, 0.76, 0.24], 0.64),
        ("score", [0.45, 0.55, 0.0], 0.33),
        ("score", [0, 0, 0, 0, 1.0], 0.99),
    ],
)
def test_typesafe_confidence_formulas(kind, p, confidence):
    f = choice_confidence if kind == "choice" else score_confidence
    assert f(np.array(p, dtype=float)) == pytest.approx(confidence, abs=0.011)


def test_single_option_is_certain_without_the_model():
    plan = parse_systemone(
        {
            "model": "m",
            "state": "s",
            "questions": {
                "c": {"type": "choice", "criteria": {"only": "The only one"}},
                "s": {"type": "score", "criteria": [{"level": "critical"}]},
            },
        },
        lambda m: m,
    )
    c, s = plan.questions
    assert not c.needs_model and not s.needs_model
    ac, as_ = answer_systemone(c, certain()), answer_systemone(s, certain())
    assert (ac.choice, ac.confidence, ac.probabilities) == ("only", 1.0, {"only": 1.0})
    assert (as_.score, as_.confidence, as_.legend, as_.probabilities) == (
        0.0,
        1.0,
        {"0": {"level": "critical"}},
        {"0": 1.0},
    )


def test_noul_has_no_confidence_in_typesafe():
    (q,) = parse_systemone(
        {"model": "m", "state": "s", "questions": {"n": {"type": "noul", "instructions": "?"}}}, lambda m: m
    ).questions
    d = distribution([[1.0, 0.0], [0.0, 1.0]], option_orders(2), 1.0)
    a = answer_systemone(q, d)
    assert list(msgspec.to_builtins(a)) == ["type", "noul"] and a.noul == pytest.approx(d.p_cal[0])


def test_ties_pick_the_first_key():
    q = Question(
        "choice",
        parse_basal({"state": "s", "questions": {"c": {"criteria": ["a", "b", "c"]}}}, lambda m: "m").questions[0].item,
    )
    d = distribution([[1.0, 2.0, 2.0], [2.0, 2.0, 1.0]], option_orders(3), 1.0)
    assert answer_basal(q, d).choice == "b"


logits = st.lists(st.floats(min_value=-60, max_value=60, allow_nan=False), min_size=2, max_size=10)


@settings(max_examples=200, deadline=None)
@given(logits, st.data(), st.floats(min_value=0.5, max_value=3.0))
def test_probabilities_sum_to_one(first, data, t):
    second = data.draw(st.lists(st.floats(min_value=-60, max_value=60), min_size=len(first), max_size=len(first)))
    d = distribution([first, second], option_orders(len(first)), t)
    for p in (*d.probs, d.p_avg, d.p_cal):
        assert abs(p.sum() - 1.0) < 1e-12 and np.all(p >= 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1), min_size=2, max_size=10), st.randoms())
def test_unpermute_inverts_the_shown_order(canon, rnd):
    canon = np.array(canon)
    perm = list(range(len(canon)))
    rnd.shuffle(perm)
    shown = canon[perm]  # letter `pos` shows option perm[pos]
    assert np.array_equal(unpermute(shown, perm), canon)  # exact: a permutation moves values, never rounds


def test_reversed_order_unpermutes_exactly():
    logits = [3.0, 1.0, -2.0, 0.5]
    d = distribution([logits, logits[::-1]], option_orders(4), 1.0)
    assert np.array_equal(d.probs[0], d.probs[1][::-1])
    assert np.array_equal(d.p_avg, d.probs[0])
