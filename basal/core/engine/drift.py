"""Drift series: the running distribution of each served model's online answers, per question name, in /metrics.

Per model and question: answers by decision label (`shadow.decision`, so a label here is a label there), summed
confidence (`cascade.top_probability`; over the answers' count: the mean) and answers less confident than the
model's certified threshold for the smallest `max_error` target of its calibration. An alert compares a recent
window of these counters with a baseline window (deploy/prometheus/basal-alerts.yml).

Question names and labels are user data, so both are bounded: the first `max_questions` names of a model and the
first `max_labels` labels of a question are counted by name, any later one under `_other`. The answer is read
after it is made and never touched; batch lines and shadow copies (the background lane) are not counted. An answer
served from the exact-answer cache is counted too (by the marks kept with it: the route calls `count`). The
threshold is read at a model's first answer and again after a calibration reload (`DriftRecorder.forget`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from basal.core.decision.act import certified_confidence
from basal.core.engine.cascade import top_probability
from basal.core.engine.front import EnginesFront, Result, WrappedFront
from basal.core.engine.metrics import Metrics
from basal.core.engine.shadow import decision
from basal.core.request.plan import DecisionRequest

OTHER = "_other"  # the question name or label past the bounds

Mark = tuple[str, str, float]  # what drift counts of one answer: its question's name, its label, its confidence


def marks(request: DecisionRequest, answers: Mapping[str, Any]) -> tuple[Mark, ...]:
    """The drift marks of a response's answers, in the request's question order (kept with a cached answer, so
    a hit is counted as its answer was)."""
    out = []
    for q in request.questions:
        if q.name in answers:
            answer = answers[q.name]
            out.append((q.name, decision(answer)[0], float(top_probability(answer))))
    return tuple(out)


def max_error_confidence(thresholds: Mapping[str, Any]) -> float | None:
    """The certified confidence of the smallest error target in CALIBRATION.json's thresholds (None: none)."""
    targets = []
    for key in thresholds if isinstance(thresholds, Mapping) else ():
        try:
            targets.append((float(key), key))
        except ValueError:
            continue
    for _, key in sorted(targets):
        confidence = certified_confidence(thresholds, key)
        if confidence is not None:
            return confidence
    return None


class DriftRecorder:
    """Counts answers into the drift series, with the question names and labels bounded."""

    def __init__(
        self,
        metrics: Metrics,
        max_questions: int,
        max_labels: int,
        thresholds_of: Callable[[str], Mapping[str, Any]],
    ):
        self.metrics = metrics
        self.max_questions = max_questions
        self.max_labels = max_labels
        self._thresholds_of = thresholds_of
        self._limits: dict[str, float | None] = {}  # model -> its max_error confidence, read once per calibration
        self._labels: dict[str, dict[str, set[str]]] = {}  # model -> question -> labels counted by name

    def limit(self, model: str) -> float | None:
        """The model's threshold, read once (on Ray, reading it is a call to a replica) until `forget`."""
        limits = self._limits  # `forget` replaces the dict: a value read from an old calibration lands in the old one
        if model not in limits:
            limits[model] = max_error_confidence(self._thresholds_of(model))
        return limits[model]

    def forget(self) -> None:
        """A calibration was reloaded: each model's threshold is read again at its next answer. Safe from another
        thread (the reload's)."""
        self._limits = {}

    def _bounded(self, model: str, question: str, label: str) -> tuple[str, str]:
        questions = self._labels.setdefault(model, {})
        if question not in questions:
            if len(questions) >= self.max_questions:
                question = OTHER
            questions.setdefault(question, set())
        labels = questions[question]
        if label not in labels:
            if len(labels) >= self.max_labels:
                return question, OTHER
            labels.add(label)
        return question, label

    def record(self, model: str, question: str, answer: Any) -> None:
        self.count(model, ((question, decision(answer)[0], float(top_probability(answer))),))

    def count(self, model: str, answers: tuple[Mark, ...]) -> None:
        """Count answers by their marks (`marks`): computed now, or served again from the answer cache."""
        limit = self.limit(model)
        for question, label, confidence in answers:
            question, label = self._bounded(model, question, label)
            self.metrics.drift_answers.inc(model, question, label)
            self.metrics.drift_confidence.inc(model, question, by=confidence)
            if limit is not None and confidence < limit:
                self.metrics.drift_below_max_error.inc(model, question)


class DriftFront(WrappedFront):
    """An `EnginesFront` that counts each online answer into the drift series; everything else is the wrapped
    front's (read through), and the answer is returned as it came."""

    def __init__(self, inner: EnginesFront, recorder: DriftRecorder):
        super().__init__(inner)
        self.recorder = recorder

    def forget_calibrations(self) -> None:
        self.recorder.forget()
        super().forget_calibrations()

    async def run(
        self,
        request: DecisionRequest,
        cancelled: Callable[[], bool] = lambda: False,
        *,
        has_slot: bool = False,
        background: bool = False,
    ) -> Result:
        result = await self.inner.run(request, cancelled, has_slot=has_slot, background=background)
        if not background:
            self.recorder.count(request.model, marks(request, result.response.answers))
        return result


def with_drift(inner: EnginesFront, max_questions: int, max_labels: int) -> EnginesFront:
    """`inner` with the drift series recorded (itself when `max_questions` is 0: no drift series)."""
    if max_questions == 0:
        return inner
    recorder = DriftRecorder(
        inner.metrics, max_questions, max_labels, lambda model: inner.model_info(model).calibration.thresholds
    )
    return DriftFront(inner, recorder)
