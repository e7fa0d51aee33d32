"""Choices with 11–255 options (docs/extensions.md §7, the Rust engine's TypeSafe extension).

The letter readout reads at most 10 options, so a larger choice is asked in rounds:

1. groups — two balanced partitions of the options into g = ceil(n/10) groups each (contiguous blocks, then
   round-robin); every option is in two groups and the groups are connected. Each group is an ordinary choice
   item over its options (original relative order, texts as shown for the whole question). `luce2-1o` (the
   default) asks each group in one option order, `luce2` in both.
2. first fit — the Luce model fitted to the group distributions (`basal.core.decision.luce`).
3. final round — the 10 strongest options, back in original order, asked in both orders; its distribution is
   added as one more group and the fit repeated. The answer is the choice temperature applied to that joint.

Prompts per question: 2g · orders + 2.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from basal.core.decision.distribution import distribution
from basal.core.decision.luce import fit
from basal.core.model.prompt import MAX_OPTIONS, Item, option_orders

Strategy = Literal["luce2-1o", "luce2"]
STRATEGIES: tuple[Strategy, ...] = ("luce2-1o", "luce2")
DEFAULT_STRATEGY: Strategy = "luce2-1o"
MAX_LARGE_CHOICE = 255  # the TypeSafe SDK's limit (more is a 400)
FINALISTS = MAX_OPTIONS
Cancel = Callable[[], bool]  # whether the request's client is gone


def _never() -> bool:
    return False


def is_large(item: Item) -> bool:
    """A choice the letter readout cannot read in one prompt (a multi's labels are asked one branch each)."""
    return item.type == "choice" and len(item.options) > MAX_OPTIONS


def blocks(n: int) -> list[list[int]]:
    """g = ceil(n/10) consecutive ranges; the first n mod g are one option longer."""
    g = -(-n // MAX_OPTIONS)
    base, extra = divmod(n, g)
    out, start = [], 0
    for k in range(g):
        size = base + (k < extra)
        out.append(list(range(start, start + size)))
        start += size
    return out


def groups(n: int) -> list[list[int]]:
    """First-round groups in the order asked: the contiguous blocks, then round-robin k, k+g, k+2g, …"""
    g = -(-n // MAX_OPTIONS)
    return blocks(n) + [list(range(k, n, g)) for k in range(g)]


def orders_per_group(strategy: Strategy) -> int:
    return 1 if strategy == "luce2-1o" else 2


def prompt_count(n: int, strategy: Strategy = DEFAULT_STRATEGY) -> int:
    """Prompts the model reads for one question of n options: every group round, then the final round."""
    return len(groups(n)) * orders_per_group(strategy) + 2


def finalists(p: Sequence[float]) -> list[int]:
    """The 10 options of largest joint probability (ties: lower index first), in original order."""
    strongest = sorted(range(len(p)), key=lambda i: (-float(p[i]), i))[:FINALISTS]
    return sorted(strongest)


@dataclass(frozen=True, slots=True)
class GroupItem(Item):
    """A group of a large choice: an ordinary choice item, asked in one order (`luce2-1o`) or both."""

    asked_orders: int = 2

    @property
    def orders(self) -> list[list[int]]:
        return option_orders(len(self.options))[: self.asked_orders]


def sub_item(item: Item, members: Sequence[int], name: str, asked_orders: int) -> GroupItem:
    """The item of `members` (indices into the question's options): same state, question and language."""
    return GroupItem(
        name,
        item.type,
        tuple(item.keys[i] for i in members),
        tuple(item.options[i] for i in members),
        item.lang,
        item.state_text,
        item.question_text,
        asked_orders,
    )


def group_distribution(letter_logits: Sequence[np.ndarray], orders: Sequence[Sequence[int]]) -> np.ndarray:
    """Target of one group: p_avg over the asked orders (one order: the plain letter softmax); no temperature."""
    return distribution([lg[: len(orders[0])] for lg in letter_logits], orders, 1.0).p_avg


@dataclass
class LargeChoice:
    """The rounds of one large choice question and what each taught."""

    item: Item
    strategy: Strategy = DEFAULT_STRATEGY
    groups: list[list[int]] = field(init=False)
    targets: list[np.ndarray] = field(init=False, default_factory=list)
    first_fit: np.ndarray | None = field(init=False, default=None)
    finalists: list[int] = field(init=False, default_factory=list)
    joint: np.ndarray | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not MAX_OPTIONS < len(self.item.options) <= MAX_LARGE_CHOICE:
            raise ValueError(f"a large choice has 11..{MAX_LARGE_CHOICE} options, not {len(self.item.options)}")
        self.groups = groups(len(self.item.options))

    def first_round(self) -> list[GroupItem]:
        asked = orders_per_group(self.strategy)
        return [sub_item(self.item, g, f"{self.item.name}#{k}", asked) for k, g in enumerate(self.groups)]

    def final_round(self, group_logits: Sequence[Sequence[np.ndarray]], cancelled: Cancel = _never) -> GroupItem:
        """Letter logits of every group (per asked order) -> the final group's item."""
        asked = self.first_round()
        return self.take_first_round(
            [group_distribution(lg, it.orders) for lg, it in zip(group_logits, asked, strict=True)], cancelled
        )

    def take_first_round(self, targets: Sequence[np.ndarray], cancelled: Cancel = _never) -> GroupItem:
        """Fit the group distributions; the 10 strongest options become the final group (asked in both orders).
        `cancelled()` is asked between the fit's steps (`Cancelled` once the client is gone)."""
        self.targets = [np.asarray(t, dtype=np.float64) for t in targets]
        self.first_fit = fit(len(self.item.options), self.groups, self.targets, cancelled)
        self.finalists = finalists(self.first_fit)
        return sub_item(self.item, self.finalists, f"{self.item.name}#final", 2)

    def finish(self, final_logits: Sequence[np.ndarray], cancelled: Cancel = _never) -> np.ndarray:
        """Letter logits of the final group's two orders -> the joint distribution."""
        return self.take_final_round(group_distribution(final_logits, option_orders(len(self.finalists))), cancelled)

    def take_final_round(self, final_target: Sequence[float], cancelled: Cancel = _never) -> np.ndarray:
        """Add the final group and refit over all 2g + 1 groups: the joint distribution (before temperature)."""
        targets = [*self.targets, np.asarray(final_target, dtype=np.float64)]
        self.joint = fit(len(self.item.options), [*self.groups, self.finalists], targets, cancelled)
        return self.joint
