"""Column blocks in the CPU GEMMs: each weight shape's rate by block width, and a forward with the probed blocks
against the same forward in one call per row chunk, alternating in one process.

    python -m bench.lab.gemm_columns                 # mini shapes cut to 4 layers, 50 questions on one state, f32
    python -m bench.lab.gemm_columns --layers 2 --questions 25 --reps 2

Part 1 times `gemm_chunks.linear_into` (the forward's own calls) on 512-row chunks of each weight shape, whole and
in 1,024-, 512- and 256-column blocks, round-robin, `--calls` times each; the rate is the median call's. Part 2
runs one request through the backend with three plans swapped in — every shape in one call (`cols` 0), the probed
plans, and every shape in 512-column blocks — alternating `--reps` times, and checks that all three give the same
logit bits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from basal.backends.cuda.backend import TorchBackend
from basal.backends.cuda.cpu import gemm_chunks as G
from basal.backends.cuda.cpu.gemm_chunks import _cpu_model
from basal.benchsuite import limits
from basal.benchsuite.flops import gemm_shapes
from basal.benchsuite.workloads import questions, state_of_tokens
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_systemone
from bench.lab.cpu_speed import _logit_bits, cpu_flags

BLOCKS = (0, 1024, 512, 256)


def shape_rates(cfg, rows: int, calls: int) -> dict[str, dict[int, float]]:
    """GFLOP/s of the median call per weight shape and block width (0: one call)."""
    cases = {}
    with torch.inference_mode():
        for name, (n, k) in gemm_shapes(cfg).items():
            w = torch.randn(n, k)
            x = torch.randn(rows, k)
            for cols in BLOCKS:
                if cols < n:
                    cases[(name, cols)] = (G._blocked_linear(w, None, cols), x, 2 * rows * n * k)
        times: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
        for fn, x, _ in cases.values():
            fn(x)
        for _ in range(calls):
            for case, (fn, x, _) in cases.items():
                t = time.perf_counter()
                fn(x)
                times[case].append(time.perf_counter() - t)
    out: dict[str, dict[int, float]] = {}
    for (name, cols), (_, _, flops) in cases.items():
        out.setdefault(name, {})[cols] = flops / statistics.median(times[(name, cols)]) / 1e9
    return out


def fresh_vs_reused(cfg, rows: int, calls: int) -> dict[str, float]:
    """Seconds (median) of the gate/up projection of `rows` rows into a new output and into a reused one."""
    n, k = gemm_shapes(cfg)["gate_up"]
    w_t, x = torch.randn(n, k).t(), torch.randn(rows, k)
    spans = G.column_spans(n, 1024)
    reused = torch.empty(rows, n)

    def project(out: torch.Tensor) -> None:
        for r in range(0, rows, 512):
            G.linear_into(x[r : r + 512], w_t, None, spans, out[r : r + 512])

    times: dict[str, list[float]] = {"fresh": [], "reused": []}
    with torch.inference_mode():
        project(reused)
        for _ in range(calls):
            t = time.perf_counter()
            project(torch.empty(rows, n))
            times["fresh"].append(time.perf_counter() - t)
            t = time.perf_counter()
            project(reused)
            times["reused"].append(time.perf_counter() - t)
    return {name: statistics.median(v) for name, v in times.items()}


def forward_ab(pipeline: Pipeline, backend: TorchBackend, request, reps: int) -> dict:
    """Wall seconds of one request under each plan set, alternating; and whether the logit bits agree."""
    table = backend.net.chunks
    pipeline.decide(request)  # every shape the request calls (the letter head's too) gets its plan first
    probed = dict(table.sizes)
    plans = {
        "one call": {k: replace(p, cols=0) for k, p in probed.items()},
        "probed": probed,
        "512 columns": {k: replace(p, cols=512) for k, p in probed.items()},
    }
    bits, times = {}, {name: [] for name in plans}
    try:
        for name, plan in plans.items():
            table.sizes = plan
            bits[name] = _logit_bits(pipeline, request)  # also the warm-up
        for _ in range(reps):
            for name, plan in plans.items():
                table.sizes = plan
                t = time.perf_counter()
                pipeline.decide(request)
                times[name].append(time.perf_counter() - t)
    finally:
        table.sizes = probed
    return {
        "probed_cols": {f"{k[0]}x{k[1]}": p.cols for k, p in probed.items()},
        "same_bits": len(set(bits.values())) == 1,
        "seconds": times,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--questions", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--calls", type=int, default=7, help="timed calls per shape and block width in part 1")
    ap.add_argument("--out", default="bench/results/gemm_columns.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = ModelDir.load(synth_model(Path(tmp) / "mini", "mini", layers=a.layers))
        rates = shape_rates(model.config, 512, a.calls)
        output = fresh_vs_reused(model.config, 4608, 5)
        backend = TorchBackend.load(model, dtype="f32")
        pipeline = Pipeline(model, backend)
        tok = model.tokenizer
        body = {"model": "m", "state": state_of_tokens(tok, 700, "pl", 7), "questions": questions(a.questions, "pl", 7)}
        request = parse_systemone(body, lambda m: m)
        flops = limits.request_flops(pipeline, request).total
        ab = forward_ab(pipeline, backend, request, a.reps)
    result = {
        "machine": {"cpu": _cpu_model(), "flags": cpu_flags(), "threads": torch.get_num_threads()},
        "layers": a.layers,
        "questions": a.questions,
        "gflop": flops / 1e9,
        "shape_gflops_512_rows": {name: {str(c): r for c, r in by.items()} for name, by in rates.items()},
        "gate_up_4608_rows_s": output,
        **ab,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    print(f"\n512-row calls, GFLOP/s of the median of {a.calls} interleaved calls ({_cpu_model()}, f32)\n")
    print("| weight | one call | " + " | ".join(f"{c} columns" for c in BLOCKS[1:]) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in BLOCKS[1:]) + " |")
    for name, by in rates.items():
        print(f"| {name} | " + " | ".join(f"{by[c]:.0f}" if c in by else "—" for c in BLOCKS) + " |")
    fresh, reused = output["fresh"], output["reused"]
    print(f"\ngate/up of 4,608 rows, median of 5: {fresh:.2f} s into a new tensor, {reused:.2f} s into a reused one")
    print(f"\nmini cut to {a.layers} layers, {a.questions} questions on one ~700-token state, {a.reps} passes each")
    print(f"probed blocks: {ab['probed_cols']}; same bits under every plan: {ab['same_bits']}\n")
    print("| plans | wall s | GFLOP/s (median) |")
    print("| --- | ---: | ---: |")
    for name, secs in ab["seconds"].items():
        span = f"{min(secs):.2f}–{max(secs):.2f}"
        print(f"| {name} | {span} | {flops / statistics.median(secs) / 1e9:.0f} |")


if __name__ == "__main__":
    main()
