"""Two synthetic models under their own names ("small", "large": demo shapes, other seeds) and one process's
engines serving both: what the cascade tests escalate between."""

from __future__ import annotations

import json
from pathlib import Path

from basal.backends.cuda.backend import TorchBackend
from basal.core.engine.engine import Engine
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model

SEEDS = {"small": 1, "large": 2}
# one request of every question type (a multi of two labels) about one state
QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Does this convey urgency?"},
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {"billing": "Payments", "technical": "Bugs", "sales": "Plans"},
    },
    "angry": {"type": "noul", "instructions": "Is the customer angry?"},
    "severity": {"type": "score", "instructions": "How severe is it?", "criteria": ["low", "mid", "high"]},
    "topics": {"type": "multi", "instructions": "Which topics apply?", "criteria": {"pay": None, "bug": None}},
}
STATE = "Help! My payouts have been failing for 3 days and nobody answers."


def write_models(root: Path) -> dict[str, Path]:
    """A model directory per name; `basal.json` names it (so `basal serve --config` serves it under that name)."""
    out = {}
    for name, seed in SEEDS.items():
        path = synth_model(root / name, "demo", seed=seed)
        meta = json.loads((path / "basal.json").read_text())
        (path / "basal.json").write_text(json.dumps({**meta, "name": name}))
        out[name] = path
    return out


def two_engines(root: Path) -> Engines:
    """Started engines of both models (one gate, one metrics registry); close them when done."""
    metrics, gate = Metrics(), Gate()
    built = {}
    for name, path in write_models(root).items():
        model = ModelDir.load(path)
        built[name] = Engine(name, Pipeline(model, TorchBackend.load(model)), gate, metrics)
    engines = Engines(built, "small", metrics)
    engines.start()
    return engines
