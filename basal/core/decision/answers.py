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
    answered_by: str | msgspec.UnsetType = msgspec.UNSET  # a cascade's answer (native dialect): which model gave it


class MultiAnswer(msgspec.Struct, tag_field="type", tag="multi"):
    """Key order of both dialects: type, selected, probabilities, threshold, set_confidence."""

    selected: list[str]
    probabilities: dict[str, float]
    threshold: float
    set_confidence: float
    answered_by: str | msgspec.UnsetType = msgspec.UNSET  # a cascade's answer (native dialect): which model gave it


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
    answered_by: str | msgspec.UnsetType = msgspec.UNSET  # a cascade's answer (native dialect): which model gave it


class BasalChoiceAnswer(msgspec.Struct, tag_field="type", tag="choice"):
    choice: str
    probabilities: Probabilities
    confidence: float
    evidence: Evidence = msgspec.UNSET
    answered_by: str | msgspec.UnsetType = msgspec.UNSET  # a cascade's answer (native dialect): which model gave it


class BasalScoreAnswer(msgspec.Struct, tag_field="type", tag="score"):
    score: float
    legend: dict[str, Any]
    probabilities: Probabilities
    confidence: float
    evidence: Evidence = msgspec.UNSET
    answered_by: str | msgspec.UnsetType = msgspec.UNSET  # a cascade's answer (native dialect): which model gave it


class StepUsage(msgspec.Struct):
    """One step of a cascade: the questions sent to its model, those it answered (kept), what it cost."""

    model: str
    questions: int
    answered: int
    input_tokens: int
    latency_ms: float


class BasalUsage(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    questions: int
    branches: int
    latency_ms: float
    steps: list[StepUsage] | msgspec.UnsetType = msgspec.UNSET  # a cascade's steps, in order
    # prompt tokens read from the state cache (as OpenAI's `cached_tokens`); only where the state cache is on
    cached_tokens: int | msgspec.UnsetType = msgspec.UNSET


class BasalResponse(msgspec.Struct):
    model: str
    answers: dict[str, BasalNoulAnswer | BasalChoiceAnswer | BasalScoreAnswer | MultiAnswer | ActAnswer]
    usage: BasalUsage
