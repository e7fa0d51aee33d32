"""Choices with 59, 150 and 255 options vs a 10-option choice on the same state: prompts, tokens, latency.

    python -m bench.lab.large_choice_speed                       # mini shapes cut to 2 layers, f32, torch CPU
    python -m bench.lab.large_choice_speed --layers 1 --reps 1   # quicker
    python -m bench.lab.large_choice_speed --model DIR           # any model directory

Every request is one choice question on the same ~300-token EN state, answered by `Pipeline.decide` (the group
round in one tree, then the final round). A 10-option choice is one ordinary question (2 prompts, 1 pass); a
large choice with the default strategy `luce2-1o` reads 2·ceil(n/10) group prompts and 2 final prompts in two
passes. Latency is the mean of --reps runs after one warm-up; the ratio is against the 10-option choice measured
in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from basal.backends.cuda.backend import TorchBackend
from basal.benchsuite.workloads import EN, state_of_tokens
from basal.core.decision.large_choice import prompt_count
from basal.core.engine.pipeline import Pipeline, Stats
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_systemone

SIZES = (10, 59, 150, 255)


def request(n: int, state: str, seed: int = 0) -> dict:
    rng = random.Random(seed)
    criteria = {f"intent_{i}": f"{rng.choice(EN)} {rng.choice(EN)} {i}" for i in range(n)}
    question = {"type": "choice", "instructions": "What is the customer asking about?", "criteria": criteria}
    return {"model": "m", "state": state, "questions": {"intent": question}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model directory (default: synthesize mini cut to --layers)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per request (after one warm-up)")
    ap.add_argument("--strategy", default="luce2-1o", choices=["luce2-1o", "luce2"])
    ap.add_argument("--out", default="bench/results/large_choice_speed.json")
    a = ap.parse_args()

    tmp = None
    if a.model is None:
        tmp = tempfile.TemporaryDirectory()
        path = synth_model(Path(tmp.name) / "mini", "mini", layers=a.layers)
    else:
        path = Path(a.model)
    model = ModelDir.load(path)
    pipeline = Pipeline(model, TorchBackend.load(model, dtype="f32"), large_choice=a.strategy)
    state = state_of_tokens(model.tokenizer, 300, "en", seed=0)
    rows = []
    for n in tqdm(SIZES, desc="choices"):
        req = parse_systemone(request(n, state), lambda m: m)
        pipeline.decide(req)  # warm-up
        t0 = time.perf_counter()
        for _ in range(a.reps):
            stats = Stats()
            response = pipeline.decide(req, stats)
        seconds = (time.perf_counter() - t0) / a.reps
        prompts = prompt_count(n, a.strategy) if n > 10 else 2
        rows.append(
            {
                "options": n,
                "prompts": prompts,
                "passes": 2 if n > 10 else 1,
                "prompt_tokens": stats.prompt_tokens,
                "packed_tokens": stats.packed_tokens,
                "input_tokens": response.usage.input_tokens,
                "latency_s": seconds,
            }
        )
    base = rows[0]["latency_s"]
    for r in rows:
        r["latency_vs_10_options"] = r["latency_s"] / base
    result = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "model": {"preset": "mini" if a.model is None else str(a.model), "layers": model.config.num_hidden_layers},
        "strategy": a.strategy,
        "reps": a.reps,
        "rows": rows,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    print(
        f"\n{result['model']['preset']} shapes, {model.config.num_hidden_layers} layers, f32, torch CPU "
        f"({torch.get_num_threads()} threads), strategy {a.strategy}, mean of {a.reps} runs, "
        f"load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| options | prompts | passes | prompt tokens | packed tokens | latency | vs 10 options |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['options']} | {r['prompts']} | {r['passes']} | {r['prompt_tokens']} | {r['packed_tokens']} | "
            f"{r['latency_s'] * 1000:.0f} ms | {r['latency_vs_10_options']:.2f}× |"
        )
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
