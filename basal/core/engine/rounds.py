"""What one request asks the model, round after round.

An ordinary request is one round: every question's items go into one packed pass. A choice with 11–255 options
(`basal.core.decision.large_choice`) needs a second round whose prompts depend on the first round's answers, so its
request is planned as a sequence: round 1 holds the ordinary items and every group of every large choice (all
in one tree, so the groups of a question share its state); round 2 holds the final groups. A `Rounds` is the
pipeline's state of one request (`basal.core.engine.seam`): the pipeline runs a round, hands its letter logits
back with `take`, and runs the next until `done`; the engine holds it without reading it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from basal.core.decision.evidence import StateTokens
from basal.core.decision.large_choice import DEFAULT_STRATEGY, LargeChoice, Strategy, is_large
from basal.core.model.prompt import Item
from basal.core.packing.tree import StateRows, TokenizedQuestion
from basal.core.request.plan import DecisionRequest

Logits = list[np.ndarray]  # letter logits of one item, one array per asked option order


@dataclass(eq=False)  # hashed by identity: a pass's results are keyed by the request's Rounds
class Rounds:
    request: DecisionRequest
    strategy: Strategy = DEFAULT_STRATEGY
    large: dict[str, LargeChoice] = field(init=False)
    asked: list[Item] = field(init=False)  # the items of the round to run next
    tokenized: list[TokenizedQuestion] = field(default_factory=list)  # ... tokenized by the pipeline
    plain_logits: dict[str, Logits] = field(default_factory=dict)  # ordinary questions, by name
    input_tokens: int = 0  # tokens of every prompt asked so far (usage.input_tokens)
    cached_tokens: int = 0  # ... of them read from the state cache (usage.cached_tokens)
    packed_tokens: int = 0  # ... as this request packs them alone; counted only when it asks for diagnostics
    round: int = 0  # rounds already taken
    evidence: frozenset[str] = field(init=False)  # questions whose state tokens' hidden states are read
    state_tokens: dict[str, StateTokens | None] = field(default_factory=dict)  # ... where the state lies (pipeline)
    states: dict[str, StateRows] = field(default_factory=dict)  # ... their hidden states once run
    # diagnostics: per question, the vocabulary log-sum-exp at each order's readout (as `plain_logits`' rows)
    log_norms: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        run = [q for q in self.request.questions if q.needs_model]
        self.large = {q.name: LargeChoice(q.item, self.strategy) for q in run if is_large(q.item)}
        self.evidence = frozenset(q.name for q in run if q.evidence and not q.branches and q.name not in self.large)
        self.asked = [item for q in run if q.name not in self.large for item in q.asked]  # a multi: its branches
        for lc in self.large.values():
            self.asked += lc.first_round()

    @property
    def done(self) -> bool:
        return not self.asked

    def take(self, logits: Sequence[Logits], cancelled: Callable[[], bool] = lambda: False) -> None:
        """The letter logits of every item of the round just run (in `asked` order); sets up the next round.
        Large choices' fits ask `cancelled()` between their steps and raise `Cancelled` once it says True."""
        if len(logits) != len(self.asked):
            raise ValueError(f"{len(logits)} results for {len(self.asked)} items")
        self.input_tokens += sum(n for t in self.tokenized for n in t.lengths)
        self.cached_tokens += sum(getattr(r, "cached_tokens", 0) for r in logits)  # STATE CACHE hook
        rest = iter(logits)  # by `asked` order: item names may collide with question names ("q#0")
        following: list[Item] = []
        if self.round == 0:
            for q in self.request.questions:
                if q.needs_model and q.name not in self.large:  # a multi's branches, one after the other
                    results = [next(rest) for _ in q.asked]
                    self.plain_logits[q.name] = [order for result in results for order in result]
                    states = getattr(results[0], "states", None)
                    if q.name in self.evidence and states is not None:
                        self.states[q.name] = states
                    norms = [getattr(r, "log_norms", None) for r in results]
                    if all(n is not None for n in norms):
                        self.log_norms[q.name] = np.concatenate(norms)
            for lc in self.large.values():
                following.append(lc.final_round([next(rest) for _ in lc.groups], cancelled))
        else:
            for lc in self.large.values():
                lc.finish(next(rest), cancelled)
        self.round += 1
        self.asked, self.tokenized = following, []

    def joints(self) -> dict[str, np.ndarray]:
        """Joint distribution (before temperature) of every large choice, once all rounds are taken."""
        if not self.done:
            raise RuntimeError("the request still has rounds to run")
        return {name: lc.joint for name, lc in self.large.items() if lc.joint is not None}
