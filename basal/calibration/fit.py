"""One temperature per question type, fitted by maximum likelihood of the gold answers (plain numpy).

The model's answer is p_cal = softmax(z / T) with z = log(max(p_avg, 1e-12)) (`distribution.calibrate`, what the
server computes), so with b = 1/T the negative log-likelihood of the gold answers g_i is

    NLL(b) = sum_i [ logsumexp(b z_i) - b z_ig ]      NLL'(b) = sum_i (E_b[z_i] - z_ig)     NLL''(b) = sum_i Var_b[z_i]

convex in b: a safeguarded Newton search on b in [1/T_MAX, 1/T_MIN] finds its minimum. The standard error of the
fit comes from the observed information NLL''(b) (delta method for T = 1/b).

Whether the fit is served is decided on held-out data: grouped K-fold cross-validation on the fitting split (a
fold's temperature fitted on the other folds); the fit replaces the shipped temperature only if its
cross-validated log-loss is lower.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from basal.core.decision.distribution import FLOOR

T_MIN, T_MAX = 0.05, 20.0


def logits_matrix(p_avg: Sequence[np.ndarray]) -> np.ndarray:
    """[n, kmax] of z = log(max(p, 1e-12)); options a question lacks are -inf (probability 0 at every T)."""
    k = max((len(p) for p in p_avg), default=1)
    z = np.full((len(p_avg), k), -np.inf)
    for i, p in enumerate(p_avg):
        z[i, : len(p)] = np.log(np.maximum(np.asarray(p, dtype=np.float64), FLOOR))
    return z


def calibrated(z: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(z / T) row by row: `distribution.calibrate` for every question at once (T == 1: p itself)."""
    x = z if temperature == 1.0 else z / temperature
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def log_loss(z: np.ndarray, gold: np.ndarray, temperature: float) -> np.ndarray:
    """-log p_cal[gold] of every question (floored as the probabilities are)."""
    p = calibrated(z, temperature)
    return -np.log(np.maximum(p[np.arange(len(gold)), gold], FLOOR))


def _moments(z: np.ndarray, gold: np.ndarray, b: float) -> tuple[float, float]:
    x = np.where(np.isfinite(z), z, 0.0)
    w = np.where(np.isfinite(z), np.exp(b * z - (b * z).max(axis=1, keepdims=True)), 0.0)
    w /= w.sum(axis=1, keepdims=True)
    mean = (w * x).sum(axis=1)
    var = (w * (x - mean[:, None]) ** 2).sum(axis=1)
    return float((mean - x[np.arange(len(gold)), gold]).sum()), float(var.sum())


@dataclass(frozen=True)
class Fit:
    temperature: float
    se: float  # standard error of the temperature (inf: not identified, e.g. at a bound)
    at_bound: bool  # the likelihood keeps improving past T_MIN or T_MAX


def fit_temperature(z: np.ndarray, gold: np.ndarray) -> Fit:
    """The temperature that minimises the NLL of `gold` under softmax(z / T), T in [T_MIN, T_MAX]."""
    lo, hi = 1.0 / T_MAX, 1.0 / T_MIN
    g_lo, _ = _moments(z, gold, lo)
    g_hi, _ = _moments(z, gold, hi)
    if g_lo >= 0:
        return Fit(T_MAX, float("inf"), True)
    if g_hi <= 0:
        return Fit(T_MIN, float("inf"), True)
    b = min(max(1.0, lo), hi)
    for _ in range(200):
        g, h = _moments(z, gold, b)
        if g > 0:
            hi = b
        else:
            lo = b
        step = b - g / h if h > 0 else (lo + hi) / 2
        b = step if lo < step < hi else (lo + hi) / 2
        if hi - lo < 1e-12 * b or abs(g) < 1e-10 * len(gold):
            break
    _, h = _moments(z, gold, b)
    se_b = 1.0 / np.sqrt(h) if h > 0 else float("inf")
    return Fit(1.0 / b, float(se_b / b**2), False)


@dataclass(frozen=True)
class Choice:
    """A type's temperature: the fit on the whole fitting split, and whether held-out data says to serve it."""

    fitted: Fit
    shipped: float
    cv_log_loss_fitted: float  # mean held-out log-loss of the fold fits
    cv_log_loss_shipped: float
    folds: int

    @property
    def improves(self) -> bool:
        return self.cv_log_loss_fitted < self.cv_log_loss_shipped

    @property
    def served(self) -> float:
        return self.fitted.temperature if self.improves else self.shipped


def fold_of(groups: Sequence[str], folds: int, seed: int) -> np.ndarray:
    """Each question's fold: whole groups are dealt to folds in a seeded order (no group in two folds)."""
    names = sorted(set(groups))
    order = np.random.default_rng(seed).permutation(len(names))
    fold = {names[j]: i % folds for i, j in enumerate(order)}
    return np.array([fold[g] for g in groups], dtype=np.int64)


def choose_temperature(
    z: np.ndarray, gold: np.ndarray, groups: Sequence[str], shipped: float, folds: int = 5, seed: int = 0
) -> Choice:
    """Fit on everything; cross-validate fit against `shipped` over `folds` grouped folds (fewer with few groups)."""
    k = max(2, min(folds, len(set(groups))))
    fold = fold_of(groups, k, seed)
    fitted_loss = shipped_loss = 0.0
    for f in range(k):
        test = fold == f
        if not test.any() or test.all():
            continue
        t = fit_temperature(z[~test], gold[~test]).temperature
        fitted_loss += float(log_loss(z[test], gold[test], t).sum())
        shipped_loss += float(log_loss(z[test], gold[test], shipped).sum())
    n = len(gold)
    return Choice(fit_temperature(z, gold), shipped, fitted_loss / n, shipped_loss / n, k)
