"""The facts block: assembly, limits and errors (docs/extensions.md §5.2, §5.10, §5.11).

``inject(state)`` is what ``facts: "auto"`` does to a state: the state unchanged when no fact is found, else
the state, a blank line, the header and one ``- `` line per fact. Calendar and VAT lines are never cut;
money lines fill the room left up to 12 lines. Part C always runs in full, so its errors surface even
when none of its lines is shown.
"""

from __future__ import annotations

from decimal import DecimalException, localcontext

from basal.core.facts.amounts import CONTEXT
from basal.core.facts.calendar import calendar_lines
from basal.core.facts.exchange import ExchangeRates
from basal.core.facts.money import money_lines
from basal.core.facts.patterns import HEADER, MAX_COMPARE, MAX_TOTAL
from basal.core.facts.sentences import Sentences
from basal.core.facts.stated import StatedAmounts
from basal.core.facts.vat import vat_lines, vat_rates


class FactsError(Exception):
    """Upstream's facts computation raised: `str(self)` is Python's text, `kind` its exception class name."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def fact_lines(text: str) -> list[str]:
    """The fact lines of `text` (without the ``- `` prefix); FactsError where upstream raises."""
    try:
        with localcontext(CONTEXT):
            return _lines(text)
    except (OverflowError, ValueError, DecimalException) as e:
        raise FactsError(str(e), type(e).__name__) from e


def _lines(text: str) -> list[str]:
    lines = calendar_lines(text)
    sentences = Sentences(text)
    stated = StatedAmounts(text)
    rates = ExchangeRates(text, stated)
    vat = vat_rates(text, sentences)
    b_lines, covered = vat_lines(text, vat, rates.positions)
    lines += b_lines
    calc, comps = money_lines(text, sentences, stated, rates, vat, covered)
    room = max(0, MAX_TOTAL - len(lines))
    calc = calc[:room]
    comps = comps[: min(MAX_COMPARE, room - len(calc))]
    return lines + calc + comps


def inject(state: str) -> str:
    """`state` with its facts block appended (unchanged when there are no facts)."""
    lines = fact_lines(state)
    if not lines:
        return state
    return state + "\n\n" + HEADER + "".join("\n- " + line for line in lines)
