"""Two runs of the same requests, compared answer by answer: what changed, by how much, and where.

An answer is *identical* when its bytes are (the strongest statement, and on basal the expected one for a run
against itself); otherwise its decision may still agree, and |Δp| says how far the probabilities moved. The same
comparison as shadow traffic (`basal.core.engine.shadow.compare`), so a replay and a shadow report read alike.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from basal.core.decision.answers import BasalResponse
from basal.core.engine.shadow import compare

WORST = 20  # examples listed in a report, largest |Δp| first


@dataclass(frozen=True)
class Outcome:
    """One request's record in one run: its status and the answer body's bytes."""

    status: int
    body: bytes


@dataclass(frozen=True)
class Change:
    custom_id: str
    question: str
    type: str
    a: str  # decision under A
    b: str  # decision under B
    abs_dp: float
    identical: bool  # the answer's bytes are equal

    @property
    def flip(self) -> bool:
        return self.a != self.b


@dataclass
class Diff:
    """Every compared answer, and the requests that could not be compared (a status other than 200 on a side)."""

    changes: list[Change] = field(default_factory=list)
    unanswered: dict[str, tuple[int, int]] = field(default_factory=dict)  # custom_id -> (status A, status B)

    @property
    def questions(self) -> int:
        return len(self.changes)

    def summary(self) -> dict[str, Any]:
        n = len(self.changes)
        flips = sum(c.flip for c in self.changes)
        changed = sum(not c.identical for c in self.changes)
        dp = [c.abs_dp for c in self.changes]
        by_type: dict[str, list[Change]] = {}
        for c in self.changes:
            by_type.setdefault(c.type, []).append(c)
        return {
            "requests": len({c.custom_id for c in self.changes}) + len(self.unanswered),
            "questions": n,
            "identical": n - changed,
            "changed": changed,
            "flips": flips,
            "flip_rate": flips / n if n else 0.0,
            "changed_rate": changed / n if n else 0.0,
            "max_abs_dp": max(dp, default=0.0),
            "unanswered": len(self.unanswered),
            "types": {kind: _type_summary(cs) for kind, cs in sorted(by_type.items())},
            "per_question": _per_question(self.changes),
        }

    def worst(self, k: int = WORST) -> list[Change]:
        moved = [c for c in self.changes if not c.identical]
        return sorted(moved, key=lambda c: (not c.flip, -c.abs_dp, c.custom_id, c.question))[:k]


def _type_summary(changes: Sequence[Change]) -> dict[str, Any]:
    dp = np.array([c.abs_dp for c in changes], dtype=np.float64)
    return {
        "questions": len(changes),
        "identical": sum(c.identical for c in changes),
        "flips": sum(c.flip for c in changes),
        "mean_abs_dp": float(dp.mean()),
        "p99_abs_dp": float(np.quantile(dp, 0.99)),
        "max_abs_dp": float(dp.max()),
        "flip_pairs": dict(Counter(f"{c.a} -> {c.b}" for c in changes if c.flip).most_common(10)),
    }


def _per_question(changes: Sequence[Change]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for c in changes:
        row = out.setdefault(c.question, {"type": c.type, "asked": 0, "agree": 0, "identical": 0})
        row["asked"] += 1
        row["agree"] += not c.flip
        row["identical"] += c.identical
    for row in out.values():
        row["agreement"] = row["agree"] / row["asked"]
    return out


def _answers(body: bytes) -> dict[str, tuple[Any, bytes]]:
    """Question name -> (the answer as a struct, its exact bytes)."""
    raw = msgspec.json.decode(body, type=dict[str, Any])
    typed = msgspec.json.decode(body, type=BasalResponse)
    return {name: (typed.answers[name], msgspec.json.encode(value)) for name, value in raw["answers"].items()}


def diff(a: Mapping[str, Outcome], b: Mapping[str, Outcome]) -> Diff:
    """Compare the runs request by request (by custom_id), answer by answer (by question name)."""
    out = Diff()
    for custom_id in sorted(a.keys() | b.keys()):
        left, right = a.get(custom_id), b.get(custom_id)
        if left is None or right is None or left.status != 200 or right.status != 200:
            out.unanswered[custom_id] = (left.status if left else 0, right.status if right else 0)
            continue
        answers_a, answers_b = _answers(left.body), _answers(right.body)
        for name, (answer_a, bytes_a) in answers_a.items():
            if name not in answers_b:
                continue
            answer_b, bytes_b = answers_b[name]
            kind = type(answer_a).__struct_config__.tag
            c = compare(name, str(kind), answer_a, answer_b)
            out.changes.append(Change(custom_id, name, str(kind), c.primary, c.shadow, c.abs_dp, bytes_a == bytes_b))
    return out


FAIL_ON = re.compile(r"^\s*(\w+)\s*(<=|>=|<|>|==)\s*([0-9.eE+-]+)\s*$")


def failures(summary: Mapping[str, Any], spec: str) -> list[str]:
    """`--fail-on "flips>0.01,max_abs_dp>0.05"`: the conditions that hold (each a reason to fail). A rate is a
    share: `flips` and `changed` read `flip_rate` and `changed_rate`; every other name a number of the summary."""
    ops = {"<": float.__lt__, "<=": float.__le__, ">": float.__gt__, ">=": float.__ge__, "==": float.__eq__}
    aliases = {"flips": "flip_rate", "changed": "changed_rate"}
    out = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = FAIL_ON.match(part)
        if m is None:
            raise ValueError(f"--fail-on {part!r}: write NAME>NUMBER (e.g. flips>0.01), comma-separated")
        name, op, value = m.groups()
        key = aliases.get(name, name)
        if key not in summary or not isinstance(summary[key], int | float):
            names = ", ".join(["flips", "changed", *(k for k, v in summary.items() if isinstance(v, int | float))])
            raise ValueError(f"--fail-on {part!r}: unknown measure {name!r}; measures: {names}")
        if ops[op](float(summary[key]), float(value)):
            out.append(f"{part} ({key} = {summary[key]:g})")
    return out
