"""A validated request as both dialects plan it: the questions the engine runs and the answer step reads. Nothing
past the request parsers (`dialects.py`) sees raw JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from basal.core.errors import RequestError
from basal.core.model.prompt import Item
from basal.core.request.extensions import ActSpec, MultiSpec

Dialect = Literal["systemone", "basal"]
Kind = Literal["choice", "noul", "score", "multi", "act"]


@dataclass(frozen=True, slots=True)
class Question:
    kind: Kind  # answer shape
    item: Item  # what the model sees; one option -> answered with p = 1 without running the model
    legend: tuple[Any, ...] = ()  # score legend values (TypeSafe: levels as sent; upstream: shown texts)
    branches: tuple[Item, ...] = ()  # multi: one yes/no item per label, asked instead of `item`
    spec: MultiSpec | ActSpec | None = None  # multi selection rule / act cost matrix
    evidence: bool = False  # a truthy `evidence` field
    deferred_error: RequestError | None = None  # upstream: raised when the answer is built (after the run)

    @property
    def name(self) -> str:
        return self.item.name

    @property
    def needs_model(self) -> bool:
        return bool(self.branches) or len(self.item.options) >= 2

    @property
    def asked(self) -> tuple[Item, ...]:
        """The readouts the model answers for this question, in order (multi: its branches)."""
        return self.branches or (self.item,)

    @property
    def branch_count(self) -> int:
        """``usage.branches`` of the question: its labels for multi, 1 otherwise."""
        return len(self.branches) or 1


@dataclass(frozen=True, slots=True)
class DecisionRequest:
    dialect: Dialect
    model: str
    questions: tuple[Question, ...]
    warnings: tuple[str, ...] = ()  # /v1/basal: what was ignored (the x-basal-warnings header and the log)
    facts_limit: int | None = None  # with facts "auto": the original state's length (evidence spans end there)
    diagnostics: bool = False  # the client asked for per-order distributions and token counts (x-basal-diagnostics)
    # with diagnostics: each order's full-vocabulary letter mass too, a product with the whole LM head per forward;
    # `basal calibrate` and `basal eval` read only the orders' average and leave it out (the online forward path)
    letter_mass: bool = True
    # whose cached states it may read: "" shared; with API keys (unless shared) a digest of the key (docs/caches.md)
    cache_scope: str = ""
