"""The GEMM limit `basal bench` and bench/lab/cpu_speed.py measure: per shape, the fastest call over a window of calls,
and across a run the median measurement (one slow or fast moment must not skew every fraction)."""

from __future__ import annotations

import time

from basal.benchsuite import limits


def test_best_seconds_calls_at_least_reps_and_for_at_least_the_window():
    calls = []

    def fn():
        calls.append(time.perf_counter())
        time.sleep(0.01 if len(calls) != 4 else 0.001)  # one fast call among slow ones

    best = limits._best_seconds(fn, reps=2, sync=lambda: None, min_seconds=0.1)
    assert len(calls) >= 1 + 8 and calls[-1] - calls[1] >= 0.09  # the warm-up, then calls over the window
    assert best < 0.005  # the fast call is the answer


def test_measure_and_best(demo_model):
    cfg = demo_model.config
    one = limits.measure(cfg, "f32", min_seconds=0.05)
    assert set(one.gflops) == {"qkv", "o", "gate_up", "down"} and all(r > 0 for r in one.gflops.values())
    assert min(one.gflops.values()) <= one.combined_gflops <= max(one.gflops.values())
    slow = limits.GemmLimit(one.rows, {k: v / 2 for k, v in one.gflops.items()}, one.combined_gflops / 2, {})
    fast = limits.GemmLimit(one.rows, {k: v * 2 for k, v in one.gflops.items()}, one.combined_gflops * 2, {})
    assert limits.typical([fast, one, slow]) is one and limits.typical([slow, fast]) is slow
    assert one.fraction(one.combined_gflops * 1e9, 2.0) == 0.5
