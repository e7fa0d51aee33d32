"""The rules of docs/extensions.md §5 one by one, and the property that the state is never changed, only extended."""

from __future__ import annotations

from datetime import date
from decimal import Decimal, InvalidOperation, getcontext, localcontext

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basal.core.facts import FactsError, fact_lines, inject
from basal.core.facts.amounts import CONTEXT, kk, num, q, zl
from basal.core.facts.calendar import days_off, easter, shift
from basal.core.facts.patterns import HEADER


@pytest.mark.parametrize(
    ("year", "day"), [(2024, date(2024, 3, 31)), (2025, date(2025, 4, 20)), (2026, date(2026, 4, 5))]
)
def test_easter(year, day):
    assert easter(year) == day


def test_days_off_and_wigilia_from_2025():
    assert len(days_off(2024)) == 13 and len(days_off(2025)) == 14
    assert days_off(2026)[date(2026, 6, 4)] == "Boże Ciało" and days_off(2026)[date(2026, 5, 24)] == "Zielone Świątki"


def test_shift_months_and_years_as_upstream():
    assert shift(date(2024, 1, 31), 1, "months") == date(2024, 2, 29)
    assert shift(date(2024, 2, 29), 1, "years") == date(2025, 2, 28)
    with pytest.raises(ValueError, match="year 10000 is out of range"):
        shift(date(9999, 11, 5), 1, "months")  # lands in December 9999, which exists: upstream fails (§5.13)


def test_amount_formats():
    with localcontext(CONTEXT):
        assert zl(Decimal("1396.5")) == "1 396,50 zł" and zl(Decimal(-500)) == "-500,00 zł"
        assert zl(Decimal("0.004")) == "0,00 zł" and zl(Decimal(8754000)) == "8 754 000,00 zł"
        assert num(Decimal(2000000)) == "2 000 000" and num(Decimal("3.5")) == "3,50"
        assert [kk(r) for r in (23, 8, 5)] == ["1,23", "1,08", "1,05"]
        assert q(Decimal(1000) / Decimal("1.23")) == Decimal("813.01")  # 28-digit rounding first, then cents
        with pytest.raises(InvalidOperation) as e:
            q(Decimal(10) ** 26)
        assert str(e.value) == "[<class 'decimal.InvalidOperation'>]"


def test_the_callers_decimal_context_does_not_matter():
    state = "Zamówienie: 3 × 465,50 zł netto. Stawka VAT 23%. Faktura na 4 670,00 zł brutto."
    expected = inject(state)
    with localcontext() as ctx:
        ctx.prec, ctx.traps[InvalidOperation] = 4, False
        assert inject(state) == expected
    assert getcontext().prec == 28


def test_no_facts_leaves_the_state_byte_identical():
    for state in ("", "Order 42 was late.", "Zwrot 5% wartości.", "\n\n"):
        assert inject(state) == state


def test_english_block_without_polish_letters():
    assert inject("Delivered 2024-02-06.").endswith("\n- 6 lutego 2024 r. to wtorek")


def test_errors_carry_the_exception_class():
    with pytest.raises(FactsError) as e:
        inject("Data 31.12.9999 i 7 dni.")
    assert (str(e.value), e.value.kind) == ("date value out of range", "OverflowError")


FRAGMENTS = [
    "Dziś jest ",
    "15 kwietnia 2026 r.",
    "3.04.2026",
    "2026-04-05",
    "31.02.2024",
    " 3 dni temu",
    " 14 dni",
    " 2 miesiące",
    " rok",
    " 465,50 zł",
    " 1 200,00 zł netto",
    " 4 670,00 zł brutto",
    " VAT 23%",
    " 8%",
    " 5 %",
    " 120 000 euro",
    " Kurs 4,3150 zł",
    " 1 EUR = 4,31 zł",
    " Budżet",
    " wydano",
    " 3 × ",
    " 2 szt. × ",
    " od 20 do 99 szt.",
    " poniżej 20 szt.",
    " zamawia 98 szt.",
    " Dostawa",
    ". ",
    "; ",
    "\n",
    " Ą",
    "x",
    "1",
    " ",
    "\u00a0",
    ",",
    "-",
    "×",
]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=24))
def test_output_starts_with_the_unchanged_state(parts):
    state = "".join(parts)
    try:
        out, lines = inject(state), fact_lines(state)
    except FactsError:
        return  # upstream's error (only dates past 9999 or amounts >= 10**26 raise)
    assert out.startswith(state)
    if lines:
        assert out == state + "\n\n" + HEADER + "".join("\n- " + line for line in lines)
        assert all("\n" not in line for line in lines)
    else:
        assert out == state
