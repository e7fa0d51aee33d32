"""What a served model answers, as `GET /v1/models` describes it (one place for every extension to extend)."""

from __future__ import annotations

from typing import Any

from basal.core.engine.engines import ModelInfo
from basal.core.model.prompt import MAX_OPTIONS

QUESTION_TYPES = ("choice", "noul", "score", "multi", "act")


def capabilities(info: ModelInfo) -> dict[str, Any]:
    """Question types, option counts and extensions of one model. Without `evidence` a question asking for it gets
    the dialect's "no evidence head" refusal."""
    return {
        "types": list(QUESTION_TYPES),
        "options": {"choice": f"2..{MAX_OPTIONS}", "score": f"1..{MAX_OPTIONS}", "act": f"2..{MAX_OPTIONS}"},
        "multi_labels": "1..",
        "evidence": info.serves_evidence,
        "calibrated": bool(info.calibration.temperatures),
        "certified_max_error": sorted(info.calibration.thresholds),
    }
