"""The temperature fit recovers a known temperature, and a fit that would worsen held-out loss is rolled back.

Tolerance: the maximum-likelihood estimate of b = 1/T is asymptotically normal with standard error
1/sqrt(NLL''(b)) (the observed information); by the delta method T's is that / b². The fit must land within 4 of
its own standard errors of T* (a two-sided normal tail of 6e-5), and that tolerance must itself be tight (under 10 %
of T*), so a biased fit — say, one on the average of the orders' logits instead of their probabilities — fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from basal.calibration.fit import T_MAX, T_MIN, calibrated, choose_temperature, fit_temperature, log_loss, logits_matrix
from basal.core.decision.distribution import calibrate, distribution


def _draw(n: int, t_star: float, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """p_avg of synthetic questions (2-5 options, two option orders through the serving math) and gold answers
    drawn from the distribution calibrated at `t_star`."""
    rng = np.random.default_rng(seed)
    p_avg, gold = [], []
    for _ in range(n):
        k = int(rng.integers(2, 6))
        base = rng.normal(0, 2.0, k)
        orders = [list(range(k)), list(range(k))[::-1]]
        logits = [base[perm] + rng.normal(0, 0.5, k) for perm in orders]  # letter logits by position
        d = distribution(logits, orders, 1.0)
        p = calibrate(d.p_avg, t_star)
        p_avg.append(d.p_avg)
        gold.append(int(rng.choice(k, p=p / p.sum())))
    return p_avg, np.array(gold)


@pytest.mark.parametrize("t_star", [0.7, 1.0, 1.6, 3.0])
def test_the_fit_recovers_a_known_temperature(t_star: float) -> None:
    p_avg, gold = _draw(10000, t_star, seed=int(t_star * 100))
    fit = fit_temperature(logits_matrix(p_avg), gold)
    assert not fit.at_bound
    assert 4 * fit.se < 0.1 * t_star  # the derived tolerance is tight enough to mean something
    assert abs(fit.temperature - t_star) <= 4 * fit.se, (fit.temperature, fit.se)


def test_a_fit_at_another_temperature_is_outside_the_tolerance() -> None:
    """The check can fail: labels drawn at 1.6 are not explained by 1.3."""
    p_avg, gold = _draw(4000, 1.6, seed=1)
    fit = fit_temperature(logits_matrix(p_avg), gold)
    assert abs(fit.temperature - 1.3) > 4 * fit.se


def test_the_calibrated_distribution_is_what_the_server_computes() -> None:
    p_avg, _ = _draw(50, 1.0, seed=3)
    z = logits_matrix(p_avg)
    for t in (0.5, 1.0, 1.3939382634489992, 4.0):
        got = calibrated(z, t)
        for row, p in zip(got, p_avg, strict=True):
            np.testing.assert_allclose(row[: len(p)], calibrate(p, t), rtol=1e-13, atol=1e-300)
            assert not row[len(p) :].any()


def test_the_fit_minimises_the_log_loss() -> None:
    p_avg, gold = _draw(500, 2.0, seed=4)
    z = logits_matrix(p_avg)
    t = fit_temperature(z, gold).temperature
    best = log_loss(z, gold, t).sum()
    for other in (t * 0.98, t * 1.02, t - 1e-3, t + 1e-3):
        assert log_loss(z, gold, other).sum() > best


def test_all_right_and_sure_runs_to_the_bound() -> None:
    p_avg = [np.array([0.9, 0.1])] * 20
    fit = fit_temperature(logits_matrix(p_avg), np.zeros(20, dtype=np.int64))
    assert fit.at_bound and fit.temperature == T_MIN
    fit = fit_temperature(logits_matrix(p_avg), np.ones(20, dtype=np.int64))
    assert fit.at_bound and fit.temperature == T_MAX


def test_a_fit_that_worsens_held_out_loss_is_rolled_back() -> None:
    """Group a is always right at p = 0.9, group b always wrong: each fold's fit (sharpen to the bound on a,
    flatten to the bound on b) is far worse on the other group than the shipped T = 1."""
    p_avg = [np.array([0.9, 0.1])] * 40
    gold = np.array([0] * 20 + [1] * 20)
    groups = ["a"] * 20 + ["b"] * 20
    choice = choose_temperature(logits_matrix(p_avg), gold, groups, shipped=1.0, folds=2)
    assert choice.cv_log_loss_fitted > choice.cv_log_loss_shipped
    assert not choice.improves and choice.served == 1.0
    assert choice.fitted.temperature != 1.0  # there was a fit: it is not served


def test_a_fit_that_helps_is_kept() -> None:
    p_avg, gold = _draw(1000, 2.0, seed=5)
    groups = [f"g{i % 50}" for i in range(1000)]
    choice = choose_temperature(logits_matrix(p_avg), gold, groups, shipped=1.0)
    assert choice.improves and choice.served == choice.fitted.temperature
