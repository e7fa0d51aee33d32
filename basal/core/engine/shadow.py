"""Shadow traffic: a sampled copy of a served model's online requests decided by a candidate model in the
background, its answers compared with the primary's.

The primary's answer is never touched: the copy is made from the planned request after the primary has answered,
and decided on the background lane (behind every online request, as batch lines are), holding no `max_inflight`
place. At most `queue` copies per shadow wait or run at once; one more is dropped and counted. A shadow that
fails is counted and forgotten.

On basal every difference is real: a model's answers do not depend on what else was batched with them, so a
question that flips, flips because the models differ — never because of batch noise.

Agreement is recorded per question type: whether the decisions agree (the choice, the most probable score level,
the yes/no side, a multi's selected set, an act's action), |Δp| of the primary's decision between the two answers,
and flips by label pair; `GET /v1/shadow` summarises a window of the latest comparisons.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from basal.core.decision.answers import NoulAnswer
from basal.core.engine.front import EnginesFront, Result, WrappedFront
from basal.core.request.plan import DecisionRequest

log = logging.getLogger(__name__)

WINDOW = 10_000  # comparisons kept per shadow for its summary (mean and p99 of |Δp|, flips)
TOP = 10  # flipping questions and label pairs listed in a summary


@dataclass(frozen=True)
class Shadow:
    """A candidate decided beside `primary` on a share `sample` of its online requests."""

    primary: str
    model: str
    sample: float = 0.1
    queue: int = 64  # copies waiting or running at once; one more is dropped


@dataclass(frozen=True)
class Comparison:
    question: str
    type: str
    primary: str  # the primary's decision, as a label
    shadow: str  # the shadow's
    abs_dp: float  # |p_primary - p_shadow| of the primary's decision

    @property
    def agree(self) -> bool:
        return self.primary == self.shadow


def decision(answer: Any) -> tuple[str, dict[str, float]]:
    """An answer's decision as a label, and its probabilities by label (what |Δp| is read from)."""
    if isinstance(answer, NoulAnswer):  # TypeSafe's yes/no answer: P(true) only
        return ("true" if answer.noul >= 0.5 else "false"), {"true": answer.noul, "false": 1.0 - answer.noul}
    selected = getattr(answer, "selected", None)
    if selected is not None:  # a multi: the selected set; its probabilities are per label, not one distribution
        return "+".join(sorted(selected)) or "(none)", dict(answer.probabilities)
    action = getattr(answer, "action", None)
    probabilities = dict(answer.probabilities)
    if action is not None:
        return str(action), probabilities
    if hasattr(answer, "choice"):
        return answer.choice, probabilities
    return max(probabilities, key=probabilities.__getitem__), probabilities  # noul and score: the most probable


def compare(name: str, kind: str, primary: Any, shadow: Any) -> Comparison:
    """One question's answers from the primary and the shadow."""
    label, p = decision(primary)
    other, q = decision(shadow)
    if kind == "multi":  # the largest change of any label's probability
        abs_dp = max((abs(p[k] - q.get(k, 0.0)) for k in p), default=0.0)
    elif kind == "act":  # the probability of the outcome the primary found most likely
        top = max(p, key=p.__getitem__)
        abs_dp = abs(p[top] - q.get(top, 0.0))
    else:
        abs_dp = abs(p[label] - q.get(label, 0.0))
    return Comparison(name, kind, label, other, float(abs_dp))


def compare_responses(request: DecisionRequest, primary: Result, shadow: Result) -> list[Comparison]:
    return [
        compare(q.name, q.kind, primary.response.answers[q.name], shadow.response.answers[q.name])
        for q in request.questions
    ]


@dataclass
class Tally:
    """What one shadow has seen: counts since start, and a window of the latest comparisons."""

    started: float = field(default_factory=time.time)
    sampled: int = 0
    compared_requests: int = 0
    dropped: int = 0
    failed: int = 0
    window: deque[Comparison] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def summary(self, shadow: Shadow) -> dict[str, Any]:
        by_type: dict[str, list[Comparison]] = {}
        for c in self.window:
            by_type.setdefault(c.type, []).append(c)
        flips = Counter(c.question for c in self.window if not c.agree)
        asked = Counter(c.question for c in self.window)
        return {
            "model": shadow.primary,
            "shadow": shadow.model,
            "sample": shadow.sample,
            "since": self.started,
            "requests": {
                "sampled": self.sampled,
                "compared": self.compared_requests,
                "dropped": self.dropped,
                "failed": self.failed,
            },
            "window": len(self.window),
            "types": {kind: _type_summary(cs) for kind, cs in sorted(by_type.items())},
            "top_flipping_questions": [
                {"question": q, "flips": n, "compared": asked[q]} for q, n in flips.most_common(TOP)
            ],
        }


def _type_summary(comparisons: Sequence[Comparison]) -> dict[str, Any]:
    dp = np.array([c.abs_dp for c in comparisons], dtype=np.float64)
    pairs = Counter(f"{c.primary} -> {c.shadow}" for c in comparisons if not c.agree)
    return {
        "compared": len(comparisons),
        "agreement": sum(c.agree for c in comparisons) / len(comparisons),
        "mean_abs_dp": float(dp.mean()),
        "p99_abs_dp": float(np.quantile(dp, 0.99)),
        "flips": dict(pairs.most_common(TOP)),
    }


class ShadowFront(WrappedFront):
    """An `EnginesFront` that copies a sample of each shadowed model's online requests to its shadow, in the
    background, after the primary has answered; everything else is the wrapped front's."""

    def __init__(self, inner: EnginesFront, shadows: Sequence[Shadow], draw: Callable[[], float] = random.random):
        super().__init__(inner)
        self.shadows = {s.primary: s for s in shadows}
        for s in shadows:
            for name in (s.primary, s.model):
                if name not in inner.names:
                    raise ValueError(
                        f"shadow of {s.primary!r}: no served model {name!r} (served: {', '.join(inner.names)})"
                    )
            if s.model == s.primary:
                raise ValueError(f"shadow of {s.primary!r}: a model cannot shadow itself")
        self.tallies = {s.primary: Tally() for s in shadows}
        self._draw = draw
        self._running: dict[str, int] = dict.fromkeys(self.shadows, 0)
        self._tasks: set[asyncio.Task] = set()

    def close(self, drain: bool = True, timeout: float = 30.0, abandon: bool = False) -> None:
        for task in list(self._tasks):  # shadows never hold up a shutdown
            task.get_loop().call_soon_threadsafe(task.cancel)
        self.inner.close(drain, timeout, abandon)

    # -- shadows -------------------------------------------------------------------------------------------------

    async def run(
        self,
        request: DecisionRequest,
        cancelled: Callable[[], bool] = lambda: False,
        *,
        has_slot: bool = False,
        background: bool = False,
    ) -> Result:
        result = await self.inner.run(request, cancelled, has_slot=has_slot, background=background)
        shadow = self.shadows.get(request.model)
        if shadow is not None and not background and self._draw() < shadow.sample:
            self._copy(shadow, request, result)
        return result

    def _copy(self, shadow: Shadow, request: DecisionRequest, result: Result) -> None:
        tally, metrics = self.tallies[shadow.primary], self.inner.metrics
        tally.sampled += 1
        if self._running[shadow.primary] >= shadow.queue:
            tally.dropped += 1
            metrics.shadow_dropped.inc(shadow.primary, shadow.model)
            return
        self._running[shadow.primary] += 1
        task = asyncio.get_running_loop().create_task(self._decide(shadow, request, result))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _decide(self, shadow: Shadow, request: DecisionRequest, primary: Result) -> None:
        tally, metrics = self.tallies[shadow.primary], self.inner.metrics
        try:
            await asyncio.sleep(0)  # the primary's response goes out first
            copy = replace(request, model=shadow.model, diagnostics=False)
            # the background lane, no max_inflight place: online requests never wait behind a shadow
            result = await self.inner.run(copy, has_slot=True, background=True)
            comparisons = compare_responses(request, primary, result)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            tally.failed += 1
            metrics.shadow_failed.inc(shadow.primary, shadow.model)
            log.warning("shadow %s of %s failed: %s: %s", shadow.model, shadow.primary, type(e).__name__, e)
            return
        finally:
            self._running[shadow.primary] -= 1
        tally.compared_requests += 1
        for c in comparisons:
            tally.window.append(c)
            metrics.shadow_decisions.inc(shadow.primary, shadow.model, c.type, "true" if c.agree else "false")
            metrics.shadow_abs_dp.observe(shadow.primary, shadow.model, c.type, value=c.abs_dp)

    def summary(self) -> dict[str, Any]:
        """`GET /v1/shadow`: every shadow's counts and the window of its latest comparisons."""
        return {"shadows": [self.tallies[p].summary(s) for p, s in self.shadows.items()], "window_size": WINDOW}

    async def settle(self) -> None:
        """Wait for every shadow copy started so far (tests, and a graceful shutdown that wants them)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
