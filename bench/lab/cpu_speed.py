"""The torch CPU path before and after a round of issue 16, in one run, against the GEMM rate this machine
reaches.

    python -m bench.lab.cpu_speed                     # mini shapes cut to 2 and 4 layers, f32: the full set
    python -m bench.lab.cpu_speed --layers 2 --reps 1 # quicker
    python -m bench.lab.cpu_speed --baseline main     # against the kernels before the second round
    python -m bench.lab.cpu_speed --plot bench/plots/cpu_fraction.png   # and the fractions as bars
    python -m bench.lab.cpu_speed --replot a.json b.json --plot out.png  # bars from saved runs, no new run

"before" is, by `--baseline`: `torch-ops` (the default) the current code with the compiled CPU kernels suspended
(attention's tile work and SwiGLU as torch ops: the third round's starting point, and what runs without a C
compiler); `main` the kernels before the second round (bench/lab/baselines/main_path.py: the batched tile-span
attention over every padded row and tile, whole-tensor det_exp, GEMM chunks joined by cat) with the same probed
chunk plans; `first` the first version's numerics and loops: 64-row GEMM chunks (16 at the readouts) and the
tile-by-tile attention loop (bench/lab/baselines/tiled_attention.py). "after" is the current code, with the
compiled kernels when they load.
Both run on the same loaded weights, alternating, and give the same bits (checked here on every workload).
Workloads: one question on a ~500-token state; 25 and 50 questions on one ~700-token state; throughput of 4
concurrent clients (in-process engine) each sending 10 questions on its own ~512-token state. The achieved
fraction is useful FLOPs per second (`basal.benchsuite.flops`) over the combined rate of `F.linear` on 512-row calls of
the model's weight shapes (`basal.benchsuite.limits`), in two ways: against the median of the rates measured
between the workloads (`fraction_*`), and *paired* (`fraction_paired_*`): every timed forward is flanked by a
measurement of the rate just before and just after it, and its fraction is taken against the mean of the two. On
a shared machine the rate moves by a third within a minute (109–174 GFLOP/s in one run), so a forward and a limit
measured far apart can disagree by that much; the paired fraction compares each forward with the machine of its
own moment (the median over the repetitions is shown, and the range).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from basal.backends.cuda import ops as K
from basal.backends.cuda.backend import TorchBackend
from basal.backends.cuda.cpu import cpu_kernels
from basal.backends.cuda.cpu.gemm_chunks import _cpu_model
from basal.benchsuite import limits
from basal.benchsuite.workloads import questions, state_of_tokens
from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_systemone
from bench.lab.baselines import main_path
from bench.lab.baselines.tiled_attention import tiled_tree_attention


def _tiled_steps(q, key_buf, value_buf, plan, query_rows, fixed=True):
    return tiled_tree_attention(q, key_buf, value_buf, plan, query_rows, fixed)
    yield  # no pause points inside attention, as in the first version


ATTENTION_S = [0.0]  # seconds spent in tree attention since the last reset


@contextmanager
def _attention_timed():
    """Count the time spent in whichever `K.tree_attention_steps` is in place."""
    steps = K.tree_attention_steps

    def timed(*args, **kwargs):
        t = time.perf_counter()
        out = yield from steps(*args, **kwargs)
        ATTENTION_S[0] += time.perf_counter() - t
        return out

    K.tree_attention_steps = timed
    try:
        yield
    finally:
        K.tree_attention_steps = steps


BASELINE = ["torch-ops"]  # set from --baseline
DTYPE = ["f32"]  # set from --dtype: the model's dtype, and the dtype of the GEMM limit it is measured against


@contextmanager
def before(backend: TorchBackend):
    """The current code on torch ops only; main's kernels before the second round; or (--baseline first) fixed
    64/16-row chunks and the tile loop."""
    if BASELINE[0] == "torch-ops":
        with cpu_kernels.suspended(), _attention_timed():
            yield
        return
    table = backend.net.chunks
    with main_path.installed():
        if BASELINE[0] == "first":
            backend.net.chunks, K.tree_attention_steps = None, _tiled_steps
        try:
            with _attention_timed():
                yield
        finally:
            backend.net.chunks = table


@contextmanager
def after(backend: TorchBackend):
    with _attention_timed():
        yield


def _request(tok, n_q: int, tokens: int, seed: int, lang: str = "en"):
    body = {"model": "m", "state": state_of_tokens(tok, tokens, lang, seed), "questions": questions(n_q, lang, seed)}
    return parse_systemone(body, lambda m: m)


def _logit_bits(pipeline: Pipeline, request) -> bytes:
    from basal.core.packing.passes import run_to_end

    logits = run_to_end(pipeline.letter_logits(pipeline.tokenize(request.questions)))
    return b"".join(o.tobytes() for q in logits for o in q)


def _throughput(pipeline: Pipeline, requests) -> float:
    metrics = Metrics()
    engine = Engine("m", pipeline, Gate(), metrics, EngineSettings(8192))
    engines = Engines({"m": engine}, "m", metrics)
    engines.start()

    async def main() -> float:
        t = time.perf_counter()
        await asyncio.gather(*(engines.run(r) for r in requests))
        return time.perf_counter() - t

    try:
        return asyncio.run(main())
    finally:
        engines.close()


def run_model(path: Path, reps: int) -> dict:
    model = ModelDir.load(path)
    t = time.perf_counter()
    backend = TorchBackend.load(model, dtype=DTYPE[0])
    load_s = time.perf_counter() - t
    pipeline = Pipeline(model, backend)
    measured = [limits.measure(model.config, DTYPE[0])]  # again around every timed forward; the median is the limit

    def rate_now() -> float:
        measured.append(limits.measure(model.config, DTYPE[0]))
        return measured[-1].combined_gflops

    print(f"{path.name}: load {load_s:.1f} s, GEMM rate {measured[0].combined_gflops:.0f} GFLOP/s", flush=True)
    tok = model.tokenizer
    single = _request(tok, 1, 500, 1)
    state = state_of_tokens(tok, 700, "pl", 7)
    many = {
        n: parse_systemone({"model": "m", "state": state, "questions": questions(n, "pl", n)}, lambda m: m)
        for n in (25, 50)
    }
    rows = []
    for name, request in [("1 question, ~500-token state", single)] + [
        (f"{n} questions, one ~700-token state", r) for n, r in many.items()
    ]:
        flops = limits.request_flops(pipeline, request).total
        with before(backend):
            old_bits = _logit_bits(pipeline, request)  # also the warm-up
        new_bits = _logit_bits(pipeline, request)
        times: dict[str, list[float]] = {"before": [], "after": []}
        attention: dict[str, list[float]] = {"before": [], "after": []}
        cpu: dict[str, list[float]] = {"before": [], "after": []}  # process CPU seconds: less hit by a loaded machine
        paired: dict[str, list[float]] = {"before": [], "after": []}
        rate = rate_now()
        for _ in range(reps):
            for label, mode in (("before", before), ("after", after)):
                with mode(backend):
                    ATTENTION_S[0] = 0.0
                    t, c = time.perf_counter(), time.process_time()
                    pipeline.decide(request)
                    times[label].append(time.perf_counter() - t)
                    cpu[label].append(time.process_time() - c)
                    attention[label].append(ATTENTION_S[0])
                rate, previous = rate_now(), rate
                paired[label].append(paired_fraction(flops, times[label][-1], previous, rate))
        rows.append(_row(name, flops, times, old_bits == new_bits))
        rows[-1]["fraction_paired_before"], rows[-1]["fraction_paired_after"] = paired["before"], paired["after"]
        rows[-1]["attention_before_s"], rows[-1]["attention_after_s"] = attention["before"], attention["after"]
        rows[-1]["cpu_before_s"], rows[-1]["cpu_after_s"] = cpu["before"], cpu["after"]
        rows[-1]["cpu_speedup"] = min(cpu["before"]) / min(cpu["after"])
        print(json.dumps(rows[-1]), flush=True)
    clients = [_request(tok, 10, 512, 20 + i, "en" if i % 2 else "pl") for i in range(4)]
    flops = sum(limits.request_flops(pipeline, r).total for r in clients)
    times = {"before": [], "after": []}
    paired = {"before": [], "after": []}
    rate = rate_now()
    for _ in range(reps):
        for label, mode in (("before", before), ("after", after)):
            with mode(backend):
                times[label].append(_throughput(pipeline, clients))
            rate, previous = rate_now(), rate
            paired[label].append(paired_fraction(flops, times[label][-1], previous, rate))
    rows.append(_row("throughput, 4 clients x 10 questions", flops, times, None, decisions=40))
    rows[-1]["fraction_paired_before"], rows[-1]["fraction_paired_after"] = paired["before"], paired["after"]
    print(json.dumps(rows[-1]), flush=True)
    limit = limits.typical(measured)
    return refresh_fractions(
        {
            "layers": model.config.num_hidden_layers,
            "dtype": DTYPE[0],
            "load_s": load_s,
            "gemm_limit": limit.as_dict(),
            "gemm_rates_measured": [lim.combined_gflops for lim in measured],
            "chunks": backend.describe()["gemm_chunks"],
            "rows": rows,
        }
    )


def paired_fraction(flops: float, seconds: float, rate_before: float, rate_after: float) -> float:
    """A forward's FLOP rate over the mean of the GEMM rates (GFLOP/s) measured just before and just after it."""
    return flops / seconds / 1e9 / ((rate_before + rate_after) / 2)


def _row(name, flops, times, same_bits, decisions=None) -> dict:
    """One workload's times; its fractions are filled in at the end, against the median GEMM rate of the run."""
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "workload": name,
        "gflop": flops / 1e9,
        "before_s": times["before"],
        "after_s": times["after"],
        "speedup": med["before"] / med["after"],
        "same_bits": same_bits,
        "decisions_per_s_after": decisions / med["after"] if decisions else None,
    }


def refresh_fractions(model: dict) -> dict:
    """A model result's fractions against the median of its measured GEMM rates (`limits.typical`): for a run
    here, and for saved results (those saved before the median was used had the fastest rate)."""
    rates = sorted(model.get("gemm_rates_measured") or [model["gemm_limit"]["combined_gflops"]])
    limit = rates[(len(rates) - 1) // 2] * 1e9
    for row in model["rows"]:
        for label in ("before", "after"):
            row[f"fraction_{label}"] = row["gflop"] * 1e9 / statistics.median(row[f"{label}_s"]) / limit
    return model


def plot_fractions(models: list[dict], baseline: str, path: Path) -> Path:
    """Bars of the fraction of the GEMM limit, before and after, per workload, one panel per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 4.2), dpi=110, sharey=True, squeeze=False)
    for ax, m in zip(axes[0], sorted(models, key=lambda m: m["layers"]), strict=True):
        names = [r["workload"].split(", ")[0 if "clients" not in r["workload"] else 1] for r in m["rows"]]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [r["fraction_before"] for r in m["rows"]], 0.4, label=f"before ({baseline})")
        ax.bar([x + 0.2 for x in xs], [r["fraction_after"] for r in m["rows"]], 0.4, label="after (current)")
        ax.axhline(0.8, color="grey", linestyle="--", linewidth=1, label="goal 0.8")
        ax.set_xticks(list(xs), [n.replace("throughput, ", "") for n in names], rotation=15, fontsize=8)
        ax.set_title(f"mini cut to {m['layers']} layers, {m.get('dtype', 'f32')}")
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("fraction of the measured GEMM limit")
    axes[0][0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions of each mode (alternating)")
    ap.add_argument("--models", default=None, help="folder to keep the synthesized models in (default: temporary)")
    ap.add_argument("--out", default="bench/results/cpu_speed.json")
    ap.add_argument(
        "--baseline", choices=["torch-ops", "main", "first"], default="torch-ops", help="what 'before' runs (see above)"
    )
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32", help="model dtype (the limit is measured in it)")
    ap.add_argument("--plot", default=None, help="also draw the fractions as bars into this PNG")
    ap.add_argument(
        "--replot", nargs="+", default=None, metavar="JSON", help="no run: draw --plot from saved --out files"
    )
    a = ap.parse_args()
    if a.replot:
        saved = [json.loads(Path(f).read_text()) for f in a.replot]
        models = [refresh_fractions(m) for d in saved for m in d["models"]]
        print(plot_fractions(models, saved[0]["baseline"], Path(a.plot or "bench/results/cpu_speed.png")))
        return
    BASELINE[0], DTYPE[0] = a.baseline, a.dtype
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.models or tmp)
        results = []
        for layers in a.layers:
            path = root / f"mini-{layers}"
            if not (path / "model.safetensors").is_file():
                synth_model(path, "mini", layers=layers)
            results.append(run_model(path, a.reps))
    out = {
        "machine": {
            "platform": platform.platform(),
            "cpu": _cpu_model(),
            "flags": cpu_flags(),
            "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "load_average": os.getloadavg(),
        },
        "dtype": a.dtype,
        "torch": torch.__version__,
        "cpu_kernels": cpu_kernels.status(),
        "reps": a.reps,
        "baseline": a.baseline,
        "models": results,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    if a.plot:
        print(f"wrote {plot_fractions(results, a.baseline, Path(a.plot))}")
    for m in results:
        lim = m["gemm_limit"]
        print(
            f"\nmini cut to {m['layers']} layers, {a.dtype}, {torch.get_num_threads()} threads, before = {a.baseline}; "
            f"GEMM limit "
            f"{lim['combined_gflops']:.0f} GFLOP/s (512-row F.linear: "
            + ", ".join(f"{k} {v:.0f}" for k, v in lim["gflops"].items())
            + f"); load {m['load_s']:.1f} s; compiled CPU kernels: {cpu_kernels.status()}\n"
        )
        print(
            "| workload | GFLOP | before s | after s | speedup | CPU-seconds speedup | attention s before → after | "
            "fraction before | fraction after | paired fraction after (range) | same bits |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for r in m["rows"]:
            att = "—"
            if "attention_before_s" in r:
                att = f"{_span(r['attention_before_s'])} → {_span(r['attention_after_s'])}"
            print(
                f"| {r['workload']} | {r['gflop']:.1f} | {_span(r['before_s'])} | {_span(r['after_s'])} | "
                f"{r['speedup']:.2f}x | {_ratio(r.get('cpu_speedup'))} | {att} | "
                f"{r['fraction_before']:.2f} | {r['fraction_after']:.2f} | {_paired(r.get('fraction_paired_after'))} | "
                f"{'—' if r['same_bits'] is None else 'yes' if r['same_bits'] else 'NO'} |"
            )


def _paired(fractions: list[float] | None) -> str:
    if not fractions:
        return "—"
    return f"{statistics.median(fractions):.2f} ({min(fractions):.2f}–{max(fractions):.2f})"


def cpu_flags() -> list[str]:
    """The ISA flags that decide the CPU path's kernels: AVX-512 and its bf16 dot products, AMX tiles."""
    try:
        flags = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags")).split()
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2", "fma")))


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _span(xs: list[float]) -> str:
    return f"{min(xs):.2f}–{max(xs):.2f}" if len(xs) > 1 else f"{xs[0]:.2f}"


if __name__ == "__main__":
    main()
