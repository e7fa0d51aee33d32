"""Every answer type of both dialects, as they go on the wire; field order follows the live API and the upstream
engine. msgspec structs: the response encoder writes them without a copy."""

from __future__ import annotations

from typing import Any

import msgspec


class EvidenceSpan(msgspec.Struct):
    """One span of the answer's `evidence` list: code-point offsets into the request's state text."""

    text: str
    start: int
    end: int
    probability: float


Evidence = list[EvidenceSpan] | msgspec.UnsetType  # the answer field; unset (absent) unless the question asked


class ActAnswer(msgspec.Struct, tag_field="type", tag="act", kw_only=True):
    """Key order: type, action, expected_costs, answer, probabilities, confidence, [max_error | refused],
    calibration, [evidence]."""

    action: Any
    expected_costs: dict[str, float]
    answer: str
    probabilities: dict[str, float]
    confidence: float
    max_error: str | msgspec.UnsetType = msgspec.UNSET
    refused: Any = msgspec.UNSET
    calibration: str
    evidence: Evidence = msgspec.UNSET


class MultiAnswer(msgspec.Struct, tag_field="type", tag="multi"):
    """Key order of both dialects: type, selected, probabilities, threshold, set_confidence."""

    selected: list[str]
    probabilities: dict[str, float]
    threshold: float
    set_confidence: float


Probabilities = dict[str, float]


class NoulAnswer(msgspec.Struct, tag_field="type", tag="noul"):
    noul: float
    evidence: Evidence = msgspec.UNSET


class ChoiceAnswer(msgspec.Struct, tag_field="type", tag="choice"):
    choice: str
    confidence: float
    probabilities: Probabilities
    evidence: Evidence = msgspec.UNSET


class ScoreAnswer(msgspec.Struct, tag_field="type", tag="score"):
    score: float
    confidence: float
    legend: dict[str, Any]
    probabilities: Probabilities
    evidence: Evidence = msgspec.UNSET


class Usage(msgspec.Struct):
    input_tokens: int
    output_tokens: int = 0


class SystemOneResponse(msgspec.Struct):
    model: str
    answers: dict[str, NoulAnswer | ChoiceAnswer | ScoreAnswer | MultiAnswer | ActAnswer]
    usage: Usage


class BasalNoulAnswer(msgspec.Struct, tag_field="type", tag="noul"):
    noul: float
    probabilities: Probabilities
    confidence: float
    evidence: Evidence = msgspec.UNSET


class BasalChoiceAnswer(msgspec.Struct, tag_field="type", tag="choice"):
    choice: str
    probabilities: Probabilities
    confidence: float
    evidence: Evidence = msgspec.UNSET


class BasalScoreAnswer(msgspec.Struct, tag_field="type", tag="score"):
    score: float
    legend: dict[str, Any]
    probabilities: Probabilities
    confidence: float
    evidence: Evidence = msgspec.UNSET


class BasalUsage(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    questions: int
    branches: int
    latency_ms: float
    # prompt tokens read from the state cache (as OpenAI's `cached_tokens`); only where the state cache is on
    cached_tokens: int | msgspec.UnsetType = msgspec.UNSET


class BasalResponse(msgspec.Struct):
    model: str
    answers: dict[str, BasalNoulAnswer | BasalChoiceAnswer | BasalScoreAnswer | MultiAnswer | ActAnswer]
    usage: BasalUsage
