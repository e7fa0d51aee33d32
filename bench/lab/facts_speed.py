"""Time of ``facts: "auto"`` per state, against the forward of the same state (it runs on the request path).

    python -m bench.lab.facts_speed                        # corpus + 16k-token state; demo and mini (2 layers), CPU
    python -m bench.lab.facts_speed --mini-layers 0        # demo only (quick)

1. The corpus: every state of the facts vectors (tests/data/extensions/facts.jsonl), injected `--reps` times.
2. A state of `--tokens` tokens made of those states (facts-rich Polish text; not the 6 that raise), and two
   adversarial states of the same length in characters (a chain of thousands groups; "Kurs 4,31 zł" repeated,
   the slowest input found): facts time per state.
3. Facts vs one decision (one yes/no question, both option orders, facts off) on the same corpus state of
   `--forward-tokens` tokens, with the demo model and the mini shapes cut to `--mini-layers` layers. On a CPU a
   16k-token decision takes many minutes, hence the smaller default; the long states' ratios use that decision
   scaled linearly to their tokens (attention grows faster, so the real ratio is lower still).
   The synthetic models are written with 32768 positions so that a 16k-token state fits (the presets have 8192).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from basal.backends.cuda.backend import TorchBackend
from basal.core.engine.pipeline import Pipeline
from basal.core.facts import FactsError, inject
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import PRESETS, Preset, synth_model
from basal.core.request.dialects import parse_systemone

VECTORS = Path(__file__).resolve().parents[2] / "tests" / "data" / "extensions" / "facts.jsonl"
POSITIONS = 32768


def corpus() -> list[dict]:
    records = [json.loads(line) for line in VECTORS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in records if "state" in r]


def time_facts(state: str, reps: int) -> float:
    """Median seconds of one injection."""
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        with contextlib.suppress(FactsError):  # an upstream error costs its time too
            inject(state)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def long_state(states: list[str], tokenizer, target: int) -> str:
    """Corpus states joined until the text has `target` tokens (cut back to at most `target`)."""
    parts: list[str] = []
    i = 0
    while len(tokenizer.encode(" ".join(parts))) < target:
        parts += states[i % len(states) : i % len(states) + 16]
        i += 16
    while len(tokenizer.encode(" ".join(parts))) > target:
        parts.pop()
    return " ".join(parts)


def model_with_positions(tmp: Path, preset: str, layers: int | None) -> ModelDir:
    """A synthetic model with the preset's shapes and POSITIONS positions (a bench-local preset)."""
    name = f"{preset}-{POSITIONS // 1024}k"
    base = PRESETS[preset]
    PRESETS[name] = Preset(dataclasses.replace(base.config, max_position_embeddings=POSITIONS), base.description)
    return ModelDir.load(synth_model(tmp / name, name, layers=layers))


def time_decision(model: ModelDir, state: str, reps: int) -> float:
    pipeline = Pipeline(model, TorchBackend.load(model, dtype="f32"))
    body = {"model": "m", "state": state, "questions": {"q": {"type": "noul", "instructions": "Czy w terminie?"}}}
    request = parse_systemone(body, lambda m: m)
    pipeline.decide(parse_systemone({**body, "state": state[:200]}, lambda m: m))  # warm-up
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        pipeline.decide(request)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=20, help="repetitions of the corpus and of each long state's facts")
    ap.add_argument("--forward-tokens", type=int, default=2048, help="state size of the facts-vs-decision part")
    ap.add_argument("--forward-reps", type=int, default=3)
    ap.add_argument("--mini-layers", type=int, default=2, help="layers of the mini shapes (0: skip mini)")
    ap.add_argument("--out", default="bench/results/facts_speed.json")
    a = ap.parse_args()

    records = corpus()
    states = [r["state"] for r in records]
    per_state = [time_facts(s, a.reps) for s in states]
    result: dict = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "corpus": {
            "states": len(states),
            "mean_chars": statistics.mean(len(s) for s in states),
            "mean_us": statistics.mean(per_state) * 1e6,
            "median_us": statistics.median(per_state) * 1e6,
            "max_us": max(per_state) * 1e6,
        },
    }
    with tempfile.TemporaryDirectory() as tmp:
        models = {"demo": model_with_positions(Path(tmp), "demo", None)}
        if a.mini_layers:
            models[f"mini, {a.mini_layers} layers"] = model_with_positions(Path(tmp), "mini", a.mini_layers)
        tokenizer = models["demo"].tokenizer
        text = long_state([r["state"] for r in records if "expected_error" not in r], tokenizer, a.tokens)
        chars = len(text)
        inputs = {
            "corpus states": text,
            "thousands-group chain": ("1" + " 000" * (chars // 4))[:chars],
            '"Kurs 4,31 zł" repeated': ("Kurs 4,31 zł " * (chars // 13 + 1))[:chars],
        }
        rows = []
        for name, state in inputs.items():
            facts_s = time_facts(state, max(3, a.reps // 4))
            row = {
                "state": name,
                "chars": len(state),
                "tokens": len(tokenizer.encode(state)),
                "facts_ms": facts_s * 1e3,
            }
            rows.append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)
        short = long_state([r["state"] for r in records if "expected_error" not in r], tokenizer, a.forward_tokens)
        same = {"tokens": len(tokenizer.encode(short)), "facts_ms": time_facts(short, a.reps) * 1e3}
        decisions = {}
        for model_name, model in models.items():
            decisions[model_name] = time_decision(model, short, a.forward_reps) * 1e3
            print(json.dumps({"decision_ms": decisions[model_name], "model": model_name}), flush=True)
        same["facts/decision"] = {m: same["facts_ms"] / ms for m, ms in decisions.items()}
        for row in rows:  # the decision of that state estimated as the measured one scaled linearly to its tokens
            scale = row["tokens"] / same["tokens"]
            row["facts/decision, linear estimate"] = {m: row["facts_ms"] / (scale * ms) for m, ms in decisions.items()}
        result["same_state"] = same
        result["decision_ms"] = decisions
        result["long_states"] = rows
    c = result["corpus"]
    print(
        f"corpus: {c['states']} states of {c['mean_chars']:.0f} chars on average: "
        f"{c['mean_us']:.0f} µs per state (median {c['median_us']:.0f}, max {c['max_us']:.0f})"
    )
    same = result["same_state"]
    for model_name, ms in result["decision_ms"].items():
        print(
            f"same state ({same['tokens']} tokens): facts {same['facts_ms']:.1f} ms, one decision with {model_name} "
            f"{ms:.0f} ms: facts = {same['facts/decision'][model_name]:.3%} of it"
        )
    for row in rows:
        ratios = ", ".join(f"{m}: {v:.3%}" for m, v in row["facts/decision, linear estimate"].items())
        print(
            f"{row['state']}: {row['tokens']} tokens, facts {row['facts_ms']:.1f} ms; "
            f"of a decision scaled linearly to its tokens: {ratios}"
        )
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
