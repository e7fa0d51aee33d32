"""Part C of the facts block — money arithmetic (docs/extensions.md §5.9 C3–C6; C0–C2 and C7–C8 in their modules).

Every step claims the stated amounts it uses (see `stated`), so an amount is an operand of at most one line.
Steps add *subjects* (value, label, source amount) — the totals that the net/gross and comparison lines
(`compare`) talk about — and *refs*, computed values that are compared too.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field
from decimal import Decimal

from basal.core.facts import scan
from basal.core.facts.amounts import dec, q, zl
from basal.core.facts.compare import Subject, comparison_lines, net_gross_lines
from basal.core.facts.exchange import ExchangeRates, euro_lines
from basal.core.facts.patterns import (
    BUDGET,
    FEE,
    MAX_LIST_ITEMS,
    MAX_LISTS,
    PRODUCT,
    QTY,
    QTY_PRE,
    TIER,
    USED,
)
from basal.core.facts.sentences import Sentences
from basal.core.facts.stated import Stated, StatedAmounts

BUDGET_WINDOW = 80  # characters after "budżet…" searched for its amount
USED_WINDOW = 40  # characters after "wydano" searched for the amount spent
FEE_WINDOW = 30  # characters after "dostawa" searched for the fee
_TIMES_AFTER = re.compile(r"[ \u00a0]?×")


@dataclass
class MoneyFacts:
    """The state of part C while its steps run in order."""

    text: str
    sentences: Sentences
    stated: StatedAmounts
    calc: list[str] = field(default_factory=list)
    subjects: list[Subject] = field(default_factory=list)
    refs: list[Decimal] = field(default_factory=list)

    def budget(self) -> None:
        """C3: ``budżet 5 000,00 zł − wykorzystano 1 800,00 zł = 3 200,00 zł`` (the first "budżet" only)."""
        m = BUDGET.search(self.text)
        b = self.stated.first_free(m.end(), BUDGET_WINDOW) if m else None
        if b is None:
            return
        near = (self.sentences.index(b.start), self.sentences.index(b.start) + 1)
        used: list[tuple[str, Stated]] = []
        taken = {id(b)}
        for u in USED.finditer(self.text):
            if self.sentences.index(u.start()) not in near:
                continue
            x = self.stated.first_free(u.end(), USED_WINDOW)
            if x is not None and id(x) not in taken:
                taken.add(id(x))
                used.append((u.group(1), x))
        if not used:
            return
        spent = Decimal(0)
        for _, x in used:
            spent += x.value
        rest = b.value - spent
        terms = "".join(f" − {word} {zl(x.value)}" for word, x in used)
        self.calc.append(f"budżet {zl(b.value)}{terms} = {zl(rest)}")
        for _, x in [("", b), *used]:
            x.use = "op"
        self.refs.append(q(rest))

    def products(self) -> None:
        """C4: ``3 × 465,50 zł = 1 396,50 zł`` per item and the list total, for the first 2 lists (by sentence)."""
        lists: dict[int, list[tuple[int, Stated]]] = {}
        for m in PRODUCT.finditer(self.text):
            a, n = self.stated.at(m.end()), int(m.group(1))
            if a is None or not a.free or n <= 0:
                continue
            sentence = self.sentences.index(m.start())
            if sentence not in lists and len(lists) == MAX_LISTS:
                break  # sentences only grow along the text: no later match joins the first two lists
            lists.setdefault(sentence, []).append((n, a))
        for items in lists.values():
            items = items[:MAX_LIST_ITEMS]
            labels = {a.label for _, a in items}
            label = labels.pop() if len(labels) == 1 else None
            if len(items) == 1 and items[0][0] == 1:
                a = items[0][1]
                a.use = "subj"
                self.subjects.append(Subject(a.value, label, a))
                continue
            totals = []
            for n, a in items:
                total = n * a.value
                if n > 1:
                    self.calc.append(f"{n} × {zl(a.value)} = {zl(total)}")
                totals.append(total)
                a.use = "op"
            whole = Decimal(0)
            for t in totals:
                whole += t
            if len(items) >= 2:
                self.calc.append(" + ".join(zl(t) for t in totals) + f" = {zl(whole)}")
            self.subjects.append(Subject(whole, label, None))

    def tiers(self) -> None:
        """C5: the price of the one tier a single ordered quantity falls in: ``20 ≤ 98 ≤ 99; 98 × … = …``."""
        tiers = list(scan.finditer(TIER, self.text))
        if len(tiers) < 2:
            return
        starts, ends = [t.start() for t in tiers], [t.end() for t in tiers]
        quantities = set()
        for m in QTY.finditer(self.text):
            p = m.start()
            i = bisect_right(starts, p) - 1
            if i >= 0 and p < ends[i]:
                continue  # a quantity of the price list itself
            if _TIMES_AFTER.match(self.text, m.end()) or any(self.text.endswith(pre, 0, p) for pre in QTY_PRE):
                continue
            quantities.add(int(m.group(1)))
        if len(quantities) == 1:
            (n,) = quantities
            matching = [(cond, t) for t in tiers if (cond := _tier_condition(t, n)) is not None]
            if len(matching) == 1:
                cond, t = matching[0]
                price = dec(t.group(1))
                self.calc.append(f"{cond}; {n} × {zl(price)} = {zl(n * price)}")
                self.subjects.append(Subject(n * price, None, None))
        for t in tiers:
            a = self.stated.at(t.start(1))
            if a is not None and a.free:
                a.use = "op"

    def fee(self) -> None:
        """C6: the one subject plus the first delivery fee found after ``dostawa``/``wysyłka``/…"""
        if len(self.subjects) != 1:
            return
        total = self.subjects[0].value
        for m in FEE.finditer(self.text):
            f = self.stated.first_free(m.end(), FEE_WINDOW)
            if f is not None:
                self.calc.append(f"{zl(total)} + {zl(f.value)} = {zl(total + f.value)}")
                f.use = "op"
                return


def _tier_condition(tier: re.Match[str], n: int) -> str | None:
    """The condition text of `tier` if quantity `n` satisfies it, else None."""
    kind, x, y = tier.group(2), int(tier.group(3)), tier.group(4) or tier.group(5)
    if kind == "poniżej":
        return f"{n} < {x}" if n < x else None
    if kind == "do":
        return f"{n} ≤ {x}" if n <= x else None
    if kind == "powyżej":
        return f"{n} > {x}" if n > x else None
    if y is not None:
        return f"{x} ≤ {n} ≤ {y}" if x <= n <= int(y) else None
    return f"{n} ≥ {x}" if n >= x else None


def money_lines(
    text: str, sentences: Sentences, stated: StatedAmounts, rates: ExchangeRates, vat: set[int], covered: set[Decimal]
) -> tuple[list[str], list[str]]:
    """Part C in full: (calc lines of C2–C7 in order, comparison lines of C8)."""
    money = MoneyFacts(text, sentences, stated)
    money.calc, money.refs = euro_lines(text, sentences, stated, rates)
    money.budget()
    money.products()
    money.tiers()
    money.fee()
    lines, pool = net_gross_lines(money.subjects, money.refs, stated, vat, covered)
    return money.calc + lines, comparison_lines(pool)
