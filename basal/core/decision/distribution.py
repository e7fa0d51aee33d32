"""Decision math (docs/contract.md §2): letter logits of every option order -> calibrated distribution -> answer.

Host math is float64 throughout; probabilities are returned at full precision (no rounding).

    per order:  p_pos = softmax(letter logits)            over the k letters only
    un-permute: canon[perm[pos]] = p_pos[pos]
    average:    p_avg = mean over orders                   (of probabilities, not logits)
    calibrate:  p_cal = softmax(log(max(p_avg, 1e-12)) / T), T per question type; T == 1 -> unchanged
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FLOOR = 1e-12


def softmax(x: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def unpermute(p_pos: np.ndarray, perm: Sequence[int]) -> np.ndarray:
    """Probabilities by letter position -> probabilities by canonical option index."""
    canon = np.empty_like(p_pos)
    canon[np.asarray(perm)] = p_pos
    return canon


def calibrate(p: np.ndarray, temperature: float) -> np.ndarray:
    if temperature == 1.0:
        return p
    return softmax(np.log(np.maximum(p, FLOOR)) / temperature)


@dataclass(frozen=True, slots=True)
class Distribution:
    probs: list[np.ndarray]  # per order, by letter position
    p_avg: np.ndarray  # canonical option order
    p_cal: np.ndarray  # canonical option order, calibrated

    @property
    def argmax(self) -> int:
        return int(np.argmax(self.p_cal))  # first maximum wins, as Python's max


def distribution(
    letter_logits: Sequence[Sequence[float]], perms: Sequence[Sequence[int]], temperature: float
) -> Distribution:
    """Letter logits of each option order (float32 from the backend) -> the question's distribution."""
    if len(letter_logits) != len(perms):
        raise ValueError(f"{len(letter_logits)} logit rows for {len(perms)} option orders")
    probs = [softmax(lg) for lg in letter_logits]
    p_avg = sum(unpermute(p, perm) for p, perm in zip(probs, perms, strict=True)) / len(perms)
    return Distribution(probs, p_avg, calibrate(p_avg, temperature))


def certain(k: int = 1) -> Distribution:
    """A question with a single option: probability 1, the model is not run."""
    one = np.ones(k, dtype=np.float64)
    return Distribution([], one, one)


def normalize(p: np.ndarray) -> np.ndarray:
    total = p.sum()
    return p / total if total > 0 else np.full(len(p), 1.0 / len(p))


def choice_confidence(p: np.ndarray) -> float:
    """TypeSafe: how far the top option stands above a uniform guess, (max p - 1/n) / (1 - 1/n)."""
    n = len(p)
    if n == 1:
        return 1.0
    q = normalize(p)
    return float(min(1.0, max(0.0, (q.max() - 1.0 / n) / (1.0 - 1.0 / n))))


def score_confidence(p: np.ndarray) -> float:
    """TypeSafe: 1 - (mean distance from the most probable level) / (that of uniform levels about the centre)."""
    n = len(p)
    if n == 1:
        return 1.0
    q = normalize(p)
    levels = np.arange(n, dtype=np.float64)
    spread = float(np.sum(q * np.abs(levels - int(np.argmax(q)))))
    uniform = float(np.sum(np.abs(levels - (n - 1) / 2.0))) / n
    return max(0.0, 1.0 - spread / uniform)


def expected_level(p: np.ndarray) -> float:
    """Score = sum of i * p_i, summed in level order as upstream does."""
    return float(sum(i * float(v) for i, v in enumerate(p)))


# ---------------------------------------------------------------------------------------------------------------
# Answers in each dialect (docs/contract.md §2.3)


# ---------------------------------------------------------------------------------------------------------------
# Extension answers (docs/extensions.md §3–§4): the same in both dialects
