"""Net/gross lines and comparisons (docs/extensions.md §5.9 C7, C8).

The pool holds every value worth comparing: each subject and its net/gross counterpart (kind 0), the refs
of C2/C3 (kind 2) and the amounts no step used (kind 1, "plain"). The comparison lines are the first 6 pairs
of different groups, pairs with fewer plain members first.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from itertools import chain, islice

from basal.core.facts.amounts import kk, q, vat_factor, zl
from basal.core.facts.patterns import MAX_COMPARE, MAX_PLAIN
from basal.core.facts.stated import Stated, StatedAmounts

SUBJECT, PLAIN, REF = 0, 1, 2  # pool kinds


@dataclass(slots=True)
class Subject:
    """A total the net/gross and comparison lines talk about (C4, C5, C7)."""

    value: Decimal
    label: str | None
    source: Stated | None  # the stated amount itself, or None for a computed total


@dataclass(frozen=True, slots=True)
class Entry:
    value: Decimal
    kind: int
    group: int  # entries of one group (a subject and its net/gross value) are never compared


def net_gross_lines(
    subjects: list[Subject], refs: list[Decimal], stated: StatedAmounts, vat: set[int], covered: set[Decimal]
) -> tuple[list[str], list[Entry]]:
    """C7: labelled free amounts become subjects; with one VAT rate each labelled subject gets its other value.

    Returns the calc lines and the pool (subjects first, then refs, then plain amounts).
    """
    for a in stated.items:
        if a.free and a.label:
            a.use = "subj"
            subjects.append(Subject(a.value, a.label, a))
    rate = next(iter(vat)) if len(vat) == 1 else None
    lines, pool = [], []
    for g, s in enumerate(subjects):
        pool.append(Entry(q(s.value), SUBJECT, g))
        if rate is None or not s.label:
            continue
        k = vat_factor(rate)
        netto = s.label == "netto"
        other = s.value * k if netto else s.value / k
        if s.source is None or s.source.value not in covered:
            lines.append(
                f"{zl(s.value)} {s.label} {'×' if netto else '÷'} {kk(rate)} = {zl(other)} "
                f"{'brutto' if netto else 'netto'}"
            )
        pool.append(Entry(q(other), SUBJECT, g))
    pool += [Entry(c, REF, -1 - i) for i, c in enumerate(refs)]
    pool += [Entry(a.value, PLAIN, -100 - i) for i, a in enumerate(stated.items) if a.free]
    return lines, pool


def _pairs(entries: list[Entry]) -> Iterator[tuple[int, int]]:
    """Pairs (i < j) of different groups in the order (plain members, i, j), lazily: the pool can be long.

    Plain entries come last in the pool, so a pair with one plain member is (non-plain i, plain j).
    """
    others = [i for i, e in enumerate(entries) if e.kind != PLAIN]
    plain = [i for i, e in enumerate(entries) if e.kind == PLAIN]
    no_plain = (
        (others[a], others[b])
        for a in range(len(others))
        for b in range(a + 1, len(others))
        if entries[others[a]].group != entries[others[b]].group
    )
    one_plain = ((i, j) for i in others for j in plain)
    two_plain = (
        ((plain[a], plain[b]) for a in range(len(plain)) for b in range(a + 1, len(plain)))
        if len(plain) <= MAX_PLAIN
        else ()
    )
    return chain(no_plain, one_plain, two_plain)


def comparison_lines(pool: list[Entry]) -> list[str]:
    """C8: ``3 796,50 zł < 4 670,00 zł`` for the first 6 pairs; the entry of smaller kind is written first."""
    seen: set[tuple[Decimal, int]] = set()
    entries = []
    for e in pool:
        if (e.value, e.kind) not in seen:
            seen.add((e.value, e.kind))
            entries.append(e)
    lines = []
    for i, j in islice(_pairs(entries), MAX_COMPARE):
        first, second = (entries[i], entries[j]) if entries[i].kind <= entries[j].kind else (entries[j], entries[i])
        op = ">" if first.value > second.value else "<" if first.value < second.value else "="
        lines.append(f"{zl(first.value)} {op} {zl(second.value)}")
    return lines
