"""What this machine can do for the model's shapes, measured in the same run as the suites (issue 16): the GEMM
rate of the library on the model's weight shapes, and on CUDA the copy bandwidth and the matrix rate.

A suite's *achieved fraction* is its useful FLOPs (`basal.benchsuite.flops`, counted from the packed tokens and the
model shape) per second over the GEMM rate here: 1.0 would be a forward that runs every FLOP at the speed the library
reaches on large GEMMs of the model's own shapes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from basal.backends.cuda.model import TORCH_DTYPE
from basal.benchsuite.flops import NO_FLOPS, Flops, forward_flops, gemm_shapes, per_token_gemm_flops
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import LlamaConfig
from basal.core.packing.tree import split_forwards
from basal.core.request.plan import DecisionRequest

LIMIT_ROWS = 512  # rows per call: past this the CPU library's rate is flat (issue 16's table)


@dataclass(frozen=True)
class GemmLimit:
    rows: int
    gflops: dict[str, float]  # per weight GEMM of a layer
    combined_gflops: float  # the rate of one token through a whole layer: sum(flops) / sum(flops / rate)
    extra: dict[str, float]  # CUDA: copy bandwidth (GB/s) and square-matmul rate (GFLOP/s)

    def fraction(self, flops: float, seconds: float) -> float:
        return flops / seconds / (self.combined_gflops * 1e9) if seconds > 0 else float("nan")

    def as_dict(self) -> dict[str, object]:
        return {"rows": self.rows, "gflops": self.gflops, "combined_gflops": self.combined_gflops, **self.extra}


def _best_seconds(fn, reps: int, sync, min_seconds: float = 0.0) -> float:
    """The fastest of at least `reps` calls, calling on until `min_seconds` have passed: on a shared machine one
    short sample may land in a slow moment, and the limit is what the machine *can* do."""
    fn()
    sync()
    best, started, calls = float("inf"), time.perf_counter(), 0
    while calls < reps or time.perf_counter() - started < min_seconds:
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
        calls += 1
    return best


def measure(
    cfg: LlamaConfig, dtype: str, device: str = "cpu", rows: int = LIMIT_ROWS, reps: int = 3, min_seconds: float = 0.3
) -> GemmLimit:
    """Best rate of `F.linear([rows, K], [N, K])` for each weight shape of the model, over at least `reps` calls
    and `min_seconds` per shape."""
    dev = torch.device(device)
    dt = TORCH_DTYPE[dtype]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    per = per_token_gemm_flops(cfg)
    rates = {}
    with torch.inference_mode():
        for name, (n, k) in gemm_shapes(cfg).items():
            w = torch.randn(n, k, device=dev).to(dt)
            x = torch.randn(rows, k, device=dev).to(dt)
            seconds = _best_seconds(lambda x=x, w=w: torch.nn.functional.linear(x, w), reps, sync, min_seconds)
            rates[name] = rows * per[name] / seconds / 1e9
            del w, x
        extra = _cuda_extra(dev, dt, sync) if dev.type == "cuda" else {}
    combined = sum(per.values()) / sum(per[n] / rates[n] for n in per)
    return GemmLimit(rows, rates, combined, extra)


def typical(measured: list[GemmLimit]) -> GemmLimit:
    """The median of several measurements of one run (taken between its suites, by combined rate): on a shared
    machine one measurement may land in a slow or a fast moment, and either would skew every fraction."""
    ranked = sorted(measured, key=lambda lim: lim.combined_gflops)
    return ranked[(len(ranked) - 1) // 2]


def _cuda_extra(dev: torch.device, dt: torch.dtype, sync) -> dict[str, float]:
    """Device-to-device copy bandwidth and the rate of a large square matmul (never run on a GPU here)."""
    n_bytes = 1 << 28
    src = torch.empty(n_bytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_s = _best_seconds(lambda: dst.copy_(src), 5, sync)
    a = torch.randn(8192, 8192, device=dev).to(dt)
    mm_s = _best_seconds(lambda: a @ a, 5, sync)
    return {"copy_gbps": 2 * n_bytes / copy_s / 1e9, "matmul_gflops": 2 * 8192**3 / mm_s / 1e9}


def request_flops(pipeline: Pipeline, request: DecisionRequest) -> Flops:
    """Useful FLOPs of answering `request` alone, from the same packing the pipeline runs."""
    tokenized = pipeline.tokenize([q for q in request.questions if q.needs_model])
    forwards = split_forwards(
        tokenized,
        pipeline.letter_ids,
        pipeline.prefixes,
        pipeline.tree_max_tokens,
        pipeline.forward_max_tokens,
        share_across_questions=pipeline.share_across_questions,
    )
    return sum((forward_flops(pipeline.model.config, f.packed) for f in forwards), NO_FLOPS)
