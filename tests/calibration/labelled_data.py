"""Labelled request files for the calibration tests: states, questions of every fitted type, gold answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TEAMS = {"billing": "Payments, invoicing, refunds", "technical": "Bugs, outages", "sales": "Plans and prices"}
LEVELS = ["none", "low", "high"]


def request(state: str, rng: np.random.Generator, questions: int = 5) -> tuple[dict, dict]:
    """One /v1/systemone request about `state` and a gold answer per question (drawn at random)."""
    qs: dict[str, dict] = {}
    for i in range(questions):
        kind = ("noul", "choice", "score")[i % 3]
        if kind == "noul":
            qs[f"q{i}"] = {"type": "noul", "instructions": f"Is this message about topic {i}?"}
            gold = bool(rng.integers(2))
        elif kind == "choice":
            qs[f"q{i}"] = {"type": "choice", "instructions": f"Which team should handle it ({i})?", "criteria": TEAMS}
            gold = str(rng.choice(list(TEAMS)))
        else:
            qs[f"q{i}"] = {"type": "score", "instructions": f"How urgent is it ({i})?", "criteria": LEVELS}
            gold = int(rng.integers(len(LEVELS)))
        qs[f"q{i}"]["gold"] = gold
    return {"model": "jev-latest", "state": state, "questions": qs}, {}


def write_labelled(path: Path, lines: int, states: int, questions: int = 5, seed: int = 0) -> Path:
    """`lines` requests over `states` states, grouped by state (a state's lines stay on one side of a split)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in range(lines):
        s = n % states
        body, _ = request(f"Customer {s} writes: my payout number {s * 7 % 13} failed again.", rng, questions)
        body |= {"id": f"r{n}", "group": f"state-{s}"}
        out.append(json.dumps(body))
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path
