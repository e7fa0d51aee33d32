"""Part A of the facts block — calendar lines (docs/extensions.md §5.4, §5.4.1, §5.6, §5.7).

Dates are ``datetime.date`` (proleptic Gregorian, years 1..9999). Impossible dates in the text are skipped;
arithmetic past the range raises Python's own errors, which upstream returns as the request's error (§5.11):
``date value out of range`` (OverflowError) and ``year N is out of range`` (ValueError).
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from functools import lru_cache
from itertools import pairwise

from basal.core.facts.patterns import (
    AGO,
    DATE_ISO,
    DATE_NUM,
    DATE_TXT,
    DUR_WORD,
    DURATION,
    DURATION_WORDS,
    MAX_DATES,
    MAX_DURATIONS,
    MONTHS,
    TODAY,
    WEEKDAYS,
)

TODAY_WINDOW = 40  # characters after "Dziś jest " searched for today's date
SHIFTED_DATES = 3  # dates that get the "+ n units" lines


def easter(year: int) -> date:
    """Easter Sunday, the anonymous Gregorian algorithm (§5.4.1)."""
    a, b, c = year % 19, year // 100, year % 100
    d, e = b // 4, b % 4
    f = (b + 8) // 25
    g = (b - f + 1) // 3
    h = (19 * a + b - d - g + 15) % 30
    i, k = c // 4, c % 4
    l = (32 + 2 * e + 2 * i - h - k) % 7  # noqa: E741 - the algorithm's name
    m = (a + 11 * h + 22 * l) // 451
    t = h + l - 7 * m + 114
    return date(year, t // 31, t % 31 + 1)


@lru_cache(maxsize=64)
def days_off(year: int) -> dict[date, str]:
    """Statutory days off of `year` (Polish law, the same table for every year; Wigilia from 2025)."""
    e = easter(year)
    table = {
        date(year, 1, 1): "Nowy Rok",
        date(year, 1, 6): "Trzech Króli",
        e: "Wielkanoc",
        e + timedelta(days=1): "Poniedziałek Wielkanocny",
        date(year, 5, 1): "Święto Pracy",
        date(year, 5, 3): "Święto Konstytucji 3 Maja",
        e + timedelta(days=49): "Zielone Świątki",
        e + timedelta(days=60): "Boże Ciało",
        date(year, 8, 15): "Wniebowzięcie NMP",
        date(year, 11, 1): "Wszystkich Świętych",
        date(year, 11, 11): "Święto Niepodległości",
        date(year, 12, 25): "Boże Narodzenie",
        date(year, 12, 26): "drugi dzień Bożego Narodzenia",
    }
    if year >= 2025:
        table[date(year, 12, 24)] = "Wigilia Bożego Narodzenia"
    return table


def fmt(d: date) -> str:
    return f"{d.day} {MONTHS[d.month - 1]} {d.year} r."


def _ymd(pattern: re.Pattern[str], m: re.Match[str]) -> tuple[int, int, int]:
    if pattern is DATE_TXT:
        return int(m.group(3)), MONTHS.index(m.group(2)) + 1, int(m.group(1))
    if pattern is DATE_NUM:
        return int(m.group(3)), int(m.group(2)), int(m.group(1))
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def dates(text: str) -> list[date]:
    """Every valid date of the text, once each, in order of first appearance."""
    records = []
    for pattern in (DATE_TXT, DATE_NUM, DATE_ISO):
        for m in pattern.finditer(text):
            try:
                records.append((m.start(), date(*_ymd(pattern, m))))
            except ValueError:
                continue  # 31.02.2024, month 13, year 0000: not a date
    records.sort()
    seen: set[date] = set()
    out = []
    for _, d in records:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _unit(word: str) -> str:
    if word.startswith("d"):
        return "days"
    if word.startswith("ty"):
        return "weeks"
    return "months" if word.startswith("mi") else "years"


def durations(text: str) -> list[tuple[int, str]]:
    """The first 3 distinct (n, unit) durations: numbered ones (not "... temu"), then bare unit words as 1."""
    found: list[tuple[int, str]] = []
    for m in DURATION.finditer(text):
        if len(found) == MAX_DURATIONS:
            return found
        entry = (int(m.group(1)), _unit(m.group(2)))
        if not text.startswith(" temu", m.end()) and entry not in found:
            found.append(entry)
    for m in DUR_WORD.finditer(text):
        if len(found) == MAX_DURATIONS:
            return found
        entry = (1, _unit(m.group(1)))
        if entry not in found:
            found.append(entry)
    return found


def shift(d: date, n: int, unit: str) -> date:
    """`d` + n units, calendar-wise as upstream (a month addition reaching December 9999 fails, §5.13)."""
    if unit == "days":
        return d + timedelta(days=n)
    if unit == "weeks":
        return d + timedelta(days=7 * n)
    if unit == "months":
        t = 12 * d.year + (d.month - 1) + n
        year, month = t // 12, t % 12 + 1
        first_of_next = date(year + 1, 1, 1) if month == 12 else date(year, month + 1, 1)
        last_day = (first_of_next - timedelta(days=1)).day
        return date(year, month, min(d.day, last_day))
    try:
        return date(d.year + n, d.month, d.day)
    except ValueError:  # 29 February -> a common year; a year past 9999 raises again here
        return date(d.year + n, d.month, 28)


def _weekday_line(d: date) -> str:
    line = f"{fmt(d)} to {WEEKDAYS[d.weekday()]}"
    name = days_off(d.year).get(d)
    return f"{line}; dzień ustawowo wolny od pracy ({name})" if name else line


def calendar_lines(text: str) -> list[str]:
    """A2 weekdays, A3 gaps, A4 "n dni temu" before today, A5 durations added to the first dates."""
    ds = dates(text)[:MAX_DATES]
    lines = [_weekday_line(d) for d in ds]
    for a, b in pairwise(ds):
        n = (b - a).days
        lines.append(f"Od {fmt(a)} do {fmt(b)}: {abs(n)} dni ({'później' if n >= 0 else 'wcześniej'})")
    today = TODAY.search(text)
    if today is not None:
        window_dates = dates(text[today.end() : today.end() + TODAY_WINDOW])
        if window_dates:
            t = window_dates[0]
            for m in AGO.finditer(text):
                n = int(m.group(1))
                lines.append(f"{n} dni przed {fmt(t)} to {fmt(t - timedelta(days=n))}")
    durs = durations(text)
    for d in ds[:SHIFTED_DATES]:
        for n, unit in durs:
            p = shift(d, n, unit)
            singular, plural = DURATION_WORDS[unit]
            word = singular if n == 1 else plural
            lines.append(f"{fmt(d)} + {n} {word} (kalendarzowo) = {fmt(p)} ({WEEKDAYS[p.weekday()]})")
    return lines
