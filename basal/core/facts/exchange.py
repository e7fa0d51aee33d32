"""Exchange rates and euro amounts in złoty (docs/extensions.md §5.9 C1, C2).

C1 collects rates written after ``kurs…``, as ``4,31 zł za 1 euro`` / ``zł/EUR``, as ``1 EUR = 4,31 zł`` and
inside ``100 euro × 4,31 zł``; only 1 < rate < 10 is kept. C2 converts the first three distinct euro amounts
with the rate that belongs to them (explicit, the only one, or the only one in their sentence).
"""

from __future__ import annotations

import re
from decimal import Decimal

from basal.core.facts import scan
from basal.core.facts.amounts import dec, num, q, zl
from basal.core.facts.patterns import EURO, EURO_X_RATE, KURS, MAX_EURO, RATE_ANY, RATE_EQ, RATE_PER
from basal.core.facts.sentences import Sentences, cut
from basal.core.facts.stated import StatedAmounts

KURS_WINDOW = 160  # characters after "kurs…" searched for a rate
_EQUALS_AFTER = re.compile(r"\s*=")  # "1 EUR = 4,31 zł": the euro amount is part of a rate


class ExchangeRates:
    """C1: the kept rate records (position, raw) in order, the explicit rates by euro position, distinct values."""

    def __init__(self, text: str, stated: StatedAmounts):
        records: list[tuple[int, str]] = []
        for k in KURS.finditer(text):
            window = cut(text, k.end(), KURS_WINDOW)
            records += [(k.end() + r.start(1), r.group(1)) for r in RATE_ANY.finditer(window)]
        records += [(r.start(1), r.group(1)) for r in RATE_PER.finditer(text)]
        records += [(r.start(1), r.group(1)) for r in RATE_EQ.finditer(text)]
        explicit = {m.start(1): (m.start(2), m.group(2)) for m in scan.finditer(EURO_X_RATE, text)}
        records += explicit.values()
        self.value = {raw: dec(raw) for _, raw in records}  # a rate is usually written the same way many times
        self.records = [(p, raw) for p, raw in records if 1 < self.value[raw] < 10]
        kept = set(self.records)
        self.explicit = {euro: rate for euro, rate in explicit.items() if rate in kept}
        self.positions = {p for p, _ in self.records}
        self.distinct: dict[Decimal, str] = {}
        for raw in dict.fromkeys(raw for _, raw in self.records):  # first record of each value, in order
            self.distinct.setdefault(self.value[raw], raw)
        for p in self.positions:
            a = stated.at(p)
            if a is not None:
                a.use = "rate"

    def rate_for(self, euro_start: int, sentences: Sentences) -> str | None:
        """The rate (as written) of the euro amount at `euro_start`, or None when it is ambiguous."""
        if euro_start in self.explicit:
            return self.explicit[euro_start][1]
        if len(self.distinct) == 1:
            return next(iter(self.distinct.values()))
        sentence = sentences.index(euro_start)
        near: dict[Decimal, str] = {}
        for p, raw in self.records:
            if sentences.index(p) == sentence:
                near[self.value[raw]] = raw
        return next(iter(near.values())) if len(near) == 1 else None


def euro_amounts(text: str) -> list[tuple[int, Decimal]]:
    """The first 3 distinct euro amounts (start, value) that are not the "za 1 euro" / "1 EUR =" of a rate."""
    listed: list[tuple[int, Decimal]] = []
    for m in scan.finditer(EURO, text):
        if text.endswith("za ", 0, m.start()) or _EQUALS_AFTER.match(text, m.end()):
            continue
        v = dec(m.group(1))
        if all(v != w for _, w in listed):
            listed.append((m.start(), v))
            if len(listed) == MAX_EURO:
                break
    return listed


def euro_lines(
    text: str, sentences: Sentences, stated: StatedAmounts, rates: ExchangeRates
) -> tuple[list[str], list[Decimal]]:
    """C2: ``120 000 euro × 4,3150 zł = 517 800,00 zł`` lines and their złoty values (refs of the comparisons)."""
    lines, refs = [], []
    for start, v in euro_amounts(text):
        raw = rates.rate_for(start, sentences)
        if raw is None:
            continue
        c = q(v * dec(raw))
        lines.append(f"{num(v)} euro × {raw} zł = {zl(c)}")
        sentence = sentences.index(start)
        for a in stated.items:
            if a.free and a.value == c and sentences.index(a.start) == sentence:
                a.use = "alias"
        refs.append(c)
    return lines, refs
