"""Cascades: one served name answered by an ordered list of models, each later model asked only what the earlier
ones were unsure of.

A request to a cascade's name is decided by its first model. Every answer whose confidence (the largest calibrated
probability of its distribution; `set_confidence` for a multi) is below that step's rule goes on, with the other
such questions of the request, to the next model — the questions of one state stay together in one sub-request, so
they stay packed in one tree there — and so on to the last model, which answers whatever reaches it. A question's
answer is the bytes its answering model gives it (decisions are bitwise the same alone, batched or in a tree), so
a cascade's answer equals that model's answer for the whole request; the same request escalates the same
questions every time.

A rule is a confidence (`escalate_below`) or a certified error target (`escalate_above_error`: the model's
`CALIBRATION.json` threshold for that target, the confidence at which its kept answers were certified), either for
every question type or per type. A later step that fails (overloaded, shutting down, refused) ends the cascade:
the client keeps the earlier step's answers for those questions and is told which step failed and why.

The cascade depends on the `EnginesFront` protocol only, so it wraps one process's engines or the Ray front alike
(its steps may live on other replicas).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from basal.core.decision.act import certified_confidence
from basal.core.decision.answers import BasalResponse, BasalUsage, NoulAnswer, StepUsage, SystemOneResponse, Usage
from basal.core.decision.diagnostics import CascadeStepDiagnostics, Diagnostics
from basal.core.engine.front import EnginesFront, ModelInfo, Result, WrappedFront
from basal.core.errors import Cancelled, EngineClosed, Overloaded, RequestError
from basal.core.request.plan import DecisionRequest, Question

log = logging.getLogger(__name__)

QUESTION_TYPES = ("choice", "noul", "score", "multi", "act")


class CascadeError(ValueError):
    """A cascade that cannot be served (an unknown model, a rule without a certified threshold, ...)."""


@dataclass(frozen=True)
class Rule:
    """When a step sends a question on: below a confidence, or below the certified threshold for an error target.
    `per_type`: a question type -> its own value; `default`: the value for the other types (None: they stop)."""

    kind: str  # "confidence" | "error"
    default: float | None
    per_type: Mapping[str, float] = field(default_factory=dict)

    def value(self, question_type: str) -> float | None:
        return self.per_type.get(question_type, self.default)

    def describe(self) -> dict[str, Any]:
        key = "escalate_below" if self.kind == "confidence" else "escalate_above_error"
        if not self.per_type:
            return {key: self.default}
        values = dict(self.per_type)
        if self.default is not None:
            values = {**dict.fromkeys(QUESTION_TYPES, self.default), **values}
        return {key: values}


@dataclass(frozen=True)
class Step:
    model: str
    rule: Rule | None  # None: the last step, which answers everything that reaches it


@dataclass(frozen=True)
class Cascade:
    name: str
    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        if len(self.steps) < 2:
            raise CascadeError(f"cascade {self.name!r}: needs at least two steps")
        if any(s.rule is None for s in self.steps[:-1]) or self.steps[-1].rule is not None:
            raise CascadeError(
                f"cascade {self.name!r}: every step but the last needs a rule (escalate_below or "
                "escalate_above_error); the last answers what reaches it and has none"
            )
        models = [s.model for s in self.steps]
        if len(set(models)) != len(models):
            raise CascadeError(f"cascade {self.name!r}: a model appears twice in its steps ({', '.join(models)})")

    def describe(self) -> list[dict[str, Any]]:
        """The steps and their rules, as `/v1/models` lists them."""
        return [{"model": s.model, **(s.rule.describe() if s.rule else {})} for s in self.steps]


def top_probability(answer: Any) -> float:
    """The confidence a rule compares: the largest calibrated probability of the answer's distribution (what
    upstream calls `confidence` for every type), a multi's `set_confidence`. The same number in both dialects."""
    if isinstance(answer, NoulAnswer):  # TypeSafe's yes/no answer carries P(true) only
        return max(answer.noul, 1.0 - answer.noul)
    set_confidence = getattr(answer, "set_confidence", None)
    if set_confidence is not None:
        return float(set_confidence)
    return max(answer.probabilities.values())


def threshold(rule: Rule, question_type: str, thresholds: Mapping[str, Any]) -> float | None:
    """The confidence below which a question of this type escalates under `rule` (None: it never does)."""
    value = rule.value(question_type)
    if value is None or rule.kind == "confidence":
        return value
    certified = certified_confidence(thresholds, error_key(value))
    if certified is None:  # checked when the cascade is built; a reloaded calibration may still drop the key
        raise CascadeError(f"no certified threshold for max_error {error_key(value)} in this model's calibration")
    return certified


def error_key(target: float) -> str:
    """CALIBRATION.json's key of an error target: Python's str() of the number (0.05 -> "0.05")."""
    return str(float(target))


def check_thresholds(cascade: Cascade, thresholds_of: Callable[[str], Mapping[str, Any]]) -> None:
    """Every error target a rule names has a certified threshold in its model's calibration."""
    for step in cascade.steps:
        if step.rule is None or step.rule.kind != "error":
            continue
        targets = {v for v in (step.rule.default, *step.rule.per_type.values()) if v is not None}
        have = thresholds_of(step.model)
        for target in sorted(targets):
            if certified_confidence(have, error_key(target)) is None:
                raise CascadeError(
                    f"cascade {cascade.name!r}: model {step.model!r} has no certified threshold for max_error "
                    f"{error_key(target)} (its calibration certifies {', '.join(sorted(have)) or 'none'}); "
                    "use escalate_below or another target"
                )


@dataclass
class StepTrace:
    """What one step did, for the response headers, usage and diagnostics."""

    model: str
    asked: int  # questions sent to this step
    answered: int = 0  # ... that it kept (not sent on)
    input_tokens: int = 0
    latency_ms: float = 0.0
    failed: str = ""  # why this step could not answer (a later step only); "" if it answered


@dataclass(frozen=True)
class CascadeReport:
    """Who answered what: plain data on `Result`, for headers (`x-basal-answered-by`) and the log."""

    steps: tuple[StepTrace, ...]
    answered_by: Mapping[str, str]  # question name -> the model whose answer the client gets

    def answered_by_header(self) -> str:
        return ", ".join(f"{s.model}={s.answered}" for s in self.steps if s.asked and not s.failed)

    def failure_header(self) -> str:
        return "; ".join(f"{s.model}: {s.failed}" for s in self.steps if s.failed)


async def decide(
    cascade: Cascade,
    request: DecisionRequest,
    run: Callable[[DecisionRequest], Awaitable[Result]],
    thresholds_of: Callable[[str], Mapping[str, Any]],
    escalated: Callable[[str, str, str], None] = lambda cascade, model, question_type: None,
) -> Result:
    """Answer `request` (addressed to the cascade) step by step; `run` decides a request with one served model.
    Errors of the first step are the request's errors; a later step's failure keeps the earlier answers."""
    started = time.perf_counter()
    answers: dict[str, Any] = {}
    by: dict[str, str] = {}
    traces: list[StepTrace] = []
    results: list[Result] = []
    notes: dict[str, list[CascadeStepDiagnostics]] = {}
    pending: Sequence[Question] = request.questions
    for i, step in enumerate(cascade.steps):
        trace = StepTrace(step.model, len(pending))
        traces.append(trace)
        sub = replace(request, model=step.model, questions=tuple(pending))
        t0 = time.perf_counter()
        try:
            result = await run(sub)
        except Cancelled:
            raise
        except Exception as e:
            if i == 0:
                raise
            trace.failed = _failure(e)
            log.warning(
                "cascade %s: step %s failed (%s); %d answers stay with %s",
                cascade.name,
                step.model,
                trace.failed,
                len(pending),
                cascade.steps[i - 1].model,
            )
            break
        trace.latency_ms = (time.perf_counter() - t0) * 1000
        trace.input_tokens = result.response.usage.input_tokens
        results.append(result)
        limits = thresholds_of(step.model) if step.rule is not None and step.rule.kind == "error" else {}
        onward: list[Question] = []
        for q in pending:
            answer = result.response.answers[q.name]
            answers[q.name], by[q.name] = answer, step.model
            confidence = top_probability(answer)
            below = threshold(step.rule, q.kind, limits) if step.rule is not None else None
            goes_on = below is not None and confidence < below
            if request.diagnostics:
                notes.setdefault(q.name, []).append(
                    CascadeStepDiagnostics(step.model, confidence, _rule_text(step.rule, q.kind, below), goes_on)
                )
            if goes_on:
                onward.append(q)
                escalated(cascade.name, step.model, q.kind)
        trace.answered = len(pending) - len(onward)
        if not onward:
            break
        pending = onward
    failed = next((t for t in traces if t.failed), None)
    if failed is not None:  # the questions it was sent stay answered by the step before
        traces[-2].answered += failed.asked
    report = CascadeReport(tuple(traces), by)
    latency_ms = (time.perf_counter() - started) * 1000
    response = _merge(cascade.name, request, answers, by, traces, latency_ms)
    diagnostics = _merge_diagnostics(results, notes, by) if request.diagnostics else None
    return Result(
        response,
        queue_ms=sum(r.queue_ms for r in results),
        compute_ms=sum(r.compute_ms for r in results),
        pass_requests=max(r.pass_requests for r in results),
        replica=",".join(dict.fromkeys(r.replica for r in results if r.replica)),
        diagnostics=diagnostics,
        cascade=report,
    )


def _failure(e: Exception) -> str:
    """A later step's failure as the client reads it: the HTTP status that model would have answered, and why."""
    if isinstance(e, Overloaded):
        return "529 overloaded"
    if isinstance(e, EngineClosed):
        return f"503 {e or 'shutting down'}"
    if isinstance(e, RequestError):
        return f"{e.status} {str(e.body)[:200]}"
    return f"500 {type(e).__name__}"


def _rule_text(rule: Rule | None, question_type: str, below: float | None) -> str:
    if rule is None:
        return "last step: answers what reaches it"
    if below is None:
        return f"no rule for type {question_type}: stops here"
    if rule.kind == "confidence":
        return f"escalate below confidence {below!r}"
    return f"escalate below {below!r}, the certified confidence for max_error {error_key(rule.value(question_type))}"


def _merge(
    name: str,
    request: DecisionRequest,
    answers: Mapping[str, Any],
    by: Mapping[str, str],
    traces: Sequence[StepTrace],
    latency_ms: float,
) -> SystemOneResponse | BasalResponse:
    """One response in the request's question order: each answer as its model gave it (the native dialect names
    the model in `answered_by`), usage summed over the steps (the native dialect lists them)."""
    ordered = {q.name: answers[q.name] for q in request.questions}
    input_tokens = sum(t.input_tokens for t in traces)
    if request.dialect == "systemone":  # the TypeSafe answer shape is fixed: who answered is in a header
        return SystemOneResponse(name, ordered, Usage(input_tokens))
    ordered = {k: msgspec.structs.replace(a, answered_by=by[k]) for k, a in ordered.items()}
    n, branches = len(request.questions), sum(q.branch_count for q in request.questions)
    steps = [
        StepUsage(t.model, t.asked, t.answered, t.input_tokens, round(t.latency_ms, 2)) for t in traces if not t.failed
    ]
    usage = BasalUsage(input_tokens, 0, n, branches, round(latency_ms, 2), steps=steps)
    return BasalResponse(name, ordered, usage)


def _merge_diagnostics(
    results: Sequence[Result], notes: Mapping[str, list[CascadeStepDiagnostics]], by: Mapping[str, str]
) -> Diagnostics:
    """Each question's diagnostics from the step that answered it, with every step's confidence and rule."""
    questions = {}
    for name, model in by.items():
        for r in results:
            if r.response.model == model and r.diagnostics is not None and name in r.diagnostics.questions:
                questions[name] = r.diagnostics.questions[name]
    have = [r.diagnostics for r in results if r.diagnostics is not None]
    return Diagnostics(
        sum(d.prompt_tokens for d in have),
        sum(d.packed_tokens for d in have),
        questions,
        cascade={k: notes[k] for k in by if k in notes},
    )


class CascadeFront(WrappedFront):
    """An `EnginesFront` that also serves cascades: their names beside the models', answered step by step through
    the front it wraps (one process's engines or the Ray front); everything else is the wrapped front's."""

    def __init__(self, inner: EnginesFront, cascades: Sequence[Cascade]):
        super().__init__(inner)
        self.cascades = {c.name: c for c in cascades}
        clash = [c for c in self.cascades if c in inner.names]
        if clash:
            raise CascadeError(f"cascade name {clash[0]!r} is also a served model's name; give the cascade another")
        for c in cascades:
            missing = [s.model for s in c.steps if s.model not in inner.names]
            if missing:
                raise CascadeError(
                    f"cascade {c.name!r}: no served model {missing[0]!r} (served: {', '.join(inner.names)})"
                )
        self._thresholds: dict[str, Mapping[str, Any]] = {}

    @property
    def names(self) -> list[str]:
        return [*self.inner.names, *self.cascades]

    # -- cascades ---------------------------------------------------------------------------------------------

    def model_info(self, name: str) -> ModelInfo:
        cascade = self.cascades.get(name)
        if cascade is None:
            return self.inner.model_info(name)
        infos = [self.inner.model_info(s.model) for s in cascade.steps]
        bounds = [i for i in infos if i.prompt_char_limit]
        first = infos[0]
        return ModelInfo(
            name,
            first.calibration,  # the first step's: it answers most questions; each answer is calibrated by its model
            all(i.serves_evidence for i in infos),  # a question asking for evidence may reach any step
            {"cascade": {s.model: i.compute for s, i in zip(cascade.steps, infos, strict=True)}},
            min((i.prompt_char_limit for i in bounds), default=0),  # a prompt must fit every step's model
            min((i.context for i in bounds), default=0),
            synthetic=any(i.synthetic for i in infos),
            cascade=tuple(cascade.describe()),
        )

    def thresholds(self, model: str) -> Mapping[str, Any]:
        if model not in self._thresholds:
            self._thresholds[model] = self.inner.model_info(model).calibration.thresholds
        return self._thresholds[model]

    def forget_calibrations(self) -> None:
        self._thresholds = {}  # read again at the next escalation rule: a reload may move them
        super().forget_calibrations()

    def check(self) -> None:
        """Every rule's certified target exists in its model's calibration (call once the models are known)."""
        for cascade in self.cascades.values():
            check_thresholds(cascade, self.thresholds)

    async def run(
        self,
        request: DecisionRequest,
        cancelled: Callable[[], bool] = lambda: False,
        *,
        has_slot: bool = False,
        background: bool = False,
    ) -> Result:
        cascade = self.cascades.get(request.model)
        if cascade is None:
            return await self.inner.run(request, cancelled, has_slot=has_slot, background=background)
        if not has_slot:
            with self.slot():  # one request, one place, whatever number of steps it takes
                return await self.run(request, cancelled, has_slot=True, background=background)

        async def run_step(sub: DecisionRequest) -> Result:
            if cancelled():
                raise Cancelled()
            return await self.inner.run(sub, cancelled, has_slot=True, background=background)

        result = await decide(cascade, request, run_step, self.thresholds, self.metrics.cascade_escalations.inc)
        assert result.cascade is not None
        for step in result.cascade.steps:
            if step.failed:
                self.metrics.cascade_step_failures.inc(cascade.name, step.model)
        return result
