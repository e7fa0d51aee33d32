"""Where a CPU forward's time goes: shares of weight GEMMs, tree attention, elementwise ops and the rest
(Python planning, packing, tokenization, embedding, residual adds) for the workloads of `bench.lab.cpu_speed` and the
request set of `bench.compare.cpu_http`.

    python -m bench.lab.cpu_profile                     # mini shapes cut to 2 and 4 layers, f32
    python -m bench.lab.cpu_profile --layers 2 --dtype bf16

The categories are timed by wrapping the model's calls into `ops` (`linear_steps`, `tree_attention_steps`,
`swiglu`, `rms_norm`, `apply_rope`) with a clock: a generator's time counts only while it runs, not while it is
paused. Attention is split further with torch.profiler's self times of its GEMM ops (`aten::bmm`) in a second,
profiled pass. "rest" is the wall time of `Pipeline.decide` minus the categories: everything in Python around the
kernels. Each workload runs once as a warm-up, then `--reps` times; the table gives the median of each share.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

from basal.backends.cuda import ops as K
from basal.backends.cuda.backend import TorchBackend
from basal.benchsuite.workloads import questions, state_of_tokens
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_systemone
from bench.compare.cpu_http import REQUEST_SET

SPENT: dict[str, float] = defaultdict(float)
WRAPPED = {
    "linear_steps": "GEMM",
    "tree_attention_steps": "attention",
    "swiglu": "elementwise",
    "rms_norm": "elementwise",
    "apply_rope": "elementwise",
}


def _timed_generator(gen, category: str):
    value = None
    while True:
        t = time.perf_counter()
        try:
            step = gen.send(value)
        except StopIteration as done:
            SPENT[category] += time.perf_counter() - t
            return done.value
        SPENT[category] += time.perf_counter() - t
        value = yield step


@contextmanager
def timed_ops():
    """Replace the ops the model calls with clocked versions (the model looks them up on `K` at each call)."""
    saved = {name: getattr(K, name) for name in WRAPPED}

    def wrap(name: str, fn):
        category = WRAPPED[name]
        if name.endswith("_steps"):
            return lambda *a, **k: _timed_generator(fn(*a, **k), category)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                SPENT[category] += time.perf_counter() - t

        return timed

    for name, fn in saved.items():
        setattr(K, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(K, name, fn)


def workloads(tok) -> list[tuple[str, list]]:
    """bench.lab.cpu_speed's workloads (one request each; the 4-client throughput as its four requests in turn) and
    the HTTP request set, parsed."""

    def parse(body):
        return parse_systemone({"model": "m", **body}, lambda m: m)

    state = state_of_tokens(tok, 700, "pl", 7)
    out = [
        (
            "1 question, ~500-token state",
            [parse({"state": state_of_tokens(tok, 500, "en", 1), "questions": questions(1, "en", 1)})],
        ),
        ("25 questions, one ~700-token state", [parse({"state": state, "questions": questions(25, "pl", 25)})]),
        ("50 questions, one ~700-token state", [parse({"state": state, "questions": questions(50, "pl", 50)})]),
        (
            "4 x 10 questions, ~512-token states",
            [
                parse(
                    {
                        "state": state_of_tokens(tok, 512, "en" if i % 2 else "pl", 20 + i),
                        "questions": questions(10, "en" if i % 2 else "pl", 20 + i),
                    }
                )
                for i in range(4)
            ],
        ),
    ]
    out.append(("HTTP request set (bench.compare.cpu_http)", [parse(b) for b in REQUEST_SET.bodies(tok, "m")]))
    return out


def profile(pipeline: Pipeline, requests, reps: int) -> dict:
    for r in requests:
        pipeline.decide(r)  # warm-up
    shares = defaultdict(list)
    walls = []
    for _ in range(reps):
        SPENT.clear()
        with timed_ops():
            t = time.perf_counter()
            for r in requests:
                pipeline.decide(r)
            wall = time.perf_counter() - t
        walls.append(wall)
        for cat in ("GEMM", "attention", "elementwise"):
            shares[cat].append(SPENT[cat] / wall)
        shares["rest"].append(1 - sum(SPENT.values()) / wall)
    # the attention's own GEMMs (score and p·v, aten::bmm) and the compiled tile step, from one profiled pass
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for r in requests:
            pipeline.decide(r)
    ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(ops.values()) or 1.0
    gemm_ops = sum(ops.get(k, 0.0) for k in ("aten::mm", "aten::addmm"))
    bmm = ops.get("aten::bmm", 0.0)
    return {
        "wall_s": walls,
        "shares": {k: statistics.median(v) for k, v in shares.items()},
        "op_self_share": {"weight GEMM (mm/addmm)": gemm_ops / total, "attention GEMM (bmm)": bmm / total},
        "top_ops": sorted(((k, v / total) for k, v in ops.items()), key=lambda kv: -kv[1])[:8],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="bench/results/cpu_profile.json")
    a = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for layers in a.layers:
            model = ModelDir.load(synth_model(Path(tmp) / f"mini-{layers}", "mini", layers=layers))
            pipeline = Pipeline(model, TorchBackend.load(model, dtype=a.dtype))
            for name, requests in workloads(model.tokenizer):
                row = {"layers": layers, "workload": name, **profile(pipeline, requests, a.reps)}
                results.append(row)
                print(json.dumps(row), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(
        json.dumps({"dtype": a.dtype, "threads": torch.get_num_threads(), "rows": results}, indent=2)
    )
    print(f"\n{a.dtype}, {torch.get_num_threads()} threads, median of {a.reps} passes\n")
    print("| layers | workload | wall s | weight GEMM | attention (its bmm) | elementwise | rest (Python, packing) |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        s, o = r["shares"], r["op_self_share"]
        print(
            f"| {r['layers']} | {r['workload']} | {statistics.median(r['wall_s']):.2f} | {s['GEMM']:.0%} | "
            f"{s['attention']:.0%} ({o['attention GEMM (bmm)']:.0%}) | {s['elementwise']:.0%} | {s['rest']:.0%} |"
        )


if __name__ == "__main__":
    main()
