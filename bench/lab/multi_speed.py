"""`multi` with 4, 20 and 50 labels on a ~512-token state: one request (every branch in one tree over the shared
state) vs the same labels asked as separate requests (one yes/no request per label, one after the other).

    python -m bench.lab.multi_speed                       # mini shapes cut to 2 layers, f32, torch CPU
    python -m bench.lab.multi_speed --layers 1 --reps 1   # quicker

Reports packed vs unpacked (prompt) tokens of the multi request, the latency of both ways and their ratio.
Latencies are measured in the same run, alternating, so the ratio is what to read on a busy machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from basal.backends.cuda.backend import TorchBackend
from basal.benchsuite.workloads import state_of_tokens
from basal.core.engine.pipeline import Pipeline, Stats
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_basal
from bench import report

LABELS = (4, 20, 50)
WORDS = "delivery refund invoice damage login card address loan payment contract warranty complaint".split()


def label_texts(n: int) -> list[str]:
    return [f"{WORDS[i % len(WORDS)]} issue {i}" for i in range(n)]


def multi_request(state: str, labels: list[str]) -> dict:
    question = {"type": "multi", "instructions": "Which issues does the customer report?", "criteria": labels}
    return {"state": state, "questions": {"issues": question}}


def separate_requests(state: str, labels: list[str]) -> list[dict]:
    """Each label as its own request: the branch question of the multi, asked as a noul."""
    return [
        {
            "state": state,
            "questions": {
                "q": {
                    "type": "noul",
                    "instructions": f'Which issues does the customer report?\nDoes this apply: "{label}"?',
                }
            },
        }
        for label in labels
    ]


def timed(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model directory (default: synthesize mini cut to --layers)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--state-tokens", type=int, default=512)
    ap.add_argument("--labels", type=int, nargs="+", default=list(LABELS))
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions of each way (after one warm-up)")
    ap.add_argument("--out", default="bench/results/multi_speed.json")
    a = ap.parse_args(argv)

    tmp = None
    if a.model is None:
        tmp = tempfile.TemporaryDirectory()
        path = synth_model(Path(tmp.name) / "mini", "mini", layers=a.layers)
    else:
        path = Path(a.model)
    model = ModelDir.load(path)
    pipeline = Pipeline(model, TorchBackend.load(model, dtype="f32"))
    state = state_of_tokens(model.tokenizer, a.state_tokens, "en", seed=0)
    resolve = lambda _name: model.name  # noqa: E731
    rows = []
    for n in tqdm(a.labels, desc="label counts"):
        labels = label_texts(n)
        multi = parse_basal(multi_request(state, labels), resolve)
        separate = [parse_basal(r, resolve) for r in separate_requests(state, labels)]
        pipeline.decide(multi)  # warm-up
        pipeline.decide(separate[0])
        stats = Stats()
        pipeline.decide(multi, stats)
        separate_stats = Stats()
        for r in separate:
            pipeline.decide(r, separate_stats)
        multi_s = timed(lambda m=multi: pipeline.decide(m), a.reps)
        separate_s = timed(lambda s=separate: [pipeline.decide(r) for r in s], a.reps)
        rows.append(
            {
                "labels": n,
                "prompt_tokens": stats.prompt_tokens,
                "packed_tokens": stats.packed_tokens,
                "separate_packed_tokens": separate_stats.packed_tokens,
                "multi_s": multi_s,
                "separate_s": separate_s,
                "speedup": separate_s / multi_s,
            }
        )
    result = {
        "machine": report.machine(),
        "model": report.model_info(a.model, model.config.num_hidden_layers),
        "state_tokens": a.state_tokens,
        "reps": a.reps,
        "rows": rows,
    }
    report.write_json(a.out, result)
    print(
        f"\n{result['model']['preset']} shapes, {model.config.num_hidden_layers} layers, f32, torch CPU, "
        f"~{a.state_tokens}-token state, mean of {a.reps} runs\n"
    )
    print("| labels | prompt tokens | packed tokens | packed/unpacked | multi ms | as separate requests ms | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['labels']} | {r['prompt_tokens']} | {r['packed_tokens']} | "
            f"{r['packed_tokens'] / r['prompt_tokens']:.3f} | {r['multi_s'] * 1000:.1f} | "
            f"{r['separate_s'] * 1000:.1f} | {r['speedup']:.2f}× |"
        )
    if tmp:
        tmp.cleanup()
    return rows


if __name__ == "__main__":
    main()
