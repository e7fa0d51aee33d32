"""Certified thresholds keep their promise, checked by simulation; the bound itself against an exact sum; grouped
splits never share a group.

The simulated model: confidence C uniform on [0.5, 1], wrong with probability q(C) = 1 - C (calibrated), so the
true error of the answers kept at threshold t is e(t) = E[1 - C | C >= t] = (1 - t) / 2 (0.05 at t = 0.9). Each
repetition draws a fitting and a certification sample, certifies, and checks e(threshold) <= target: what a fresh
draw of answers would see on average. The promise is >= 95 % of repetitions; a naive rule (the lowest threshold
whose observed error meets the target) breaks it, which shows the check can fail.
"""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np
import pytest

from basal.calibration.calibrate import split
from basal.calibration.certify import Certified, NotCertified, certify, cp_upper, needed


def _draw(rng: np.random.Generator, n: int, slope: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    c = rng.uniform(0.5, 1.0, n)
    return c, rng.uniform(size=n) < slope * (1 - c)


def _true_error(t: float, slope: float = 1.0) -> float:
    return slope * (1 - t) / 2


@pytest.mark.parametrize(("k", "n"), [(0, 10), (1, 20), (3, 100), (12, 300), (50, 60)])
def test_the_bound_is_the_clopper_pearson_quantile(k: int, n: int) -> None:
    u = cp_upper(k, n)
    tail = sum(Fraction(comb(n, j)) * Fraction(u) ** j * (1 - Fraction(u)) ** (n - j) for j in range(k + 1))
    assert abs(float(tail) - 0.05) < 1e-9
    assert cp_upper(k, n) > k / n


def test_needed_answers() -> None:
    assert needed(0.01) == 299 and needed(0.05) == 59
    assert cp_upper(0, needed(0.05)) <= 0.05 < cp_upper(0, needed(0.05) - 1)


def _certify_rate(reps: int, n: int, target: float, slope: float, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    held, coverage = 0, []
    for _ in range(reps):
        fc, fw = _draw(rng, n, slope)
        cc, cw = _draw(rng, n, slope)
        result = certify(cc, cw, fc, fw, target)
        if isinstance(result, Certified):
            held += _true_error(result.confidence, slope) <= target
            coverage.append(result.coverage)
        else:
            held += 1  # nothing certified: no promise broken
    return held / reps, float(np.median(coverage)) if coverage else 0.0


def test_certified_thresholds_hold_on_fresh_draws() -> None:
    rate, coverage = _certify_rate(reps=400, n=1000, target=0.05, slope=1.0, seed=0)
    assert rate >= 0.95, rate
    assert coverage > 0.05  # it certifies something useful (at the true boundary 20 % are kept)


def test_certified_thresholds_hold_on_fresh_draws_many() -> None:
    for target, slope, seed in ((0.05, 1.0, 1), (0.02, 0.5, 2), (0.1, 1.5, 3)):
        rate, _ = _certify_rate(reps=500, n=2000, target=target, slope=slope, seed=seed)
        assert rate >= 0.95, (target, rate)


def test_a_naive_rule_breaks_the_promise() -> None:
    """The lowest threshold whose observed error meets the target: about half of the draws overshoot."""
    rng = np.random.default_rng(0)
    broken = 0
    for _ in range(200):
        c, w = _draw(rng, 1500)
        order = np.argsort(-c)
        observed = np.cumsum(w[order]) / np.arange(1, len(c) + 1)
        ok = np.nonzero(observed <= 0.05)[0]
        broken += _true_error(c[order][ok[-1]]) > 0.05
    assert broken / 200 > 0.05


def test_too_few_answers_are_left_out_with_the_reason() -> None:
    rng = np.random.default_rng(0)
    c, w = _draw(rng, 200)
    result = certify(c, w, c, w, 0.01)
    assert isinstance(result, NotCertified) and "too few held-out answers: 200" in result.reason
    assert "at least 299" in result.reason


def test_a_target_no_threshold_meets_is_left_out() -> None:
    rng = np.random.default_rng(0)
    c = rng.uniform(0.5, 1.0, 2000)
    w = rng.uniform(size=2000) < 0.3  # 30 % wrong at every confidence
    result = certify(c, w, c, w, 0.05)
    assert isinstance(result, NotCertified) and "failed on the held-out data" in result.reason


class _Line:
    def __init__(self, group: str):
        self.group = group


class _Obs:
    def __init__(self, group: str):
        self.line = _Line(group)


@pytest.mark.parametrize("seed", range(5))
def test_grouped_splits_never_share_a_group(seed: int) -> None:
    rng = np.random.default_rng(seed)
    observed = [_Obs(f"customer-{int(g)}") for g in rng.integers(0, 40, 600)]
    held = split(observed, 0.5, seed)  # type: ignore[arg-type]
    fit_groups = {o.line.group for o, h in zip(observed, held, strict=True) if not h}
    held_groups = {o.line.group for o, h in zip(observed, held, strict=True) if h}
    assert fit_groups and held_groups and not fit_groups & held_groups
    assert 0.4 < held.mean() < 0.6


def test_meets_is_the_bound_at_or_under_the_target() -> None:
    from basal.calibration.certify import meets

    for n in (1, 30, 59, 60, 300, 1000):
        for k in range(0, min(n, 40) + 1, 3):
            for target in (0.01, 0.05, 0.1, 0.3):
                assert meets(k, n, target) == (cp_upper(k, n) <= target), (k, n, target)
