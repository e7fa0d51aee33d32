"""The large-choice fit under load: a request of 40 choices x 255 options on the demo model, 10 runs, while torch
computes another request in the same process; before (the dense n x n Newton step through LAPACK's Cholesky, as
basal had it) and after (`basal.core.decision.luce`: Woodbury through the m x m group system, no BLAS).

    python -m bench.lab.large_choice_fit                 # demo model, 10 runs per fit
    python -m bench.lab.large_choice_fit --runs 3 --questions 8
    python -m bench.lab.large_choice_fit --before-runs 3       # the old fit is slow under load

Prints the median and max wall time of the request and of the fits inside it, and the ratio of the two fits'
medians (measured in the same run, same machine load). Writes bench/results/large_choice_fit.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

import basal.core.decision.large_choice as large_choice
from basal.backends.cuda.backend import TorchBackend
from basal.benchsuite.workloads import EN, state_of_tokens
from basal.core.decision import luce
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_systemone


def dense_fit(n: int, groups: Sequence[Sequence[int]], targets: Sequence[Sequence[float]], cancelled=None):
    """The fit as basal had it: an n x n Hessian per step, numpy.linalg.cholesky (LAPACK, BLAS threads)."""
    idx = [np.asarray(g, dtype=np.intp) for g in groups]
    tgt = [np.asarray(t, dtype=np.float64) for t in targets]

    def softmax(theta, members):
        e = np.exp(theta[members] - theta[members].max())
        return e / e.sum()

    def loglik(theta):
        return sum(
            float(np.dot(t, np.log(np.maximum(softmax(theta, m), luce.SIGMA_FLOOR))))
            for m, t in zip(idx, tgt, strict=True)
        )

    theta, counts = np.zeros(n), np.zeros(n)
    for m, t in zip(idx, tgt, strict=True):
        np.add.at(theta, m, np.log(np.maximum(t, luce.TARGET_FLOOR)))
        np.add.at(counts, m, 1.0)
    theta = np.divide(theta, counts, out=np.zeros(n), where=counts > 0)
    f = loglik(theta)
    for _ in range(luce.MAX_ITERATIONS):
        grad, h = np.zeros(n), np.zeros((n, n))
        for m, t in zip(idx, tgt, strict=True):
            s = softmax(theta, m)
            np.add.at(grad, m, t - s)
            h[np.ix_(m, m)] -= np.outer(s, s)
            h[m, m] += s
        if np.max(np.abs(grad)) < luce.GRADIENT_TOLERANCE:
            break
        h[np.diag_indices(n)] += luce.RIDGE
        try:
            lower = np.linalg.cholesky(h)
            step = np.linalg.solve(lower.T, np.linalg.solve(lower, grad))
        except np.linalg.LinAlgError:
            step = grad
        size = 1.0
        while True:
            candidate = theta + size * step
            fc = loglik(candidate)
            if fc >= f - luce.ACCEPT_SLACK or size < luce.MIN_STEP:
                break
            size /= 2
        theta, f = candidate, fc
    e = np.exp(theta - theta.max())
    return e / e.sum()


def request(questions: int, state: str, options: int = 255) -> dict:
    criteria = {f"o{i}": f"{EN[i % len(EN)]} {i}" for i in range(options)}
    qs = {
        f"q{k}": {"type": "choice", "instructions": f"Which one? ({k})", "criteria": criteria} for k in range(questions)
    }
    return {"model": "m", "state": state, "questions": qs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--questions", type=int, default=40)
    ap.add_argument("--before-runs", type=int, default=None, help="runs of the old fit (default: --runs)")
    ap.add_argument("--out", default="bench/results/large_choice_fit.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = ModelDir.load(synth_model(Path(tmp) / "demo", "demo", seed=0))
        pipeline = Pipeline(model, TorchBackend.load(model))
        busy = Pipeline(model, TorchBackend.load(model))  # torch busy on another request, same process
        state = state_of_tokens(model.tokenizer, 200, "en", seed=0)
        req = parse_systemone(request(a.questions, state), lambda m: m)
        other_state = state_of_tokens(model.tokenizer, 400, "en", seed=1)
        other = parse_systemone(request(8, other_state, options=10), lambda m: m)  # no fit of its own
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                busy.decide(other)

        fit_seconds = [0.0]
        results = {}
        answers = {}
        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        try:
            for name, fit in (("before (dense, LAPACK)", dense_fit), ("after (Woodbury, no BLAS)", luce.fit)):

                def timed(*args, fit=fit, **kwargs):
                    t = time.perf_counter()
                    try:
                        return fit(*args, **kwargs)
                    finally:
                        fit_seconds[0] += time.perf_counter() - t

                large_choice.fit = timed
                pipeline.decide(req)  # warm-up
                walls, fits = [], []
                runs = a.runs if fit is luce.fit or a.before_runs is None else a.before_runs
                for _ in range(runs):
                    fit_seconds[0] = 0.0
                    t0 = time.perf_counter()
                    response = pipeline.decide(req)
                    walls.append(time.perf_counter() - t0)
                    fits.append(fit_seconds[0])
                answers[name] = response
                results[name] = {"request_s": walls, "fit_s": fits}
        finally:
            stop.set()
            thread.join()
            large_choice.fit = luce.fit
    names = list(results)
    diff = max(
        abs(p - q)
        for qa, qb in zip(answers[names[0]].answers.values(), answers[names[1]].answers.values(), strict=True)
        for p, q in zip(qa.probabilities.values(), qb.probabilities.values(), strict=True)
    )
    print(
        f"\ndemo model, {a.questions} x 255 options, {a.runs} runs, torch busy on another request "
        f"({torch.get_num_threads()} threads), load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| fit | request median | request max | fits median | fits max |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        w, f = r["request_s"], r["fit_s"]
        print(
            f"| {name} | {statistics.median(w):.2f} s | {max(w):.2f} s | {statistics.median(f):.3f} s | "
            f"{max(f):.3f} s |"
        )
    ratio = statistics.median(results[names[0]]["fit_s"]) / statistics.median(results[names[1]]["fit_s"])
    print(f"\nfits: after is {ratio:.1f}x faster (median); largest probability difference {diff:.1e}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(
        json.dumps(
            {
                "runs": a.runs,
                "questions": a.questions,
                "results": results,
                "fit_speedup_median": ratio,
                "max_probability_diff": diff,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
