"""Part B of the facts block — VAT lines (docs/extensions.md §5.6 vat_rates, §5.8).

A percentage is a VAT rate only when its own sentence says "VAT" or "podat… od towarów"; the first three
AMOUNT matches that are not exchange rates get ``× 1,23`` and ``÷ 1,23`` lines for every such rate.
"""

from __future__ import annotations

from decimal import Decimal

from basal.core.facts import scan
from basal.core.facts.amounts import dec, kk, vat_factor, zl
from basal.core.facts.patterns import AMOUNT, MAX_AMOUNTS, VAT, VAT_CTX
from basal.core.facts.sentences import Sentences


def vat_rates(text: str, sentences: Sentences) -> set[int]:
    """The rates among 23, 8 and 5 stated with VAT context in their own sentence."""
    rates: set[int] = set()
    has_context: dict[int, bool] = {}  # sentence index -> VAT_CTX found in it (each sentence searched once)
    for m in VAT.finditer(text):
        i = sentences.index(m.start())
        if i not in has_context:
            start, end = sentences.range(i)
            has_context[i] = VAT_CTX.search(text[start:end]) is not None
        if has_context[i]:
            rates.add(int(m.group(1)))
    return rates


def vat_lines(text: str, rates: set[int], rate_positions: set[int]) -> tuple[list[str], set[Decimal]]:
    """The B4 lines and the amounts they cover (C7 prints no net/gross line again for a covered amount)."""
    if not rates:
        return [], set()
    amounts = []
    for m in scan.finditer(AMOUNT, text, separator=" "):
        if m.start() not in rate_positions:
            amounts.append(m.group(1))
            if len(amounts) == MAX_AMOUNTS:
                break
    lines, covered = [], set()
    for raw in amounts:
        x = dec(raw)
        for r in sorted(rates, reverse=True):
            k = vat_factor(r)
            lines.append(f"{zl(x)} × {kk(r)} = {zl(x * k)}; {zl(x)} ÷ {kk(r)} = {zl(x / k)}")
        covered.add(x)
    return lines, covered
