"""`basal eval --cascade`'s numbers: a two-step cascade against each of its models alone, and the first step's
threshold swept offline.

The sweep needs no more runs: a question's answer under threshold t is the first model's own answer when its
confidence (the largest calibrated probability) is at least t, else the second model's own answer — what the
cascade serves, since each answer is bitwise the answering model's alone. Cost at t is estimated per decision as the
first model's plus the escalated share of the second's (tokens and seconds per decision of each model alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from basal.calibration import metrics
from basal.calibration.collect import Observed, read_records
from basal.calibration.evaluate import readout_key
from basal.calibration.labelled import Labelled
from basal.core.decision.distribution import calibrate

SWEEP_POINTS = 200  # thresholds kept in the report (quantiles of the first model's confidences)
ABOVE_ONE = 1.01  # a threshold no confidence reaches: every question escalates


def served(observed: Sequence[Observed]) -> list[np.ndarray]:
    """Each readout's answer as served: the temperature its own model applied (a cascade mixes two calibrations)."""
    return [calibrate(o.p_avg, o.served_temperature) for o in observed]


def aligned(first: Sequence[Observed], other: Sequence[Observed]) -> list[Observed]:
    """`other`'s readouts in `first`'s order (matched by line id, question and label)."""
    index = {readout_key(o): o for o in other}
    if len(first) != len(other) or any(readout_key(o) not in index for o in first):
        raise ValueError("the cascade and its models did not answer the same labelled questions")
    return [index[readout_key(o)] for o in first]


def at_threshold(p1: Sequence[np.ndarray], p2: Sequence[np.ndarray], t: float) -> tuple[list[np.ndarray], np.ndarray]:
    """The answers a cascade escalating below confidence `t` gives, and which readouts it escalated."""
    up = metrics.confidences(p1) < t
    return [b if u else a for a, b, u in zip(p1, p2, up, strict=True)], up


def cost(observed: Sequence[Observed], labelled: Labelled, records: Path, seconds: float | None) -> dict[str, Any]:
    """Tokens per decision (the requests' `usage.input_tokens`, each distinct request once) and seconds per decision
    (the run's wall time; None when the run resumed from records, so it did not answer everything)."""
    keys = {line.key for line in labelled.lines}
    tokens = 0
    for _status, body in read_records(records, keys).values():
        tokens += int(msgspec.json.decode(body)["usage"]["input_tokens"])
    n = len(observed)
    return {"tokens_per_decision": tokens / n, "seconds_per_decision": None if seconds is None else seconds / n}


def sweep(
    p1: Sequence[np.ndarray], p2: Sequence[np.ndarray], gold: np.ndarray, c1: dict[str, Any], c2: dict[str, Any]
) -> list[dict[str, Any]]:
    """Accuracy and estimated cost at candidate thresholds from 0 (the first model alone) to above 1 (the second
    alone); `pareto` marks the points no other beats on accuracy without escalating more."""
    conf = np.unique(metrics.confidences(p1))
    # midway between neighbouring confidences: no threshold sits on an answer's confidence, where the last bit of
    # how it was computed (here or in the server) would decide the side
    middles = (conf[:-1] + conf[1:]) / 2
    keep = np.unique(np.linspace(0, len(middles) - 1, min(SWEEP_POINTS, len(middles))).round().astype(np.int64))
    candidates = [0.0, *(float(c) for c in middles[keep]), ABOVE_ONE] if len(middles) else [0.0, ABOVE_ONE]
    points, best = [], -1.0
    for t in candidates:
        answers, up = at_threshold(p1, p2, t)
        share = float(up.mean())
        if points and share == points[-1]["escalated"]:
            continue
        accuracy = metrics.accuracy(answers, gold)
        point = {"threshold": t, "escalated": share, "accuracy": accuracy}
        for key in ("tokens_per_decision", "seconds_per_decision"):
            a, b = c1[key], c2[key]
            point[key] = None if a is None or b is None else a + share * b
        point["pareto"] = accuracy > best
        best = max(best, accuracy)
        points.append(point)
    return points


def pareto_front(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in points if p["pareto"]]


def cascade_section(
    name: str,
    steps: list[dict[str, Any]],
    runs: dict[str, tuple[list[Observed], dict[str, Any]]],
) -> dict[str, Any]:
    """The report's `cascade` part. `runs`: the cascade's name and each model's -> (observed, cost), the cascade's
    first; every run answered the same labelled readouts."""
    cascade_observed = runs[name][0]
    small, large = steps[0]["model"], steps[1]["model"]
    o1 = aligned(cascade_observed, runs[small][0])
    o2 = aligned(cascade_observed, runs[large][0])
    gold = np.array([o.readout.gold for o in cascade_observed], dtype=np.int64)
    rows = {}
    for who, (observed, c) in runs.items():
        rows[who] = {**metrics.summary(served(aligned(cascade_observed, observed)), gold), **c}
    # who answered: the cascade's readout is bitwise one model's own (the first when both agree, as it keeps those)
    by_first = [np.array_equal(c.p_avg, a.p_avg) for c, a in zip(cascade_observed, o1, strict=True)]
    by_second = [
        not f and np.array_equal(c.p_avg, b.p_avg) for c, b, f in zip(cascade_observed, o2, by_first, strict=True)
    ]
    n = len(cascade_observed)
    share = {small: sum(by_first) / n, large: sum(by_second) / n}
    points = sweep(served(o1), served(o2), gold, runs[small][1], runs[large][1])
    return {
        "name": name,
        "steps": steps,
        "rows": rows,
        "answered": share,
        "unmatched": n - sum(by_first) - sum(by_second),
        "sweep": points,
        "pareto": pareto_front(points),
    }
