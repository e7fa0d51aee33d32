"""The seam between the engine and one model's pipeline: four calls per pass, and the plain data that crosses.

The engine decides *when and where* work runs (queues, lanes, the device gate, cancellation, two passes in
flight); the pipeline decides *what* a request needs and *what to do* with its results. One pass is:

    admit(request, limits, cancelled) -> Admitted    once per request: its first round tokenized, its cost
                                                     (later rounds estimated), every limit checked
    pack(states) -> Packed                           host work for the requests a lane took: forwards, and
                                                     which rows of the pass are whose
    forward(packed, preemptible) -> Rows             the pass (a generator: every yield a checkpoint); each
                                                     request's rows, by the state `admit` gave it
    settle(state, rows, arrival, cancelled)          the request's `Answer`, or its `Next` round and that
                                                     round's cost (a large choice's final round)

A request that asks the model nothing is admitted with no prompts and settled at once with no rows. The engine
holds each request's `state` without reading it and never finds a request's rows by position: `forward` returns
them by state. `Pipeline.decide` is these same calls without queues.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from basal.core.decision.answers import BasalResponse, SystemOneResponse
from basal.core.decision.diagnostics import Diagnostics
from basal.core.model.model_dir import Calibration
from basal.core.packing.tree import TokenizedQuestion
from basal.core.request.limits import Limits
from basal.core.request.plan import DecisionRequest

Rows = Mapping[Hashable, Sequence[Any]]  # one pass's results: each request's rows (its items, in its own order)


@dataclass
class Stats:
    """Where the time of a pass went, and what packing saved."""

    tokenize_ms: float = 0.0
    pack_ms: float = 0.0
    forward_ms: float = 0.0
    forwards: int = 0
    packed_tokens: int = 0  # tokens computed (shared prefixes once, cached template prefix not at all)
    prompt_tokens: int = 0  # tokens of every option-order prompt, as if each ran alone


@dataclass(frozen=True)
class Facts:
    """What the engine, the front and the metrics know of a pipeline's model: plain data, so that a Ray replica
    can send it on."""

    version: str  # the model's version (basal_model_info)
    calibration: Calibration
    serves_evidence: bool  # an evidence head, and a backend that reads hidden states
    compute: dict[str, object]  # `Backend.describe()`: what decides the bits of this model's answers
    context: int  # the longest prompt the model reads, in tokens
    max_token_chars: int  # the most characters one token of its tokenizer covers
    prefix_tokens: dict[str, int]  # per language: the template prefix's tokens, computed once at load, never in a pass
    synthetic: bool = False  # random weights (the demo model, `basal synth-model`): its answers carry no meaning

    def prompt_char_limit(self, limits: Limits) -> int:
        """Characters a prompt may hold: the configured limit, else as many as `context` tokens can cover."""
        return limits.max_prompt_chars or self.context * self.max_token_chars


@dataclass(frozen=True)
class Next:
    """A request's round still to run, as the engine queues it: the prompts the scheduler packs by, and the cost."""

    tokenized: list[TokenizedQuestion]  # every asked option order of the round's items ([]: nothing to run)
    cost: int  # packed tokens of every round still to run (a later round estimated until it is known)


@dataclass(frozen=True)
class Admitted(Next):
    """An admitted request: its first round, and the pipeline's state of it, handed back to `pack` and `settle`."""

    state: Hashable  # opaque to the engine; one per request, hashable by identity


@dataclass(frozen=True)
class Answer:
    """A request's answer, and its diagnostics when it asked for them."""

    response: SystemOneResponse | BasalResponse
    diagnostics: Diagnostics | None = None


class Packed(Protocol):
    """One pass's host work (`Seam.pack`), handed back to `Seam.forward`. The engine reads only `stats`, once the
    pass has run."""

    stats: Stats


class Seam(Protocol):
    """Everything the engine asks of a model's pipeline (`basal.core.engine.pipeline.Pipeline` implements it)."""

    def facts(self) -> Facts:
        """The model's facts (cheap; `compute` is read afresh each time)."""
        ...

    def admit(
        self, request: DecisionRequest, limits: Limits | None = None, cancelled: Callable[[], bool] = lambda: False
    ) -> Admitted:
        """Check the request's limits, tokenize its first round and cost every round. Characters are counted
        before anything is tokenized. `limits` None: only the model's context is checked. Raises RequestError
        (a limit), Cancelled (`cancelled()` said so before tokenizing)."""
        ...

    def cached_prefix(self, question: TokenizedQuestion) -> tuple[str, int] | None:
        """The cached state a question would read if it were packed now (its key, and its tokens, the template's
        included), else None: the scheduler's pass budget leaves those tokens out, as the cost does."""
        ...

    def pack(self, states: Sequence[Hashable], stats: Stats | None = None) -> Packed:
        """The next round of each state's request, packed into one pass (host work, before the device is taken)."""
        ...

    def forward(self, packed: Packed, preemptible: bool = False) -> Generator[Any, None, Rows]:
        """Run a packed pass; every yield is a checkpoint (`basal.core.packing.passes`). -> each state's rows.
        `preemptible`: the pass must be able to pause between layers (a long or background lane's)."""
        ...

    def settle(
        self,
        state: Hashable,
        rows: Sequence[Any],
        arrival: float,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Answer | Next:
        """Hand back a request's rows of the pass that ran its round (none when `admit` asked no round): its answer
        (latency counted from `arrival`, a `time.perf_counter()`), or its next round with that round's cost,
        length-checked. Raises RequestError, Cancelled (a large choice's fit stops when `cancelled()`)."""
        ...
