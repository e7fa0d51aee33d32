"""The stated amounts of part C (docs/extensions.md §5.9 C0): every STATED match, what it was used for, lookups.

Each amount starts ``free`` and is claimed at most once by a later step: ``rate`` (an exchange rate, C1),
``alias`` (the złoty value of a euro amount, C2), ``op`` (an operand of a calc line, C3–C6) or ``subj`` (a
subject of the net/gross and comparison lines, C4/C7).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from decimal import Decimal

from basal.core.facts import scan
from basal.core.facts.amounts import dec
from basal.core.facts.patterns import LABEL, STATED
from basal.core.facts.sentences import cut


@dataclass(eq=False, slots=True)
class Stated:
    start: int
    value: Decimal
    label: str | None  # "netto" / "brutto" right after the amount
    use: str = "free"

    @property
    def free(self) -> bool:
        return self.use == "free"


class StatedAmounts:
    def __init__(self, text: str):
        self.text = text
        self.items: list[Stated] = []
        for m in scan.finditer(STATED, text):
            label = LABEL.match(text, m.end())
            self.items.append(Stated(m.start(), dec(m.group(1)), label.group(1) if label else None))
        self._starts = [a.start for a in self.items]
        self._by_start = {a.start: a for a in self.items}

    def at(self, position: int) -> Stated | None:
        """The amount that starts exactly at `position`."""
        return self._by_start.get(position)

    def first_free(self, start: int, n: int) -> Stated | None:
        """The first free amount starting in the window of `n` characters at `start`, cut at a sentence bound."""
        limit = start + len(cut(self.text, start, n))
        for i in range(bisect_left(self._starts, start), len(self.items)):
            a = self.items[i]
            if a.start >= limit:
                return None
            if a.free:
                return a
        return None
