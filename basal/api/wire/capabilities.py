"""What a served model answers, as `GET /v1/models` describes it (one place for every extension to extend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from basal.core.engine.front import ModelInfo
from basal.core.model.prompt import MAX_OPTIONS
from basal.core.request.dialects import MAX_CHOICES, MAX_LEVELS
from basal.core.request.extensions import MAX_LABELS

QUESTION_TYPES = ("choice", "noul", "score", "multi", "act")
# What each endpoint accepts, as its parser enforces it (tests/api/test_models_ranges.py sends every bound and one
# past it): TypeSafe answers one option or level with p = 1 and asks 11..255 choices in groups; upstream's dialect
# keeps 2..10 everywhere. An act without criteria is a yes/no readout on both.
OPTION_RANGES = {
    "/v1/systemone": {
        "choice": f"1..{MAX_CHOICES}",
        "score": f"1..{MAX_LEVELS}",
        "act": f"1..{MAX_OPTIONS}",
        "multi_labels": f"1..{MAX_LABELS}",
    },
    "/v1/basal": {
        "choice": f"2..{MAX_OPTIONS}",
        "score": f"2..{MAX_OPTIONS}",
        "act": f"2..{MAX_OPTIONS}",
        "multi_labels": f"1..{MAX_LABELS}",
    },
}
ORDERS = 2  # every question is asked in two option orders (the native SDK's discovery field)


def capabilities(info: ModelInfo) -> dict[str, Any]:
    """Question types, option counts and extensions of one model. Without `evidence` a question asking for it gets
    the dialect's "no evidence head" refusal."""
    served = {
        "types": list(QUESTION_TYPES),
        "options": OPTION_RANGES,
        "evidence": info.serves_evidence,
        "calibrated": bool(info.calibration.temperatures),
        "certified_max_error": sorted(info.calibration.thresholds),
        "orders": ORDERS,
        "temperature_per_prim": dict(info.calibration.temperatures),
        "calibration": served_calibration(info),
    }
    if info.cascade:  # a cascade's name: its models in order and when each sends a question on
        served["cascade"] = {"steps": list(info.cascade)}
    return served


def served_calibration(info: ModelInfo) -> dict[str, Any]:
    """Which calibration answers and `max_error` use: its kind, file name, identity (sha256 of the file: a cached
    answer keyed on it cannot outlive a reload), thresholds and, for one `basal calibrate` wrote, its provenance."""
    c = info.calibration
    return {
        "kind": c.kind,
        "file": Path(c.path).name if c.path else None,
        "sha256": c.sha256 or None,
        "thresholds": c.thresholds,
        "provenance": c.provenance,
    }
