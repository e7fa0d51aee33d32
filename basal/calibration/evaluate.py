"""`basal eval`'s numbers: labelled readouts under a calibration -> metrics overall, per type, per label, the
reliability bins, the accuracy–coverage curve, confusion matrices per choice question, and a paired comparison
(`metrics.py` computes; this module only groups the answers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from basal.calibration import metrics
from basal.calibration.collect import Observed
from basal.core.decision.distribution import calibrate
from basal.core.model.model_dir import Calibration

CURVE_POINTS = 200  # points of the accuracy–coverage curve kept in the report


def calibrated(observed: Sequence[Observed], calibration: Calibration) -> list[np.ndarray]:
    """Each readout's answer under `calibration`: the server's own function on the server's own p_avg."""
    return [calibrate(o.p_avg, calibration.temperature(o.readout.type)) for o in observed]


def _gold(observed: Sequence[Observed]) -> np.ndarray:
    return np.array([o.readout.gold for o in observed], dtype=np.int64)


def evaluate(observed: Sequence[Observed], probs: Sequence[np.ndarray]) -> dict[str, Any]:
    gold = _gold(observed)
    out: dict[str, Any] = {"overall": metrics.summary(probs, gold), "by_type": {}, "by_label": {}}
    conf = metrics.confidences(probs)
    hit = (metrics.decisions(probs) == gold).astype(np.float64)
    out["reliability"] = {"all": [asdict(b) for b in metrics.equal_mass_bins(conf, hit)]}
    out["coverage"] = {"all": _curve(conf, hit)}
    for t in sorted({o.readout.type for o in observed}):
        idx = [i for i, o in enumerate(observed) if o.readout.type == t]
        p, g = [probs[i] for i in idx], gold[idx]
        out["by_type"][t] = metrics.summary(p, g)
        out["reliability"][t] = [asdict(b) for b in metrics.equal_mass_bins(conf[idx], hit[idx])]
        out["coverage"][t] = _curve(conf[idx], hit[idx])
        for key in sorted({k for i in idx for k in observed[i].readout.keys}):
            having = [i for i in idx if key in observed[i].readout.keys]
            pos = [observed[i].readout.keys.index(key) for i in having]
            # one-vs-rest over the answers that offered this label: its probability vs whether it was gold
            p_key = np.array([probs[i][j] for i, j in zip(having, pos, strict=True)])
            is_gold = np.array([gold[i] == j for i, j in zip(having, pos, strict=True)])
            chosen = np.array([int(np.argmax(probs[i])) == j for i, j in zip(having, pos, strict=True)])
            out["by_label"][f"{t}:{key}"] = metrics.one_vs_rest(p_key, is_gold, chosen)
    out["confusion"] = confusions(observed, probs)
    return out


def _curve(conf: np.ndarray, hit: np.ndarray) -> list[dict[str, float]]:
    coverage, acc, threshold = metrics.coverage_curve(conf, hit)
    keep = np.unique(np.linspace(0, len(coverage) - 1, min(CURVE_POINTS, len(coverage))).round().astype(np.int64))
    return [{"coverage": float(coverage[i]), "accuracy": float(acc[i]), "threshold": float(threshold[i])} for i in keep]


def confusions(observed: Sequence[Observed], probs: Sequence[np.ndarray]) -> dict[str, Any]:
    """Per choice question (its name and options): gold x decided counts."""
    by: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for i, o in enumerate(observed):
        if o.readout.type == "choice" and o.readout.label is None:
            by.setdefault((o.readout.question, o.readout.keys), []).append(i)
    out = {}
    for (name, keys), idx in sorted(by.items()):
        shown = name if sum(n == name for n, _ in by) == 1 else f"{name} ({', '.join(keys)})"
        gold = np.array([observed[i].readout.gold for i in idx])
        decided = metrics.decisions([probs[i] for i in idx])
        out[shown] = {"keys": list(keys), "matrix": metrics.confusion(gold, decided, len(keys)).tolist()}
    return out


def readout_key(o: Observed) -> tuple[str, str, str]:
    return (o.line.id, o.readout.question, o.readout.label or "")


def compare(
    a: Sequence[Observed],
    pa: Sequence[np.ndarray],
    b: Sequence[Observed],
    pb: Sequence[np.ndarray],
    reps: int = 1000,
) -> dict[str, Any]:
    """Paired comparison over the readouts both sides answered (matched by line id, question and label): metric
    deltas (b - a) with group-bootstrap intervals, and every readout whose decision flips."""
    index_b = {readout_key(o): i for i, o in enumerate(b)}
    pairs = [(i, index_b[readout_key(o)]) for i, o in enumerate(a) if readout_key(o) in index_b]
    if not pairs:
        raise ValueError("the two runs have no labelled question in common (matched by line id and question name)")
    ia, ib = [i for i, _ in pairs], [j for _, j in pairs]
    gold = _gold([a[i] for i in ia])
    other_gold = _gold([b[j] for j in ib])
    if not np.array_equal(gold, other_gold):
        raise ValueError("the two runs disagree on gold answers of the same questions")
    p1, p2 = [pa[i] for i in ia], [pb[j] for j in ib]
    deltas = metrics.paired_bootstrap(p1, p2, gold, [a[i].line.group for i in ia], reps)
    d1, d2 = metrics.decisions(p1), metrics.decisions(p2)
    flips = []
    for n, (i, j) in enumerate(pairs):
        if d1[n] != d2[n]:
            o, keys = a[i], a[i].readout.keys
            flips.append(
                {
                    "line": o.line.number,
                    "id": o.line.id,
                    "question": o.readout.question + (f"/{o.readout.label}" if o.readout.label else ""),
                    "gold": keys[gold[n]],
                    "a": keys[d1[n]],
                    "b": b[j].readout.keys[d2[n]],
                    "a_confidence": float(np.max(p1[n])),
                    "b_confidence": float(np.max(p2[n])),
                }
            )
    return {"paired": len(pairs), "metrics": deltas, "flips": flips}
