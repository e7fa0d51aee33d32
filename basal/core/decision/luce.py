"""The Luce-model fit of a grouped choice (docs/extensions.md §7.3): one distribution over n options from the
distributions the model gave over overlapping groups of at most 10.

Model: p = softmax(θ); a group sees the softmax of θ restricted to its members. The fit maximises the soft-target
log-likelihood Σ_k Σ_a t_ka · ln σ_k(θ)_a by Newton steps (dense Cholesky, 1e-9 ridge against the all-ones null
direction, backtracking). Connected groups make the maximiser unique, so this agrees with the Rust engine's
solver to ~1e-10 (bit-exact only with its operation order). Host math in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAX_ITERATIONS = 100
GRADIENT_TOLERANCE = 1e-10
RIDGE = 1e-9
TARGET_FLOOR = 1e-12  # start values: ln(max(t, 1e-12))
SIGMA_FLOOR = 1e-300  # objective: ln(max(σ, 1e-300))
ACCEPT_SLACK = 1e-12  # a step is accepted when it loses at most this much likelihood
MIN_STEP = 1e-6  # ... or once backtracking has halved it below this


def _group_softmax(theta: np.ndarray, members: np.ndarray) -> np.ndarray:
    x = theta[members]
    e = np.exp(x - x.max())
    return e / e.sum()


def log_likelihood(theta: np.ndarray, groups: Sequence[np.ndarray], targets: Sequence[np.ndarray]) -> float:
    total = 0.0
    for members, t in zip(groups, targets, strict=True):
        total += float(np.dot(t, np.log(np.maximum(_group_softmax(theta, members), SIGMA_FLOOR))))
    return total


def _cholesky_solve(h: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """Solve h·x = b for a symmetric positive-definite h; None when a pivot is not positive."""
    try:
        lower = np.linalg.cholesky(h)
    except np.linalg.LinAlgError:
        return None
    n = len(b)
    y = np.empty(n)
    for i in range(n):  # forward substitution: L y = b
        y[i] = (b[i] - np.dot(lower[i, :i], y[:i])) / lower[i, i]
    x = np.empty(n)
    for i in range(n - 1, -1, -1):  # back substitution: Lᵀ x = y
        x[i] = (y[i] - np.dot(lower[i + 1 :, i], x[i + 1 :])) / lower[i, i]
    return x


def fit(n: int, groups: Sequence[Sequence[int]], targets: Sequence[Sequence[float]]) -> np.ndarray:
    """Joint distribution over n options from group distributions (`targets[k]` over `groups[k]`, in order)."""
    idx = [np.asarray(g, dtype=np.intp) for g in groups]
    tgt = [np.asarray(t, dtype=np.float64) for t in targets]
    theta = np.zeros(n)
    counts = np.zeros(n)
    for members, t in zip(idx, tgt, strict=True):
        np.add.at(theta, members, np.log(np.maximum(t, TARGET_FLOOR)))
        np.add.at(counts, members, 1.0)
    theta = np.divide(theta, counts, out=np.zeros(n), where=counts > 0)

    f = log_likelihood(theta, idx, tgt)
    for _ in range(MAX_ITERATIONS):
        grad = np.zeros(n)
        hessian = np.zeros((n, n))  # the negated Hessian of the log-likelihood
        for members, t in zip(idx, tgt, strict=True):
            s = _group_softmax(theta, members)
            np.add.at(grad, members, t - s)
            hessian[np.ix_(members, members)] -= np.outer(s, s)
            hessian[members, members] += s
        if np.max(np.abs(grad)) < GRADIENT_TOLERANCE:
            break
        hessian[np.diag_indices(n)] += RIDGE
        step = _cholesky_solve(hessian, grad)
        if step is None:
            step = grad
        t_step = 1.0
        while True:
            candidate = theta + t_step * step
            f_candidate = log_likelihood(candidate, idx, tgt)
            if f_candidate >= f - ACCEPT_SLACK or t_step < MIN_STEP:
                break
            t_step /= 2
        theta, f = candidate, f_candidate
    e = np.exp(theta - theta.max())
    return e / e.sum()
