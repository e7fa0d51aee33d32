"""Decimal amounts as upstream reads and prints them (docs/extensions.md §5.3, §5.6: dec, q, zl, num, kk).

All arithmetic runs in `CONTEXT`, Python's default decimal context (28 significant digits, ROUND_HALF_EVEN after
every operation, InvalidOperation trapped), whatever the calling thread's context is. ``q`` rounds to cents
half away from zero *after* that 28-digit rounding (double rounding is upstream's behaviour) and raises
``InvalidOperation`` for |x| >= 10**26, whose text is upstream's error message (§5.11).
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Context, Decimal, DivisionByZero, InvalidOperation, Overflow

CONTEXT = Context(prec=28, rounding=ROUND_HALF_EVEN, traps=[InvalidOperation, DivisionByZero, Overflow])
CENT = Decimal("0.01")


def dec(raw: str) -> Decimal:
    """A number as written (``1 200,50``, no-break spaces allowed) -> Decimal."""
    return Decimal(raw.replace(" ", "").replace("\u00a0", "").replace(",", "."))


def q(x: Decimal) -> Decimal:
    return x.quantize(CENT, ROUND_HALF_UP)


def _polish(formatted: str) -> str:
    return formatted.replace(",", " ").replace(".", ",")


def zl(x: Decimal) -> str:
    """An amount in złoty: ``1 396,50 zł``, ``-500,00 zł``."""
    return _polish(f"{q(x):,.2f}") + " zł"


def num(x: Decimal) -> str:
    """A euro amount without unit: whole numbers without decimals (``2 000 000``), others with two (``3,50``)."""
    return _polish(f"{x:,.0f}" if x == x.to_integral_value() else f"{q(x):,.2f}")


def vat_factor(rate: int) -> Decimal:
    return 1 + Decimal(rate) / 100


def kk(rate: int) -> str:
    """The VAT multiplier as printed: ``1,23``."""
    return str(vat_factor(rate)).replace(".", ",")
