"""The large-choice fit gives the same bytes under any BLAS / OpenMP thread setting (it calls neither BLAS nor
LAPACK), agrees with a dense solve, and stops between its steps once the client is gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from basal.core.decision.large_choice import groups
from basal.core.decision.luce import fit
from basal.core.errors import Cancelled

ROOT = Path(__file__).resolve().parents[3]
# 40 questions' worth of fits is what a request of the probe ran; 3 x 255 options covers the same code paths.
SCRIPT = """
import hashlib, sys
import numpy as np
from basal.core.decision.large_choice import groups
from basal.core.decision.luce import fit
digest = hashlib.sha256()
for n, seed in ((255, 0), (255, 1), (173, 2), (11, 3)):
    rng = np.random.default_rng(seed)
    theta = rng.normal(0, 2, n)
    targets = []
    for g in groups(n):
        e = np.exp(theta[g] + rng.normal(0, 0.3, len(g)))
        targets.append(e / e.sum())
    digest.update(fit(n, groups(n), targets).tobytes())
print(digest.hexdigest())
"""
THREADS = ["1", "2", "4", "16"]


def run_fit(threads: str, knob: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    env.update({"MKL_NUM_THREADS": threads, knob: threads})
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_same_bytes_under_any_thread_setting():
    digests = {(knob, t): run_fit(t, knob) for knob in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") for t in THREADS}
    assert len(set(digests.values())) == 1, digests


def targets_of(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    theta = rng.normal(0, 2, n)
    out = []
    for g in groups(n):
        e = np.exp(theta[g] + rng.normal(0, 0.3, len(g)))
        out.append(e / e.sum())
    return out


def dense_newton(n: int, gs, ts) -> np.ndarray:
    """The maximiser by dense Newton steps (LAPACK's solve) with backtracking: the fit must agree with it."""

    def softmaxes(theta):
        return [np.exp(theta[g] - theta[g].max()) / np.exp(theta[g] - theta[g].max()).sum() for g in gs]

    def loglik(theta):
        return sum(float(t @ np.log(s)) for s, t in zip(softmaxes(theta), ts, strict=True))

    theta = np.zeros(n)
    for _ in range(100):
        grad, h = np.zeros(n), np.eye(n) * 1e-9
        for g, t, s in zip(gs, ts, softmaxes(theta), strict=True):
            grad[g] += t - s
            h[np.ix_(g, g)] += np.diag(s) - np.outer(s, s)
        if np.max(np.abs(grad)) < 1e-12:
            break
        step, f, size = np.linalg.solve(h, grad), loglik(theta), 1.0
        while loglik(theta + size * step) < f - 1e-12 and size > 1e-6:
            size /= 2
        theta = theta + size * step
    e = np.exp(theta - theta.max())
    return e / e.sum()


@pytest.mark.parametrize("n", [11, 40, 255])
def test_agrees_with_a_dense_solve(n):
    gs, ts = groups(n), targets_of(n, n)
    assert np.max(np.abs(fit(n, gs, ts) - dense_newton(n, gs, ts))) < 1e-12


def test_stops_between_steps_once_the_client_is_gone():
    asked = []

    def cancelled() -> bool:
        asked.append(1)
        return len(asked) > 2

    with pytest.raises(Cancelled):
        fit(255, groups(255), targets_of(255, 0), cancelled)
    assert len(asked) == 3
