"""From distributions to the response of each dialect: answers per question type, extension answers, evidence
spans."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec
import numpy as np
from numpy.typing import ArrayLike

from basal.core.decision.act import NeedsDeferAction, choose_action
from basal.core.decision.answers import (
    ActAnswer,
    BasalChoiceAnswer,
    BasalNoulAnswer,
    BasalResponse,
    BasalScoreAnswer,
    BasalUsage,
    ChoiceAnswer,
    EvidenceSpan,
    MultiAnswer,
    NoulAnswer,
    ScoreAnswer,
    SystemOneResponse,
    Usage,
)
from basal.core.decision.distribution import (
    Distribution,
    calibrate,
    certain,
    choice_confidence,
    distribution,
    expected_level,
    score_confidence,
)
from basal.core.decision.evidence import StateTokens, best_spans
from basal.core.decision.multi import multi_answer
from basal.core.model.evidence_head import EvidenceHead
from basal.core.model.model_dir import Calibration
from basal.core.request.extensions import (
    ActSpec,
    MultiSpec,
    evidence_refusal_basal,
    multi_evidence_error_basal,
    needs_defer_error,
)
from basal.core.request.plan import DecisionRequest, Question


def answer_systemone(question: Question, dist: Distribution) -> NoulAnswer | ChoiceAnswer | ScoreAnswer:
    """TypeSafe answer: noul without confidence; choice/score confidence by TypeSafe's formulas."""
    p = dist.p_cal
    keys = question.item.keys
    probabilities = {k: float(v) for k, v in zip(keys, p, strict=True)}
    if question.kind == "noul":
        return NoulAnswer(noul=probabilities["true"])
    if question.kind == "score":
        legend = dict(zip(keys, question.legend, strict=True))
        return ScoreAnswer(expected_level(p), score_confidence(p), legend, probabilities)
    return ChoiceAnswer(keys[dist.argmax], choice_confidence(p), probabilities)


def answer_basal(question: Question, dist: Distribution) -> BasalNoulAnswer | BasalChoiceAnswer | BasalScoreAnswer:
    """Upstream answer: confidence = max p for every type; score legend = the texts shown to the model."""
    p = dist.p_cal
    keys = question.item.keys
    probabilities = {k: float(v) for k, v in zip(keys, p, strict=True)}
    confidence = float(p.max())
    if question.kind == "noul":
        return BasalNoulAnswer(probabilities["true"], probabilities, confidence)
    if question.kind == "score":
        legend = dict(zip(keys, question.legend, strict=True))
        return BasalScoreAnswer(expected_level(p), legend, probabilities, confidence)
    return BasalChoiceAnswer(keys[dist.argmax], probabilities, confidence)


def answer_multi(question: Question, dists: Sequence[Distribution]) -> MultiAnswer:
    """P(yes) of every branch (calibrated with the noul temperature) -> selection."""
    spec = question.spec
    assert isinstance(spec, MultiSpec)
    p_yes = {k: float(d.p_cal[0]) for k, d in zip(spec.keys, dists, strict=True)}  # key "true" is option 0
    return multi_answer(p_yes, spec)


def answer_act(question: Question, dist: Distribution, calibration: Calibration, dialect: str) -> ActAnswer:
    """The readout's distribution -> minimum expected cost, refusal against the certified thresholds."""
    spec = question.spec
    assert isinstance(spec, ActSpec)
    p = {k: float(v) for k, v in zip(question.item.keys, dist.p_cal, strict=True)}
    try:
        return choose_action(p, spec, calibration.thresholds, bool(calibration.temperatures))
    except NeedsDeferAction as e:
        raise needs_defer_error(question.name, dialect, str(e)) from e


# ---------------------------------------------------------------------------------------------------------------
# The response of a request


@dataclass(frozen=True)
class EvidenceInputs:
    """What evidence spans are read from: the model's head (None: the model serves no evidence), and per question
    where its state lies in the order-1 prompt and the final hidden states of those tokens and the readout."""

    head: EvidenceHead | None
    state_tokens: Mapping[str, StateTokens | None]
    states: Mapping[str, ArrayLike]  # [n + 1, d] f32 once read with np.asarray (the engine's are StateRows)


def respond(
    request: DecisionRequest,
    logits: Mapping[str, list[np.ndarray]],
    input_tokens: int,
    latency_ms: float,
    calibration: Calibration,
    joints: Mapping[str, np.ndarray] | None = None,
    evidence: EvidenceInputs | None = None,
) -> SystemOneResponse | BasalResponse:
    """Letter logits per question (joint distributions of large choices) -> the response in the dialect."""
    answers = {}
    for q in request.questions:
        if q.deferred_error is not None:  # upstream: raised while building this answer
            raise q.deferred_error
        if joints and q.name in joints:
            joint = joints[q.name]
            dists = [Distribution([], joint, calibrate(joint, calibration.temperature(q.item.type)))]
        else:
            dists = distributions(q, logits.get(q.name, []), calibration)
        if q.kind == "multi":
            answers[q.name] = answer_multi(q, dists)
        elif q.kind == "act":
            answers[q.name] = answer_act(q, dists[0], calibration, request.dialect)
        else:
            answers[q.name] = (answer_systemone if request.dialect == "systemone" else answer_basal)(q, dists[0])
    if any(q.evidence for q in request.questions):
        add_evidence(request, answers, evidence)
    if request.dialect == "systemone":
        return SystemOneResponse(request.model, answers, Usage(input_tokens))
    n, branches = len(request.questions), sum(q.branch_count for q in request.questions)
    return BasalResponse(request.model, answers, BasalUsage(input_tokens, 0, n, branches, round(latency_ms, 2)))


def add_evidence(request: DecisionRequest, answers: dict, evidence: EvidenceInputs | None) -> None:
    """Append `evidence` to every answer that asked for it. Upstream's order (/v1/basal): after all answers,
    first the head, then multi questions, then the spans. /v1/systemone refused both while parsing."""
    if evidence is None or evidence.head is None:
        raise evidence_refusal_basal()
    asking = [q for q in request.questions if q.evidence]
    for q in asking:
        if q.branches:
            raise multi_evidence_error_basal(q.name)
    for q in asking:
        found, states = evidence.state_tokens.get(q.name), evidence.states.get(q.name)
        spans: list[dict[str, object]] = []
        if found is not None:
            if states is None:
                raise RuntimeError(f"no hidden states were computed for {q.name!r}; this is a bug")
            rows = np.asarray(states)  # [n + 1, d], built for this question only
            ls, le = evidence.head.log_scores(rows[:-1], rows[-1])
            spans = best_spans(q.asked[0].state_text, found.rel, ls, le, request.facts_limit)
        answers[q.name] = msgspec.structs.replace(answers[q.name], evidence=[EvidenceSpan(**s) for s in spans])


def distributions(question: Question, rows: Sequence[np.ndarray], calibration: Calibration) -> list[Distribution]:
    """One distribution per readout of the question; `rows` = letter logits of its readouts' orders in turn."""
    if not question.needs_model:
        return [certain()]
    out, at = [], 0
    for item in question.asked:
        n, k = len(item.orders), len(item.options)
        temperature = calibration.temperature(item.type)
        out.append(distribution([lg[:k] for lg in rows[at : at + n]], item.orders, temperature))
        at += n
    return out
