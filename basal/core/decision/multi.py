"""`multi` questions (docs/extensions.md §3): one yes/no branch per label, then the labels whose P(yes) passes.

Every label is asked as its own yes/no readout about the same state (so all branches share the state in the prefix
tree), calibrated with the noul temperature. Selection is pure host math, float64, in criteria order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from basal.core.decision.answers import MultiAnswer
from basal.core.request.extensions import MultiSpec


def select(p_yes: Mapping[str, float], spec: MultiSpec) -> list[str]:
    """Keys by P descending (stable), those ≥ threshold, cut to `max`, then filled up to `min`."""
    order = sorted(p_yes, key=lambda k: p_yes[k], reverse=True)  # sorted() is stable, reverse keeps ties in order
    selected = [k for k in order if p_yes[k] >= spec.threshold]
    if spec.max is not None:
        selected = selected[: max(spec.max, 0) if spec.clamp_negative else spec.max]
    if spec.min is not None and len(selected) < spec.min:
        selected = order[: spec.min]
    return selected


def set_confidence(p_yes: Mapping[str, float], selected: Sequence[str]) -> float:
    """Π over all labels in criteria order, left to right from 1.0: P if selected else 1 − P."""
    chosen = set(selected)
    product = 1.0
    for k, p in p_yes.items():
        product *= p if k in chosen else 1.0 - p
    return product


def multi_answer(p_yes: Mapping[str, float], spec: MultiSpec) -> MultiAnswer:
    probabilities = {k: float(p_yes[k]) for k in spec.keys}
    selected = select(probabilities, spec)
    return MultiAnswer(selected, probabilities, float(spec.threshold), set_confidence(probabilities, selected))
