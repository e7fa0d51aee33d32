"""The Luce-model fit of a grouped choice (docs/extensions.md §7.3): one distribution over n options from the
distributions the model gave over overlapping groups of at most 10.

Model: p = softmax(θ); a group sees the softmax of θ restricted to its members. The fit maximises the soft-target
log-likelihood Σ_k Σ_a t_ka · ln σ_k(θ)_a by Newton steps (1e-9 ridge against the all-ones null direction,
backtracking). The Hessian is diagonal minus one rank-one term per group, so each step solves an m×m system
(m groups) instead of the n×n one, with a Cholesky written out in a fixed order: no BLAS or LAPACK call, so the
bits do not depend on thread settings and the fit never waits for a thread pool. Connected groups make the
maximiser unique, so this agrees with the Rust engine's solver to ~1e-10 (bit-exact only with its operation
order). Host math in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from basal.core.errors import Cancelled

MAX_ITERATIONS = 100
GRADIENT_TOLERANCE = 1e-10
RIDGE = 1e-9
TARGET_FLOOR = 1e-12  # start values: ln(max(t, 1e-12))
SIGMA_FLOOR = 1e-300  # objective: ln(max(σ, 1e-300))
ACCEPT_SLACK = 1e-12  # a step is accepted when it loses at most this much likelihood
MIN_STEP = 1e-6  # ... or once backtracking has halved it below this


class _Groups:
    """The groups as flat arrays: `members[j]` is an option of group `group[j]`; group k is `members[start[k]:
    start[k + 1]]`. Every per-group step is then a handful of numpy calls whatever the number of groups."""

    def __init__(self, n: int, groups: Sequence[Sequence[int]], targets: Sequence[Sequence[float]]):
        sizes = [len(g) for g in groups]
        self.n, self.m = n, len(groups)
        self.members = np.asarray([i for g in groups for i in g], dtype=np.intp)
        self.group = np.repeat(np.arange(self.m), sizes)
        self.start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
        self.targets = np.concatenate([np.asarray(t, dtype=np.float64) for t in targets])
        # pairs of groups that share an option (the off-diagonal terms of Uᵀ D⁻¹ U), as positions into `members`
        at: list[list[int]] = [[] for _ in range(n)]
        for j, i in enumerate(self.members):
            at[i].append(j)
        pairs = [(i, a, b) for i in range(n) for a in at[i] for b in at[i]]
        self.pair_option = np.asarray([p[0] for p in pairs], dtype=np.intp)
        self.pair_a = np.asarray([p[1] for p in pairs], dtype=np.intp)
        self.pair_b = np.asarray([p[2] for p in pairs], dtype=np.intp)

    def softmax(self, theta: np.ndarray) -> np.ndarray:
        """σ_k(θ) of every group, flat."""
        x = theta[self.members]
        e = np.exp(x - np.maximum.reduceat(x, self.start)[self.group])
        return e / np.add.reduceat(e, self.start)[self.group]

    def log_likelihood(self, theta: np.ndarray) -> float:
        return float(np.sum(self.targets * np.log(np.maximum(self.softmax(theta), SIGMA_FLOOR))))


def log_likelihood(theta: np.ndarray, groups: Sequence[Sequence[int]], targets: Sequence[Sequence[float]]) -> float:
    return _Groups(len(theta), groups, targets).log_likelihood(theta)


def _cholesky_solve(h: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """Solve h·x = b for a symmetric positive-definite h; None when a pivot is not positive.

    Written out with elementwise products and numpy's own sums (no BLAS or LAPACK call), so the operation order
    is fixed: the same bits under any BLAS or OpenMP thread setting, and no thread pool to fight torch's."""
    n = len(b)
    lower = np.zeros_like(h)
    for j in range(n):  # left-looking: column j from the columns before it
        column = h[j:, j] - np.add.reduce(lower[j:, :j] * lower[j, :j], axis=1)
        if not column[0] > 0:
            return None
        pivot = lower[j, j] = np.sqrt(column[0])
        lower[j + 1 :, j] = column[1:] / pivot
    y = b.astype(np.float64)  # forward substitution, L y = b, a column at a time
    for j in range(n):
        y[j] /= lower[j, j]
        y[j + 1 :] -= lower[j + 1 :, j] * y[j]
    x = y  # back substitution, Lᵀ x = y (row j of L is column j of Lᵀ)
    for j in range(n - 1, -1, -1):
        x[j] /= lower[j, j]
        x[:j] -= lower[j, :j] * x[j]
    return x


def _newton_step(g: _Groups, s: np.ndarray, grad: np.ndarray) -> np.ndarray | None:
    """Solve H·x = grad for the negated Hessian H = D − U·Uᵀ (+ ridge), where D = Σ_k diag(σ_k) and column k of U
    is σ_k: by Woodbury, through the m×m system C = I − Uᵀ D⁻¹ U (m groups ≤ 2·26 + 1), never the n×n one.
    None when C is not positive definite."""
    d = np.full(g.n, RIDGE)
    np.add.at(d, g.members, s)
    y = grad / d
    r = np.zeros(g.m)  # Uᵀ D⁻¹ grad
    np.add.at(r, g.group, s * y[g.members])
    c = np.eye(g.m)
    np.add.at(c, (g.group[g.pair_a], g.group[g.pair_b]), -s[g.pair_a] * s[g.pair_b] / d[g.pair_option])
    z = _cholesky_solve(c, r)
    if z is None:
        return None
    uz = np.zeros(g.n)  # U z
    np.add.at(uz, g.members, s * z[g.group])
    return y + uz / d


def fit(
    n: int,
    groups: Sequence[Sequence[int]],
    targets: Sequence[Sequence[float]],
    cancelled: Callable[[], bool] = lambda: False,
) -> np.ndarray:
    """Joint distribution over n options from group distributions (`targets[k]` over `groups[k]`, in order).
    `cancelled()` is asked before every Newton step: True stops the fit with `Cancelled`."""
    g = _Groups(n, groups, targets)
    theta = np.zeros(n)
    counts = np.zeros(n)
    np.add.at(theta, g.members, np.log(np.maximum(g.targets, TARGET_FLOOR)))
    np.add.at(counts, g.members, 1.0)
    theta = np.divide(theta, counts, out=np.zeros(n), where=counts > 0)

    f = g.log_likelihood(theta)
    for _ in range(MAX_ITERATIONS):
        if cancelled():
            raise Cancelled()
        s = g.softmax(theta)
        grad = np.zeros(n)
        np.add.at(grad, g.members, g.targets - s)
        if np.max(np.abs(grad)) < GRADIENT_TOLERANCE:
            break
        step = _newton_step(g, s, grad)
        if step is None:
            step = grad
        t_step = 1.0
        while True:
            candidate = theta + t_step * step
            f_candidate = g.log_likelihood(candidate)
            if f_candidate >= f - ACCEPT_SLACK or t_step < MIN_STEP:
                break
            t_step /= 2
        theta, f = candidate, f_candidate
    e = np.exp(theta - theta.max())
    return e / e.sum()
