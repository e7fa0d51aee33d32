"""Certified `max_error` thresholds: the lowest confidence at which the answers kept have an error rate whose
one-sided 95 % Clopper–Pearson upper bound is at most the target, on data the temperatures never saw.

Choosing the lowest of many thresholds by looking at their bounds is a multiple-testing problem: tested one by one
at 95 %, some threshold would pass by luck. The procedure is fixed-sequence testing (docs/calibration.md): the
candidate thresholds and their order (highest confidence first, starting where the *fitting* split suggests the
target is met) come from the fitting split only; on the certification split they are tested in that order, each
at the full 5 % level, and testing stops at the first that fails. The last one that passed is certified. A false
certificate needs the first false hypothesis in the sequence to pass its own 5 % test, so for each target the
chance of certifying a threshold whose true error is above the target is at most 5 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
MAX_CANDIDATES = 512  # thresholds in one sequence


def cp_upper(errors: int, n: int, level: float = LEVEL) -> float:
    """One-sided Clopper–Pearson upper bound: the u at which P(Binomial(n, u) <= errors) = 1 - level."""
    if n <= 0 or errors >= n:
        return 1.0
    alpha = 1.0 - level
    if errors == 0:
        return 1.0 - alpha ** (1.0 / n)
    lo, hi = errors / n, 1.0
    for _ in range(200):  # the CDF falls as u grows
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if binomial_cdf(errors, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def binomial_cdf(k: int, n: int, u: float) -> float:
    """P(Binomial(n, u) <= k), summed in log space (exact to rounding for any n)."""
    if u <= 0.0:
        return 1.0
    if u >= 1.0:
        return 1.0 if k >= n else 0.0
    j = np.arange(k + 1, dtype=np.float64)
    log_choose = math.lgamma(n + 1) - np.array([math.lgamma(x + 1) + math.lgamma(n - x + 1) for x in j])
    terms = log_choose + j * math.log(u) + (n - j) * math.log1p(-u)
    top = terms.max()
    return float(math.exp(top) * np.exp(terms - top).sum())


def meets(errors: int, n: int, target: float, level: float = LEVEL) -> bool:
    """cp_upper(errors, n) <= target, decided with one binomial tail: P(Binomial(n, target) <= errors) <= 1 - level."""
    if n <= 0 or errors >= n or errors > target * n:
        return False
    return binomial_cdf(errors, n, target) <= 1.0 - level


def needed(target: float, level: float = LEVEL) -> int:
    """Answers needed for a bound at or under `target` even with no error at all."""
    return math.ceil(math.log(1.0 - level) / math.log1p(-target))


@dataclass(frozen=True)
class Certified:
    target: float
    confidence: float  # answers with confidence >= this are kept
    kept: int
    errors: int
    held_out: int  # answers on the certification split
    bound: float  # the 95 % upper bound on the error of the kept answers
    tested: int  # thresholds tested in the sequence (the last one failed, or the candidates ran out)

    @property
    def coverage(self) -> float:
        return self.kept / self.held_out

    def entry(self) -> dict[str, float | int]:
        """The `thresholds` entry of CALIBRATION.json: `confidence` is what `max_error` reads."""
        return {
            "confidence": self.confidence,
            "coverage": self.coverage,
            "error_bound": self.bound,
            "observed_error": self.errors / self.kept if self.kept else 0.0,
            "kept": self.kept,
            "errors": self.errors,
            "held_out": self.held_out,
            "level": LEVEL,
            "tested": self.tested,
        }


@dataclass(frozen=True)
class NotCertified:
    target: float
    reason: str


def candidates(fit_conf: np.ndarray, fit_wrong: np.ndarray, target: float, level: float = LEVEL) -> list[float]:
    """The sequence to test, from the fitting split alone: its distinct confidences, highest first, starting at the
    highest one whose bound on the fitting split meets the target (else the one with the lowest bound)."""
    distinct = np.unique(fit_conf)[::-1]
    if len(distinct) == 0:
        return []
    order = np.argsort(-fit_conf, kind="stable")
    c_sorted, w_sorted = fit_conf[order], fit_wrong[order].astype(np.int64)
    kept = np.searchsorted(-c_sorted, -distinct, side="right")  # answers with confidence >= each candidate
    errs = np.concatenate([[0], np.cumsum(w_sorted)])[kept]
    best, best_bound = 0, 2.0
    need = needed(target, level)
    for i, (n, k) in enumerate(zip(kept, errs, strict=True)):
        if n < need or k > target * n:  # the bound is above the target: too few kept, or at least the observed rate
            continue
        if meets(int(k), int(n), target, level):
            best = i
            break
        tail = binomial_cdf(int(k), int(n), target)  # none meets it: start at the most promising (lowest tail)
        if tail < best_bound:
            best, best_bound = i, tail
    sequence = distinct[best:]
    if len(sequence) > MAX_CANDIDATES:  # evenly thinned: a long walk costs time, not validity
        sequence = sequence[np.linspace(0, len(sequence) - 1, MAX_CANDIDATES).round().astype(np.int64)]
    return [float(c) for c in sequence]


def certify(
    conf: np.ndarray,
    wrong: np.ndarray,
    fit_conf: np.ndarray,
    fit_wrong: np.ndarray,
    target: float,
    level: float = LEVEL,
) -> Certified | NotCertified:
    """Fixed-sequence test of the fitting split's candidates on the certification split (`conf`, `wrong`)."""
    n_all = len(conf)
    need = needed(target, level)
    if n_all < need:
        return NotCertified(
            target,
            f"too few held-out answers: {n_all}; a {level:.0%} bound at or under {target} needs at least {need} "
            "answers kept even with no error",
        )
    sequence = candidates(fit_conf, fit_wrong, target, level)
    if not sequence:
        return NotCertified(target, "no answers on the fitting split to choose candidate thresholds from")
    last: Certified | None = None
    for i, t in enumerate(sequence, 1):
        kept = conf >= t
        n, k = int(kept.sum()), int(wrong[kept].sum())
        if not meets(k, n, target, level):
            u = cp_upper(k, n, level)
            if last is None:
                return NotCertified(
                    target,
                    f"the first candidate threshold ({t:.6g}) failed on the held-out data: {n} answers kept, {k} "
                    f"wrong, {level:.0%} upper bound {u:.4g} > {target}",
                )
            return _exact(last, i, level)
        last = Certified(target, t, n, k, n_all, target, i)  # its bound is computed once it is the last
    assert last is not None
    return _exact(last, last.tested, level)


def _exact(c: Certified, tested: int, level: float) -> Certified:
    """The certified threshold with its bound (the walk only asked whether each bound meets the target)."""
    return Certified(c.target, c.confidence, c.kept, c.errors, c.held_out, cp_upper(c.errors, c.kept, level), tested)
