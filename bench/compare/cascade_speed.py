"""A cascade (a small model first, the questions it is unsure of sent on to a large one) vs the large model alone,
on one request set, in one process, alternating.

    python -m bench.compare.cascade_speed                  # mini shapes and 4.5B shapes, each cut to 2 layers, f32, CPU
    python -m bench.compare.cascade_speed --escalate 0.1   # a tenth of the questions go on
    python -m bench.compare.cascade_speed --large max      # the large model with max's shapes (cut the same way)

Synthetic models have no confident answers, so the rule is set from the small model's own confidences on the set:
`escalate_below` is the `--escalate` quantile of them, and about that share of questions goes on (the real share
is reported). Reports decisions per second with `--clients` requests in flight and the mean latency of one request
at a time, for both ways, and their ratios; every cascade answer is checked bitwise against its model's own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np
from tqdm import tqdm

from basal.backends.cuda.backend import TorchBackend
from basal.benchsuite.workloads import state_of_tokens
from basal.core.engine.cascade import Cascade, CascadeFront, Rule, Step, top_probability
from basal.core.engine.engine import Engine
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_basal
from basal.core.request.model_names import ServedModels
from bench import report

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Does this convey urgency?"},
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {"billing": "Payments, invoices", "technical": "Bugs, outages", "sales": "Plans, upgrades"},
    },
    "severity": {"type": "score", "instructions": "How severe is it?", "criteria": ["low", "medium", "high"]},
    "tone": {"type": "choice", "instructions": "What is the tone?", "criteria": ["calm", "annoyed", "angry"]},
}


def build(root: Path, layers: int, large_preset: str) -> Engines:
    metrics, gate = Metrics(), Gate()
    engines = {}
    for name, preset, seed in (("small", "mini", 1), ("large", large_preset, 2)):
        path = synth_model(root / name, preset, layers=layers, seed=seed)
        meta = json.loads((path / "basal.json").read_text())
        (path / "basal.json").write_text(json.dumps({**meta, "name": name}))
        model = ModelDir.load(path)
        engines[name] = Engine(name, Pipeline(model, TorchBackend.load(model, dtype="f32")), gate, metrics)
    front = Engines(engines, "small", metrics)
    front.start()
    return front


async def run_all(front, requests, clients: int) -> list:
    """Every request, at most `clients` in flight; -> results in order."""
    gate = asyncio.Semaphore(clients)

    async def one(r):
        async with gate:
            return await front.run(r)

    return await asyncio.gather(*(one(r) for r in requests))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--large", default="4.5B", choices=["4.5B", "max"], help="the large model's shapes")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--state-tokens", type=int, default=256)
    ap.add_argument("--escalate", type=float, default=0.2, help="share of questions the rule sends on (quantile)")
    ap.add_argument("--clients", type=int, default=8, help="requests in flight for the throughput runs")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default="bench/results/cascade_speed.json")
    a = ap.parse_args(argv)

    tmp = tempfile.TemporaryDirectory()
    engines = build(Path(tmp.name), a.layers, a.large)
    tokenizer = ModelDir.load(Path(tmp.name) / "small").tokenizer
    states = [state_of_tokens(tokenizer, a.state_tokens, "en", seed=i) for i in range(a.requests)]

    def requests(model: str, names: list[str]):
        resolve = ServedModels(tuple(names), "small")
        return [parse_basal({"model": model, "state": s, "questions": QUESTIONS}, resolve) for s in states]

    small = asyncio.run(run_all(engines, requests("small", engines.names), a.clients))
    confidences = [top_probability(ans) for r in small for ans in r.response.answers.values()]
    below = float(np.quantile(confidences, a.escalate))
    front = CascadeFront(engines, [Cascade("casc", (Step("small", Rule("confidence", below)), Step("large", None)))])
    ways = {"cascade": requests("casc", front.names), "large alone": requests("large", front.names)}
    asyncio.run(run_all(front, ways["cascade"], a.clients))  # warm-up of both models' shapes

    seconds: dict[str, list[float]] = {w: [] for w in ways}
    latency: dict[str, list[float]] = {w: [] for w in ways}
    results = {}
    for _ in tqdm(range(a.reps), desc="alternating runs"):
        for way, reqs in ways.items():
            t0 = time.perf_counter()
            results[way] = asyncio.run(run_all(front, reqs, a.clients))
            seconds[way].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            asyncio.run(run_all(front, reqs, 1))
            latency[way].append((time.perf_counter() - t0) / len(reqs))
    front.close()

    large = {i: r.response.answers for i, r in enumerate(results["large alone"])}
    small_answers = {i: r.response.answers for i, r in enumerate(small)}
    escalated = same_bits = 0
    for i, r in enumerate(results["cascade"]):
        for name, answer in r.response.answers.items():
            by = r.cascade.answered_by[name]
            escalated += by == "large"
            own = (large if by == "large" else small_answers)[i][name]
            same_bits += msgspec.json.encode(msgspec.structs.replace(answer, answered_by=msgspec.UNSET)) == (
                msgspec.json.encode(own)
            )
    decisions = a.requests * len(QUESTIONS)
    best = {w: min(s) for w, s in seconds.items()}
    result = {
        "machine": report.machine(),
        "layers": a.layers,
        "large": a.large,
        "requests": a.requests,
        "questions": decisions,
        "escalate_below": below,
        "escalated_share": escalated / decisions,
        "answers_equal_to_their_models_own": f"{same_bits}/{decisions}",
        "decisions_per_s": {w: decisions / s for w, s in best.items()},
        "mean_latency_ms": {w: min(v) * 1000 for w, v in latency.items()},
        "throughput_ratio": best["large alone"] / best["cascade"],
        "latency_ratio": min(latency["large alone"]) / min(latency["cascade"]),
    }
    report.write_json(a.out, result)
    print(
        f"\nsmall: mini shapes, large: {a.large} shapes, {a.layers} layers each, f32, torch CPU; "
        f"{a.requests} requests x {len(QUESTIONS)} questions, ~{a.state_tokens}-token states; "
        f"best of {a.reps} alternating runs\n"
        f"escalate_below {below:.4f}: {escalated}/{decisions} questions ({escalated / decisions:.0%}) went on; "
        f"answers bitwise their model's own: {same_bits}/{decisions}\n"
    )
    print(f"| way | decisions/s ({a.clients} in flight) | mean latency, one at a time (ms) |")
    print("| --- | ---: | ---: |")
    for w in ways:
        print(f"| {w} | {result['decisions_per_s'][w]:.1f} | {result['mean_latency_ms'][w]:.1f} |")
    print(
        f"\ncascade vs large alone: throughput {result['throughput_ratio']:.2f}×, "
        f"latency {result['latency_ratio']:.2f}×"
    )
    tmp.cleanup()
    return result


if __name__ == "__main__":
    main()
