"""What a served model answers, as `GET /v1/models` describes it (one place for every extension to extend)."""

from __future__ import annotations

from typing import Any

from basal.core.model_dir import ModelDir
from basal.core.prompt import MAX_OPTIONS

QUESTION_TYPES = ("choice", "noul", "score", "multi", "act")


def capabilities(model: ModelDir, evidence: bool = False) -> dict[str, Any]:
    """Question types, option counts and extensions of one model.

    `evidence`: the model serves `evidence: true` (it has an ``evidence_head.pt`` and its backend reads hidden
    states); without it a question asking for evidence gets the dialect's "no evidence head" refusal."""
    return {
        "types": list(QUESTION_TYPES),
        "options": {"choice": f"2..{MAX_OPTIONS}", "score": f"1..{MAX_OPTIONS}", "act": f"2..{MAX_OPTIONS}"},
        "multi_labels": "1..",
        "evidence": evidence,
        "calibrated": bool(model.calibration.temperatures),
        "certified_max_error": sorted(model.calibration.thresholds),
    }
