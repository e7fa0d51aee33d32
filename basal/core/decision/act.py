"""`act` questions (docs/extensions.md §4): a readout, then the action of minimum expected cost.

    E[a]   = Σ_z p(z) · C[a][z]          summed from 0 in the row's own key order (upstream's order)
    action = argmin E (first row wins a tie);  expected_costs = round(E, 6) (Python's correctly rounded round)
    refusal: with `max_error`, below the certified confidence of CALIBRATION.json the defer action replaces it

Host math is float64 throughout (as the Rust engine); upstream hands float32-rounded probabilities to this step,
so probabilities can differ from upstream's in the ~1e-7 range (decisions only at exact ties and thresholds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from basal.core.decision.answers import ActAnswer
from basal.core.request.extensions import ActSpec

NO_THRESHOLD = "no certified threshold for this target"
NEEDS_DEFER = 'max_error needs a defer action ("defer"/"human" or defer_action)'


class NeedsDeferAction(Exception):
    """A refusal is required but the question has no defer action; each dialect words the HTTP error."""


def expected_cost(p: Mapping[str, float], row: tuple[tuple[str, float], ...]) -> float:
    total: float = 0  # upstream's sum() starts from the integer 0
    for z, c in row:
        total += p[z] * c
    return total


def certified_confidence(thresholds: Mapping[str, Any], key: str) -> float | None:
    """``thresholds[key]["confidence"]`` if it is a number; anything missing or malformed: none."""
    entry = thresholds.get(key) if isinstance(thresholds, Mapping) else None
    value = entry.get("confidence") if isinstance(entry, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def choose_action(
    p: Mapping[str, float], spec: ActSpec, thresholds: Mapping[str, Any], temperatures_present: bool
) -> ActAnswer:
    """Probabilities by outcome (canonical order) -> the act answer. Raises NeedsDeferAction."""
    probabilities = {z: float(p[z]) for z in spec.outcomes}
    costs = [(action, expected_cost(probabilities, row)) for action, row in spec.rows]
    action = min(costs, key=lambda ac: ac[1])[0]  # min keeps the first of equal costs
    confidence = max(probabilities.values())
    answer = max(probabilities, key=lambda z: probabilities[z])  # first maximum
    extra: dict[str, Any] = {}
    if spec.max_error_key is not None:
        # several targets (a list): each must be certified, and the answer must meet the strictest of them
        certified = [certified_confidence(thresholds, k) for k in spec.max_error_keys or (spec.max_error_key,)]
        threshold = None if None in certified else max(c for c in certified if c is not None)
        if threshold is None:
            extra["max_error"] = NO_THRESHOLD
        elif confidence < threshold and action != spec.defer_action:
            if spec.defer_action is None:
                raise NeedsDeferAction(NEEDS_DEFER)
            extra["refused"], action = action, spec.defer_action
    return ActAnswer(
        action=action,
        expected_costs={str(a): round(e, 6) for a, e in costs},
        answer=answer,
        probabilities=probabilities,
        confidence=confidence,
        calibration="validated" if temperatures_present and spec.validated_readout else "unvalidated",
        **extra,
    )
