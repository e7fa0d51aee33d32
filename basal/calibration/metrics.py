"""Metrics of calibrated answers against gold answers, in plain numpy (no basal types): accuracy, log-loss, Brier,
expected calibration error with equal-mass bins, reliability bins, the accuracy–coverage curve, confusion matrices
and paired comparisons with a group bootstrap. Reusable by any report that has probabilities and gold answers.

Conventions: `probs` is a list of 1-D arrays (one per answer, options in its own order), `gold` the gold index of
each; the decision is the first most probable option; confidence is the largest probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FLOOR = 1e-12  # as the decision math floors probabilities before a log
BINS = 10


def decisions(probs: Sequence[np.ndarray]) -> np.ndarray:
    return np.array([int(np.argmax(p)) for p in probs], dtype=np.int64)


def confidences(probs: Sequence[np.ndarray]) -> np.ndarray:
    return np.array([float(np.max(p)) for p in probs], dtype=np.float64)


def accuracy(probs: Sequence[np.ndarray], gold: np.ndarray) -> float:
    return float(np.mean(decisions(probs) == gold)) if len(gold) else float("nan")


def log_loss(probs: Sequence[np.ndarray], gold: np.ndarray) -> float:
    """Mean -log p[gold] (p floored at 1e-12)."""
    if not len(gold):
        return float("nan")
    return float(np.mean([-np.log(max(float(p[g]), FLOOR)) for p, g in zip(probs, gold, strict=True)]))


def brier(probs: Sequence[np.ndarray], gold: np.ndarray) -> float:
    """Mean over answers of sum_k (p_k - [k == gold])^2 (0 perfect, 2 the worst)."""
    if not len(gold):
        return float("nan")
    total = 0.0
    for p, g in zip(probs, gold, strict=True):
        onehot = np.zeros(len(p))
        onehot[g] = 1.0
        total += float(np.sum((np.asarray(p) - onehot) ** 2))
    return total / len(gold)


@dataclass(frozen=True)
class Bin:
    count: int
    confidence: float  # mean predicted probability in the bin
    accuracy: float  # share of those that came true
    low: float  # the bin's smallest and largest confidence
    high: float


def equal_mass_bins(conf: np.ndarray, hit: np.ndarray, bins: int = BINS) -> list[Bin]:
    """Answers sorted by confidence and cut into `bins` bins of (nearly) equal count (fewer when fewer answers)."""
    if not len(conf):
        return []
    order = np.argsort(conf, kind="stable")
    out = []
    for idx in np.array_split(order, min(bins, len(conf))):
        c, h = conf[idx], hit[idx]
        out.append(Bin(len(idx), float(c.mean()), float(h.mean()), float(c.min()), float(c.max())))
    return out


def ece(conf: np.ndarray, hit: np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error: sum over equal-mass bins of (share of answers) x |accuracy - confidence|."""
    n = len(conf)
    if not n:
        return float("nan")
    return float(sum(b.count / n * abs(b.accuracy - b.confidence) for b in equal_mass_bins(conf, hit, bins)))


def top_label_ece(probs: Sequence[np.ndarray], gold: np.ndarray, bins: int = BINS) -> float:
    """ECE of the decisions: confidence = max p, hit = the decision is the gold answer."""
    return ece(confidences(probs), (decisions(probs) == gold).astype(np.float64), bins)


def summary(probs: Sequence[np.ndarray], gold: np.ndarray, bins: int = BINS) -> dict[str, float]:
    return {
        "count": len(gold),
        "accuracy": accuracy(probs, gold),
        "log_loss": log_loss(probs, gold),
        "brier": brier(probs, gold),
        "ece": top_label_ece(probs, gold, bins),
    }


def one_vs_rest(p: np.ndarray, is_gold: np.ndarray, chosen: np.ndarray, bins: int = BINS) -> dict[str, float]:
    """One label over the answers that offered it: its probability `p` against whether it was the gold answer (ECE,
    Brier), its support, recall (share of its gold answers decided as it) and precision (`chosen`: decided as it)."""
    y = is_gold.astype(np.float64)
    return {
        "support": int(y.sum()),
        "offered": len(y),
        "recall": float(chosen[y == 1].mean()) if y.any() else float("nan"),
        "precision": float(y[chosen].mean()) if chosen.any() else float("nan"),
        "ece": ece(p, y, bins),
        "brier": float(np.mean((p - y) ** 2)) if len(y) else float("nan"),
    }


def coverage_curve(conf: np.ndarray, hit: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keeping the most confident answers first: (coverage, accuracy of those kept, the confidence threshold)."""
    order = np.argsort(-conf, kind="stable")
    kept = np.arange(1, len(conf) + 1)
    return kept / len(conf), np.cumsum(hit[order]) / kept, conf[order]


def confusion(gold: np.ndarray, decided: np.ndarray, k: int) -> np.ndarray:
    """[gold, decided] counts."""
    m = np.zeros((k, k), dtype=np.int64)
    np.add.at(m, (gold, decided), 1)
    return m


def per_answer(probs: Sequence[np.ndarray], gold: np.ndarray) -> dict[str, np.ndarray]:
    """What each metric averages, answer by answer: hit, -log p[gold], Brier term, confidence."""
    ll = np.array([-np.log(max(float(p[g]), FLOOR)) for p, g in zip(probs, gold, strict=True)])
    br = np.array([float(np.sum(np.asarray(p) ** 2)) - 2 * float(p[g]) + 1 for p, g in zip(probs, gold, strict=True)])
    return {
        "hit": (decisions(probs) == gold).astype(np.float64),
        "log_loss": ll,
        "brier": br,
        "conf": confidences(probs),
    }


def _from_answers(x: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, float]:
    return {
        "accuracy": float(x["hit"][idx].mean()),
        "log_loss": float(x["log_loss"][idx].mean()),
        "brier": float(x["brier"][idx].mean()),
        "ece": ece(x["conf"][idx], x["hit"][idx]),
    }


def paired_bootstrap(
    a: Sequence[np.ndarray],
    b: Sequence[np.ndarray],
    gold: np.ndarray,
    groups: Sequence[str],
    reps: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, dict[str, float]]:
    """metric(b) - metric(a) for each metric, with a percentile interval from resampling whole groups (answers of
    one group are not independent) with replacement, the same resample for both sides."""
    names = sorted(set(groups))
    members: dict[str, list[int]] = {g: [] for g in names}
    for i, g in enumerate(groups):
        members[g].append(i)
    xa, xb = per_answer(a, gold), per_answer(b, gold)
    everything = np.arange(len(gold))
    ma, mb = _from_answers(xa, everything), _from_answers(xb, everything)
    rng = np.random.default_rng(seed)
    boots: dict[str, list[float]] = {k: [] for k in ma}
    for _ in range(reps):
        d = np.concatenate([members[names[j]] for j in rng.integers(0, len(names), len(names))]).astype(np.int64)
        ra, rb = _from_answers(xa, d), _from_answers(xb, d)
        for k in boots:
            boots[k].append(rb[k] - ra[k])
    out = {}
    for k in ma:
        lo, hi = np.quantile(boots[k], [(1 - level) / 2, (1 + level) / 2])
        out[k] = {"a": ma[k], "b": mb[k], "delta": mb[k] - ma[k], "low": float(lo), "high": float(hi)}
    return out
