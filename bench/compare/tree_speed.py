"""basal (prefix tree + template-prefix cache) vs transformers running every prompt separately, same weights.

    python -m bench.compare.tree_speed                      # mini shapes cut to 4 layers, f32, CPU
    python -m bench.compare.tree_speed --layers 2 --reps 1  # quicker

Request mix (one request at a time): 1 question on a short state; 5 questions on a ~1k-token state;
14 questions on a ~500-token state. Reports decisions/s of both, their ratio, and packed/unpacked tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from basal.backends.cuda.backend import TorchBackend
from basal.benchsuite.workloads import questions, state_of_tokens
from basal.core.engine.pipeline import Pipeline, Stats
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_systemone

MIX = [
    ("1 question, short state", 1, 40),
    ("5 questions, ~1k-token state", 5, 1000),
    ("14 questions, ~500-token state", 14, 500),
]


def transformers_model(path: Path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()


def run_transformers(model, prompts: list[list[int]], letter_ids: list[int]) -> None:
    with torch.inference_mode():
        for p in prompts:
            model(torch.tensor([p]), logits_to_keep=1).logits[0, -1, letter_ids]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model directory (default: synthesize mini cut to --layers)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per request (after one warm-up)")
    ap.add_argument("--out", default="bench/results/tree_speed.json")
    a = ap.parse_args()

    tmp = None
    if a.model is None:
        tmp = tempfile.TemporaryDirectory()
        path = synth_model(Path(tmp.name) / "mini", "mini", layers=a.layers)
    else:
        path = Path(a.model)
    model = ModelDir.load(path)
    pipeline = Pipeline(model, TorchBackend.load(model, dtype="f32"))
    hf = transformers_model(path)
    tok = model.tokenizer
    rows = []
    for i, (name, n_q, state_tokens) in enumerate(tqdm(MIX, desc="requests")):
        body = {
            "model": "m",
            "state": state_of_tokens(tok, state_tokens, "en" if i % 2 else "pl", seed=i),
            "questions": questions(n_q, "en" if i % 2 else "pl", seed=i),
        }
        request = parse_systemone(body, lambda m: m)
        prompts = [p for t in pipeline.tokenize(request.questions) for p in t.prompts]
        stats = Stats()
        pipeline.decide(request)  # warm-up
        run_transformers(hf, prompts[:2], pipeline.letter_ids)
        t0 = time.perf_counter()
        for _ in range(a.reps):
            stats = Stats()
            pipeline.decide(request, stats)
        basal_s = (time.perf_counter() - t0) / a.reps
        t0 = time.perf_counter()
        for _ in range(a.reps):
            run_transformers(hf, prompts, pipeline.letter_ids)
        hf_s = (time.perf_counter() - t0) / a.reps
        rows.append(
            {
                "request": name,
                "questions": n_q,
                "prompt_tokens": stats.prompt_tokens,
                "packed_tokens": stats.packed_tokens,
                "basal_s": basal_s,
                "transformers_s": hf_s,
                "basal_decisions_per_s": n_q / basal_s,
                "transformers_decisions_per_s": n_q / hf_s,
                "speedup": hf_s / basal_s,
            }
        )
    result = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "model": {
            "preset": "mini" if a.model is None else str(a.model),
            "layers": model.config.num_hidden_layers,
            "dtype": "f32",
            "backend": "torch-cpu",
        },
        "reps": a.reps,
        "rows": rows,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    print(
        f"\nmini shapes, {model.config.num_hidden_layers} layers, f32, torch CPU ({torch.get_num_threads()} threads), "
        f"mean of {a.reps} runs\n"
    )
    print("| request | prompt tokens | packed tokens | packed/unpacked | basal dec/s | transformers dec/s | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['request']} | {r['prompt_tokens']} | {r['packed_tokens']} | "
            f"{r['packed_tokens'] / r['prompt_tokens']:.2f} | {r['basal_decisions_per_s']:.2f} | "
            f"{r['transformers_decisions_per_s']:.2f} | {r['speedup']:.2f}× |"
        )
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
