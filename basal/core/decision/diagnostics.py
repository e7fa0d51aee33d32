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
    letter_mass: float | None  # share of the whole vocabulary's probability on the letters; None: not computed
    facts: str | None  # the facts block appended to the state (facts: "auto"), as the model read it


class Diagnostics(msgspec.Struct):
    prompt_tokens: int  # tokens of every option-order prompt, as if each ran alone (usage.input_tokens)
    packed_tokens: int  # tokens this request computes alone: shared prefixes once, the cached template not at all
    questions: dict[str, QuestionDiagnostics]


def _by_key(keys: Sequence[str], p: np.ndarray) -> dict[str, float]:
    return {k: float(v) for k, v in zip(keys, p, strict=True)}


def _readout(item: Item, dist: Distribution) -> ReadoutDiagnostics:
    orders = [
        OrderDiagnostics([item.keys[i] for i in perm], _by_key(item.keys, unpermute(p, perm)))
        for p, perm in zip(dist.probs, item.orders, strict=True)
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
    prompt_tokens: int,
    packed_tokens: int,
) -> Diagnostics:
    """The diagnostics of an answered request, from the same letter logits and joints `respond` read."""
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
            dists = distributions(q, logits.get(q.name, []), calibration)
            readouts = [_readout(item, d) for item, d in zip(q.asked, dists, strict=True)]
        rounds = 2 if q.name in joints else 1
        out[q.name] = QuestionDiagnostics(
            q.asked[0].type, float(temperature), readouts, rounds, None, _facts(request, q)
        )
    return Diagnostics(prompt_tokens, packed_tokens, out)
