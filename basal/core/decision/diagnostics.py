"""Why an answer came out as it did, for a client that asks (the `x-basal-diagnostics` header): every readout's
distribution in each option order, their average, the temperature applied and the calibrated result, and what
the request cost in tokens.

The per-order numbers are the same float64 values `distribution.py` averages, so a client recomputes the answer's
probabilities from them exactly: mean of the orders, then ``softmax(log(max(p, 1e-12)) / T)`` (T == 1: unchanged).
Nothing here runs unless a request asks; the default response is built without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
import numpy as np

from basal.core.decision.distribution import Distribution, calibrate, unpermute
from basal.core.decision.respond import distributions
from basal.core.model.model_dir import Calibration
from basal.core.model.prompt import Item
from basal.core.request.plan import DecisionRequest, Question


class OrderDiagnostics(msgspec.Struct):
    letters: list[str]  # option keys in the order the letters A, B, ... showed them
    probabilities: dict[str, float]  # this order's softmax over its letters, by option key
    # the softmax over the whole vocabulary at this order's answer position, summed over its option letters (the
    # share of the model's next-token probability on the letters); None where the backend reads no hidden states
    letter_mass: float | None = None


class ReadoutDiagnostics(msgspec.Struct):
    name: str  # the item the model read: the question, or one branch of a multi
    orders: list[OrderDiagnostics]  # empty where the model was not run, or for a large choice's joint
    average: dict[str, float]  # mean of the orders (a large choice: the joint fitted over its rounds)
    calibrated: dict[str, float]  # the average after the temperature: what the answer reports


class QuestionDiagnostics(msgspec.Struct):
    type: str  # the calibration key of the readouts: noul | choice | score
    temperature: float  # applied to the average; 1.0 = unchanged
    readouts: list[ReadoutDiagnostics]
    rounds: int  # 2 for a choice of 11..255 options (groups, then finalists), else 1
    facts: str | None  # the facts block appended to the state (facts: "auto"), as the model read it


class CascadeStepDiagnostics(msgspec.Struct):
    model: str  # the step's model
    confidence: float  # the largest calibrated probability of its answer (a multi: set_confidence)
    rule: str  # the step's rule for this question's type, as applied
    escalated: bool  # the question went on to the next step


class Diagnostics(msgspec.Struct):
    prompt_tokens: int  # tokens of every option-order prompt, as if each ran alone (usage.input_tokens)
    packed_tokens: int  # tokens this request computes alone: shared prefixes once, the cached template not at all
    questions: dict[str, QuestionDiagnostics]
    # a cascade: per question, every step it reached (its answer's diagnostics are the answering step's)
    cascade: dict[str, list[CascadeStepDiagnostics]] | msgspec.UnsetType = msgspec.UNSET


def _by_key(keys: Sequence[str], p: np.ndarray) -> dict[str, float]:
    return {k: float(v) for k, v in zip(keys, p, strict=True)}


def letter_mass(logits: np.ndarray, log_norm: float) -> float:
    """sum_i exp(logit_i - logsumexp over the vocabulary), in float64: the letters' full-vocabulary mass."""
    return float(np.exp(np.asarray(logits, dtype=np.float64) - log_norm).sum())


def _readout(
    item: Item, dist: Distribution, logits: Sequence[np.ndarray], log_norms: np.ndarray | None
) -> ReadoutDiagnostics:
    k = len(item.keys)
    masses = (
        [None] * len(item.orders)
        if log_norms is None
        else [letter_mass(lg[:k], n) for lg, n in zip(logits, log_norms, strict=True)]
    )
    orders = [
        OrderDiagnostics([item.keys[i] for i in perm], _by_key(item.keys, unpermute(p, perm)), mass)
        for p, perm, mass in zip(dist.probs, item.orders, masses, strict=True)
    ]
    return ReadoutDiagnostics(item.name, orders, _by_key(item.keys, dist.p_avg), _by_key(item.keys, dist.p_cal))


def _facts(request: DecisionRequest, question: Question) -> str | None:
    if request.facts_limit is None:
        return None
    return question.asked[0].state_text[request.facts_limit :]


def diagnose(
    request: DecisionRequest,
    logits: Mapping[str, list[np.ndarray]],
    calibration: Calibration,
    joints: Mapping[str, np.ndarray],
    log_norms: Mapping[str, np.ndarray],
    prompt_tokens: int,
    packed_tokens: int,
) -> Diagnostics:
    """The diagnostics of an answered request, from the same letter logits and joints `respond` read; `log_norms`:
    per question, the vocabulary log-sum-exp at each order's readout (absent: letter mass not computed)."""
    out = {}
    for q in request.questions:
        temperature = calibration.temperature(q.asked[0].type)
        keys = q.item.keys
        if q.name in joints:  # a choice of 11..255 options: the joint fitted over its rounds, no single order
            joint = joints[q.name]
            readouts = [
                ReadoutDiagnostics(q.name, [], _by_key(keys, joint), _by_key(keys, calibrate(joint, temperature)))
            ]
        elif not q.needs_model:  # one option: p = 1, the model was not run
            readouts = [ReadoutDiagnostics(q.name, [], {keys[0]: 1.0}, {keys[0]: 1.0})]
        else:
            rows = logits.get(q.name, [])
            norms = log_norms.get(q.name)
            dists = distributions(q, rows, calibration)
            readouts, at = [], 0
            for item, d in zip(q.asked, dists, strict=True):
                n = len(item.orders)
                part = None if norms is None else norms[at : at + n]
                readouts.append(_readout(item, d, rows[at : at + n], part))
                at += n
        rounds = 2 if q.name in joints else 1
        out[q.name] = QuestionDiagnostics(q.asked[0].type, float(temperature), readouts, rounds, _facts(request, q))
    return Diagnostics(prompt_tokens, packed_tokens, out)
