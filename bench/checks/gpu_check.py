"""One script that proves the GPU path's invariance and measures its speed on an NVIDIA GPU (docs/gpu-path.md §8.2).

    PYTHONUNBUFFERED=1 python3 bench/checks/gpu_check.py --out $OUT 2>&1 | tee $OUT/log.txt
    bash bench/checks/gpu_run.sh                                              # the same, as the device runs it

Phases (each with its own deadline; results written to $OUT/gpu_check.json after every phase and every entry of P1,
P2 and P3, each entry on its own, so a failure or a timeout still returns data; a SIGTERM writes the report and
prints the table of what was measured, then exits 124): P0 environment and ceilings, P1 GEMMs, P2 attention,
P3 whole model on mini / 4.5B / max shapes with synthetic weights, then `basal serve`'s path on checkpoints on disk
(basal-1.5 and basal-1.0 layouts) and `basal serve` itself over HTTP (its packages carried as wheels:
`make gpu-wheels`), P4 the summary table against the anchors and the physical limit. Needs only the image's torch
and triton and this repository. `--cpu-dry-run` runs every phase at toy sizes under the Triton interpreter (with the
order-fixed dot), so GPU minutes are never spent on a script bug; `make test` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from basal.backends.cuda.gpu.kernel_configs import MODEL_SHAPES as SHAPES  # noqa: E402 (plain Python, after sys.path)
from basal.backends.cuda.gpu.kernel_configs import weight_shapes  # noqa: E402
from bench.checks.serve_check import LAYERS as CHECKPOINT_LAYERS  # noqa: E402
from bench.checks.serve_check import not_run, serve_checks, serve_lines, verdict  # noqa: E402

TOY = {"toy": (64, 128, 2, 6, 1)}  # GQA 6: unused rows in every attention tile
# H100 single decision, ms: upstream / basal-rs (docs/gpu-path.md §1), and the H200 targets of issue 10
ANCHORS = {"mini": (4.8, 6.2, 2.5), "4.5B": (9.8, 13.2, 6.0), "max": (14.5, 17.5, 11.0)}
DEADLINES = {"P0": 10, "P1": 70, "P2": 40, "P3": 170, "P4": 5}
# seconds of the budget P1 and P2 leave for the phases after them: past that they skip their remaining entries, so
# their compiles cannot eat P3, whose first two items (the basal-1.5 checkpoint and mini) need 40 s; P1 keeps 20 s
# more for P2
LEAVES_S = {"P1": 60, "P2": 40}
# seconds a P3 size needs at least (synthetic weights, GEMM probe, compiles, checks, timings); with less of the
# budget left the size is skipped, so the run still ends with its table inside the device window
SIZE_NEEDS_S = {"toy": 0, "mini": 20, "4.5B": 35, "max": 45}
# P3 after the sizes: `basal serve`'s path on a checkpoint on disk, per layout (name -> attention and MLP biases)
CHECKPOINTS = {"basal-1.5": False, "basal-1.0": True}
CHECKPOINT_NEEDS_S = 20
SERVE_NEEDS_S = 40  # P3's `basal serve` over HTTP (bench/checks/serve_check.py)
CLOSE_TO_CPU = 2e-2  # f16 on the device vs the f32 CPU reference: max |diff| / max(1, max |reference|)
THROUGHPUT_TOKENS = (2048, 4096)  # tokens per forward for decisions/s
# P1 also probes every GEMM at these row counts (docs/gpu-path.md §8.2), most of which serving never passes (M = 1
# may be another library kernel): reported beside the verdict, which is taken on the buckets (`served_counts`)
PROBE_COUNTS = [1, 2, 3, 16, 17, 64, 100, 128, 129, 256, 640, 1024, 2048, 4096, 8192]
# the exit code of an interrupted run. SIGTERM: 124, what `timeout` returns for a command it stopped and what the
# device tool reads as "ran past its limit", so the code says the same whether the tool or this script set it (128 +
# 15 would read as a crash by a signal). Ctrl-C: 130, the shell's 128 + SIGINT. 1 is a failed check, 2 a usage error.
INTERRUPTED_RC = {"SIGTERM": 124, "KeyboardInterrupt": 130}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="output folder (gpu_check.json, gemm_table.json)")
    p.add_argument("--table", type=Path, metavar="JSON", help="print the summary table of a saved gpu_check.json")
    p.add_argument("--phases", default="0,1,2,3,4", help="comma-separated phase numbers to run")
    p.add_argument("--cpu-dry-run", action="store_true", help="toy sizes under the Triton interpreter, on the CPU")
    p.add_argument("--sizes", default="mini,4.5B,max", help="model shapes for P3")
    p.add_argument("--budget-s", type=float, default=230.0, help="skip P3 sizes that would not fit in this many s")
    p.add_argument("--library-defaults", action="store_true", help=argparse.SUPPRESS)  # P1's child process
    return p.parse_args()


class Report:
    """The JSON file, rewritten after every phase."""

    def __init__(self, path: Path, meta: dict):
        self.path, self.data = path, {"meta": meta, "phases": {}}
        self.write()

    def partial(self, name: str, result: dict) -> None:
        """A phase's results so far (P3 after every model size): a timeout mid-phase still leaves them."""
        self.data["phases"][name] = {**result, "partial": True}
        self.write()

    def phase(self, name: str, result: dict, seconds: float) -> None:
        result["seconds"] = round(seconds, 2)
        result["over_deadline"] = seconds > DEADLINES[name] * (1 if not self.data["meta"]["dry_run"] else 100)
        self.data["phases"][name] = result
        self.write()
        show(f"[{name}] {seconds:.1f} s: {json.dumps(result)[:600]}")

    def write(self) -> None:
        """Whole or not at all: a temporary file of its own, then os.replace. The SIGTERM handler writes the report
        too, possibly while this method runs; it raises once it has written, so this write never reaches its
        replace, and its unfinished temporary file is never the one renamed over the report."""
        from basal.core.home import write_text_atomic

        write_text_atomic(self.path, json.dumps(self.data, indent=1))


class Interrupted(BaseException):
    """The run was sent SIGTERM (the device tool's timeout). A BaseException, as KeyboardInterrupt: the phases'
    `except Exception`, which keep one failing part from costing the others, let it through to `main`."""


def on_sigterm(report: Report, current: dict, signum, frame) -> None:
    """Write the report and its table now (a SIGKILL may follow), then unwind to `main`, which adds the kernels,
    prints the table and exits 124. Children (the library-defaults probe, `basal serve`) are stopped on the way, by
    their own cleanup. Nothing is printed here: the main thread may be inside a print, which is not reentrant."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt what follows
    with contextlib.suppress(Exception):  # an OSError raised from here would pass for the interrupted part's own
        mark_interrupted(report, "SIGTERM", current)
        report.data["phases"]["P4"] = {"table": table_text(report.data)}
        report.write()
    raise Interrupted


def mark_interrupted(report: Report, by: str, current: dict) -> None:
    """Say in the report what stopped the run, in which phase and when (`current`: the phase and the run's start)."""
    after = round(time.perf_counter() - current["started"], 1)
    report.data["interrupted"] = {"by": by, "phase": current["phase"], "after_s": after}
    report.write()


def failure(e: BaseException, tail: int = 2000) -> dict:
    """An exception as a result (call inside its `except`): type, message and the end of its traceback."""
    return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-tail:]}


def out_of_time(stop: float) -> dict | None:
    """None while perf_counter is before `stop`; past it, the record of an entry skipped for the time budget."""
    over = time.perf_counter() - stop
    return None if over < 0 else {"skipped": f"time budget: past this phase's share of --budget-s by {over:.0f} s"}


def cuda_timer(fn, repeats: int, device) -> list[float]:
    """ms per call: CUDA events on a GPU, perf_counter on the CPU."""
    import torch

    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return out


# -- P0 -------------------------------------------------------------------------------------------------------


def difference(a, b) -> dict:
    """How two results that should have the same bits differ (recorded where a check fails, so one GPU run
    says whether it is a last-bit rounding difference or a wrong value): elements whose bit patterns differ (as
    the check compares them: -0.0 against 0.0, or two NaN payloads, differ by 0 but count), the largest absolute
    difference among them, how many have a NaN on a side (where present), and the first differing flat index."""
    import numpy as np

    a, b = np.ascontiguousarray(a).ravel(), np.ascontiguousarray(b).ravel()
    if a.shape != b.shape:
        return {"shapes": [list(a.shape), list(b.shape)]}
    if a.dtype != b.dtype:
        common = np.result_type(a, b)
        a, b = a.astype(common), b.astype(common)
    bits = np.dtype(f"u{a.dtype.itemsize}")  # an unsigned integer of the element's width
    unequal = np.flatnonzero(a.view(bits) != b.view(bits))
    gap = np.abs(a[unequal].astype(np.float64) - b[unequal].astype(np.float64))
    nan = np.isnan(gap)
    out = {
        "differing": int(unequal.size),
        "of": int(a.size),
        "max_abs": float(gap[~nan].max()) if (~nan).any() else 0.0,
        "first_index": int(unequal[0]) if unequal.size else None,
    }
    return {**out, "nan": int(nan.sum())} if nan.any() else out


def bitwise(pairs: dict[str, tuple]) -> tuple[dict[str, bool], dict[str, dict]]:
    """Named pairs of results that must have the same bits -> (name: equal, name: `difference` of the unequal)."""
    same = {name: a.tobytes() == b.tobytes() for name, (a, b) in pairs.items()}
    return same, {name: difference(*pairs[name]) for name, ok in same.items() if not ok}


def read_clocks() -> str:
    """`nvidia-smi -q -d CLOCK`, read only (the clocks are left alone, §8.2); without nvidia-smi in the image, a
    line that says so: the ceilings P0 measures still count."""
    import subprocess

    try:
        return subprocess.run(["nvidia-smi", "-q", "-d", "CLOCK"], capture_output=True, text=True, timeout=5).stdout[
            -1500:
        ]
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"not read: {type(e).__name__}: {e}"


def phase_env(device, dry: bool) -> dict:
    import torch

    from basal.backends.cuda.gpu.environment import device_stack, invariant_settings

    res = {"versions": device_stack(device)}
    if device.type == "cuda":  # (the dry run applies none of R7: nothing to read back)
        res["cublas_settings"] = invariant_settings()  # R7, as torch reads it back
        res["clocks"] = read_clocks()
    n = (1 << 16) if dry else (1 << 29)  # f16 elements: 1 GiB on the GPU
    src = torch.randn(n, device=device).half()
    dst = torch.empty_like(src)
    ms = statistics.median(cuda_timer(lambda: dst.copy_(src), 3 if dry else 10, device))
    res["copy_TBps"] = 2 * src.numel() * 2 / (ms * 1e-3) / 1e12
    m = 256 if dry else 8192
    a, b = torch.randn(m, m, device=device).half(), torch.randn(m, m, device=device).half()
    if not dry:
        ms = statistics.median(cuda_timer(lambda: torch.mm(a, b), 10, device))
        res["mm_TFLOPs"] = 2 * m**3 / (ms * 1e-3) / 1e12
    return res


# -- P1 -------------------------------------------------------------------------------------------------------


def gemm_shapes(size: str) -> list[tuple[int, int]]:
    hidden, inter, _, heads, kv = SHAPES[size]
    return list(weight_shapes(hidden, inter, heads, kv).values())


def biased_shapes(dry: bool) -> list[tuple[int, int]]:
    """The GEMM shapes of basal-1.0-4.5B (those of 4.5B); toy ones in the dry run."""
    return [(32, 64), (64, 128)] if dry else gemm_shapes("4.5B")


def served_counts(dry: bool) -> list[int]:
    """The row counts a GEMM of `basal serve` passes (its buckets, as the backend's own probe runs them)."""
    from basal.backends.cuda.gpu.buckets import probed_row_counts

    return probed_row_counts(64 if dry else 8192)


SAME = "same bits"  # a `tri` tile configuration's output against the first one's


def phase_gemm(device, dry: bool, out: Path, report: Report, stop: float) -> dict:
    """Every GEMM shape on its own (a failure is recorded with its traceback and the next shape still runs), the
    results written after each, the GEMM table saved from the shapes probed so far; then the extra evidence. Past
    `stop` (perf_counter) the remaining entries are skipped and say so."""
    import torch

    from basal.backends.cuda.gpu import gemm_table as gt
    from basal.backends.cuda.gpu.environment import device_stack

    counts = served_counts(dry)
    if dry:
        shapes, any_counts, gemms = [(32, 64), (64, 128)], [1, 2, 3, 17, 64, 65], ("tri",)
    else:
        shapes = [s for size in SHAPES for s in gemm_shapes(size)]
        any_counts, gemms = PROBE_COUNTS, gt.PREFERENCE
    key = gt.table_key(device_stack(device), "f16")
    res = {"shapes": {}, "tri_configs_equal": {}, "tri_configs": {}, "row_counts": counts, "any_row_counts": any_counts}
    g = torch.Generator(device=device).manual_seed(1)
    probed = []
    for n, k in dict.fromkeys(shapes):
        name, skipped = f"{n}x{k}", out_of_time(stop)
        try:
            if skipped:
                res["shapes"][name] = skipped
            else:
                entry, res["shapes"][name], configs = gemm_shape(n, k, device, dry, counts, any_counts, gemms, key, g)
                res["tri_configs"][name] = configs
                res["tri_configs_equal"][name] = all(v == SAME for v in configs.values())
                probed.append(entry)
                gt.GemmTable(key, list(counts), probed).save(out / "gemm_table.json")
        except Exception as e:
            res["shapes"][name] = failure(e)
        report.partial("P1", res)
    # extra evidence, each on its own: a failure is recorded there and costs the phase nothing else
    for part, check in (
        ("lt_library_defaults", lambda: library_defaults(dry)),
        ("bias", lambda: bias_probe(device, dry, counts, gemms)),
        ("swiglu_warps", lambda: swiglu_warps(device, dry)),
    ):
        res[part] = out_of_time(stop) or isolated(check)
        report.partial("P1", res)
    return res


def gemm_shape(n: int, k: int, device, dry: bool, counts, any_counts, gemms, key, g):
    """One GEMM shape: the GEMM probe over serving's row counts (as the backend's own probe runs it), the `tri`
    tile configurations against each other, every GEMM timed and probed at any row count. -> (the GEMM
    table's entry, the shape's results, the tile configurations' comparison)."""
    import torch

    from basal.backends.cuda.gpu import gemm_table as gt

    (entry,) = gt.probe([(n, k)], torch.float16, device, counts, key, gemms, None).shapes
    timed_rows = [16, 128] if dry else [16, 128, 512, 2048, 8192]
    x, w, _ = gt.random_operands(max(counts + any_counts + timed_rows), n, k, torch.float16, g)
    tri_configs = isolated(lambda: tile_configs_compared(x, w))
    timings, copies = {}, gt.weight_copies(w)
    for name in gemms:
        for m in timed_rows:
            ms = gt.time_gemm(gt.GEMMS[name], x, w, m, repeats=3 if dry else 20, copies=copies)
            bytes_moved = 2 * (n * k + m * k + m * n)
            timings[f"{name}@{m}"] = {"ms": ms, "TBps": bytes_moved / (ms * 1e-3) / 1e12}
            timings[f"{name}@{m}"]["TFLOPs"] = 2 * m * n * k / (ms * 1e-3) / 1e12
    result = {
        "gemm": entry.gemm,
        "candidates": {c: vars(v) for c, v in entry.candidates.items()},
        "any_row_count": {name: gt.probe_gemm(gt.GEMMS[name], x, w, any_counts) for name in gemms},
        "timings": timings,
    }
    return entry, result, tri_configs


def tile_configs_compared(x, w) -> dict[str, str]:
    """Every `tri` tile configuration of GEMM_REGIMES against the first, one output at a time, compared on the
    device: "regime tiles" -> SAME, "differs", or the error it raised. All are compared: one that differs or fails
    hides none of the others."""
    from basal.backends.cuda.gpu import triton_gemm
    from basal.backends.cuda.gpu.kernel_configs import GEMM_REGIMES

    configs = [(f"{regime} {t.name}", t) for regime, tiles in GEMM_REGIMES.items() for t in tiles]
    first = triton_gemm.linear(x, w, tiles=configs[0][1])
    out = {configs[0][0]: SAME}
    for name, tiles in configs[1:]:
        try:
            out[name] = SAME if same_bits(first, triton_gemm.linear(x, w, tiles=tiles)) else "differs"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"
    return out


def same_bits(a, b) -> bool:
    """Two 16-bit results bit for bit, on their device (no copy of [8192, N] outputs to the host)."""
    import torch

    return bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))


def isolated(check) -> dict:
    """check() -> dict, or `failure` when it raises."""
    try:
        return check()
    except Exception as e:
        return failure(e)


def library_defaults(dry: bool) -> dict:
    """`lt` as cuBLASLt runs without the rest of R7 (its default workspace, split-K and reduced-precision
    reductions), probed on the 4.5B shapes at serving's row counts in a child process: the environment must be set
    before CUDA initialises cuBLAS, and this one has R7. What the probe would have found without R7: per shape,
    invariant or the first row count that differs."""
    import subprocess

    argv = [sys.executable, str(Path(__file__).resolve()), "--library-defaults"] + (["--cpu-dry-run"] if dry else [])
    from basal.backends.cuda.gpu.environment import CUBLAS_ENV

    env = {k: v for k, v in os.environ.items() if k not in CUBLAS_ENV}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return {"error": (done.stdout + done.stderr)[-1500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def library_defaults_child(dry: bool) -> int:
    """The child of `library_defaults`: probes `lt` with the library's defaults, prints one JSON line. It asks for
    cuBLASLt, as the backend does: without that torch runs its GEMMs on cuBLAS, another library."""
    import torch

    from basal.backends.cuda.gpu import gemm_table as gt

    device = torch.device("cpu" if dry else "cuda")
    if device.type == "cuda":
        torch.backends.cuda.preferred_blas_library("cublaslt")
    counts = served_counts(dry)
    g = torch.Generator(device=device).manual_seed(0)
    out = {}
    with torch.inference_mode():
        for n, k in biased_shapes(dry):
            x, w, _ = gt.random_operands(max(counts), n, k, torch.float16, g)
            ok, detail = gt.probe_gemm(gt.lt_linear, x, w, counts)
            out[f"{n}x{k}"] = {"invariant": ok, "detail": detail}
    print(json.dumps(out))
    return 0


def bias_probe(device, dry: bool, counts: list[int], gemms) -> dict:
    """basal-1.0 checkpoints (4.5B shapes) add a bias in every GEMM: the GEMM each shape gets when the probe runs
    the GEMMs' bias epilogues, and whether each is invariant."""
    import torch

    from basal.backends.cuda.gpu import gemm_table as gt
    from basal.backends.cuda.gpu.environment import device_stack

    key = gt.table_key(device_stack(device), "f16")
    table = gt.probe(biased_shapes(dry), torch.float16, device, counts, key, gemms, bias=True)
    return {
        f"{e.n}x{e.k}": {"gemm": e.gemm, "invariant": {c: v.invariant for c, v in e.candidates.items()}}
        for e in table.shapes
    }


def swiglu_warps(device, dry: bool) -> dict:
    """The fused SwiGLU GEMM (two accumulators) at the plain GEMM's warps and at twice them, per gate_up shape: ms
    at 128 and 2048 rows, and whether the two give the same bits. It ships at the plain GEMM's configuration."""
    import torch

    from basal.backends.cuda.gpu import gemm_table as gt
    from basal.backends.cuda.gpu.kernel_configs import GemmTiles, gemm_tiles
    from basal.backends.cuda.gpu.triton_gemm import linear

    sizes = {"toy": (64, 32)} if dry else {size: gemm_shapes(size)[2] for size in SHAPES}  # [gate; up]
    g, res = torch.Generator(device=device).manual_seed(2), {}
    for name, (n, k) in sizes.items():
        x, w, _ = gt.random_operands(16 if dry else 2048, n, k, torch.float16, g)
        plain, copies = gemm_tiles(n, k), gt.weight_copies(w)
        entry, outputs = {}, []
        for warps in (plain.warps, 2 * plain.warps):
            tiles = GemmTiles(plain.bm, plain.bn, warps, plain.stages, plain.bk)

            def fused(xs, ws, _out, tiles=tiles):
                return linear(xs, ws, epilogue="swiglu", tiles=tiles)

            outputs.append(fused(x, w, None))
            for m in (16,) if dry else (128, 2048):
                entry[f"w{warps}@{m}_ms"] = gt.time_gemm(fused, x, w, m, repeats=3 if dry else 20, copies=copies)
        res[name] = {**entry, "same_bits": same_bits(*outputs)}
    return res


# -- P2 -------------------------------------------------------------------------------------------------------


def phase_attention(device, dry: bool, report: Report, stop: float) -> dict:
    """alone = tree = readout-only = regrouped for the three head layouts and both precisions; error vs f64. Each
    precision and layout on its own (a failure is recorded with its traceback and the next one still runs), the
    results written after each; past `stop` (perf_counter) the remaining ones are skipped and say so."""
    from basal.backends.cuda.gpu.kernel_configs import ATTENTION

    layouts = {"G6": (6, 1), "G8": (8, 1), "G4": (8, 2)} if dry else {"mini": (12, 2), "4.5B": (16, 2), "max": (32, 8)}
    res = {}
    for precision, cfg in ATTENTION.items():
        for name, (heads, kv) in layouts.items():
            case = functools.partial(attention_case, device, dry, cfg, heads, kv, timed=not dry or name == "G6")
            res[f"{precision}/{name}"] = out_of_time(stop) or isolated(case)
            report.partial("P2", res)
    return res


def attention_case(device, dry: bool, cfg, heads: int, kv: int, timed: bool) -> dict:
    """One precision and head layout over P2's prefix lengths: the alone, tree and readout-only passes' bits, and
    the alone pass's error against f64; `timed`: the long-prompt timing too."""
    import torch

    from basal.backends.cuda.gpu.triton_attention import tree_attention
    from bench.checks.attention_cases import layout, plan_tensors, random_chain, reference

    dim, bn, dt = 16 if dry else 128, cfg.bn, torch.float16
    att = torch.float32 if cfg.precision == "f32" else dt
    prefixes = [1, bn + 1] if dry else [1, bn - 1, bn, bn + 1, 2 * bn + 5, 137]
    worst, equal, differences = 0.0, True, {}
    for keys in prefixes:
        n, cached = keys + 1, min(5, keys)
        chain = random_chain(n, cached, heads, kv, dim, seed=keys, dtype=att)
        outs = []
        for cuts, sibs, ro in (
            ([], [], False),
            ([max(cached + 1, n - 3)], [3], False),
            ([max(cached + 1, n - 3)], [3], True),
        ):
            cuts = [c for c in cuts if c < n]
            batch, q, k, v, row_of = layout(chain, cuts, sibs, seed=keys)
            row = row_of[n - 1]
            tiles, count, ranges = plan_tensors(batch, cached, cfg.tokens_per_tile(heads // kv), ro, row)
            pk = chain.k[:cached].to(att) if cached else torch.zeros(1, kv, dim, dtype=att)
            pv = chain.v[:cached].to(dt) if cached else torch.zeros(1, kv, dim, dtype=dt)
            o = torch.zeros(q.shape[0], heads, dim, dtype=dt, device=device)
            args = [t.to(device) for t in (q.to(att), k.to(att), v.to(dt), pk, pv)]
            count = blob_count(count, ro, device)
            tree_attention(*args, o, tiles.to(device), count, ranges.to(device), cfg)
            outs.append(o[row].cpu())
        for variant, x in zip(("tree", "readout_only"), outs[1:], strict=True):
            if not torch.equal(outs[0].view(torch.int16), x.view(torch.int16)):
                equal = False
                differences[f"prefix {keys}, {variant}"] = difference(outs[0].numpy(), x.numpy())
        worst = max(worst, float((outs[0].double() - reference(chain, n - 1)).abs().max()))
    res = {"bitwise_equal": equal, "max_abs_error_vs_f64": worst}
    if differences:
        res["differences"] = differences
    if timed:
        res["timing"] = isolated(lambda: attention_timing(device, dry, heads, kv, dim, cfg))
    return res


def blob_count(count, readout_only: bool, device):
    """A tile count where serving passes it: int32 0 (tiles) or 1 (readout tiles) of the metadata blob's counts
    (model.py: `meta["counts"][1:2]` in the last layer). Triton specialises a pointer on 16-byte alignment, so the
    readout count, 4 bytes in, runs another compiled variant than a tensor of its own would."""
    import torch

    from basal.core.packing.tile_layout import COUNTS

    i = 1 if readout_only else 0
    counts = torch.zeros(COUNTS, dtype=torch.int32, device=device)
    counts[i] = int(count[0])
    return counts[i : i + 1]


def attention_timing(device, dry: bool, heads: int, kv: int, dim: int, cfg) -> dict:
    """One prompt of T tokens attending causally over itself (the long-prompt case): ms and TFLOP/s."""
    import torch

    from basal.backends.cuda.gpu.triton_attention import tree_attention
    from bench.checks.attention_cases import layout, plan_tensors, random_chain

    tokens = 64 if dry else 4096
    att = torch.float32 if cfg.precision == "f32" else torch.float16
    chain = random_chain(tokens, 0, heads, kv, dim, seed=7, dtype=att)
    batch, q, k, v, _ = layout(chain, [], [], seed=7)
    tiles, count, ranges = plan_tensors(batch, 0, cfg.tokens_per_tile(heads // kv))
    empty = torch.zeros(1, kv, dim, device=device)
    args = (q.to(device), k.to(device), v.to(device, torch.float16), empty.to(att), empty.half())
    o = torch.zeros(tokens, heads, dim, dtype=torch.float16, device=device)
    meta = (tiles.to(device), blob_count(count, False, device), ranges.to(device))

    def call():
        tree_attention(*args, o, *meta, cfg)

    call()
    ms = statistics.median(cuda_timer(call, 1 if dry else 10, device))
    flops = 4 * heads * dim * tokens * (tokens + 1) / 2  # q.k and p.v over every causal pair
    return {"tokens": tokens, "ms": ms, "TFLOPs": flops / (ms * 1e-3) / 1e12}


# -- P3 -------------------------------------------------------------------------------------------------------


def synthetic_backend(size: str, device, dry: bool):
    """A GpuBackend over distinct random f16 weights per layer, made on the device (no checkpoint on disk)."""
    import torch

    from basal.backends.cuda.gpu.backend import GpuBackend
    from basal.backends.cuda.gpu.weights_direct import DeviceWeights
    from basal.core.model.model_dir import LlamaConfig

    hidden, inter, layers, heads, kv = (TOY | SHAPES)[size]
    hd = 16 if dry else 128
    cfg = LlamaConfig(hidden, inter, layers, heads, kv, hd, 64 if dry else 32000, 1e-5, 1e6, 8192, False)
    w = DeviceWeights.random(cfg, torch.float16, device)
    return GpuBackend(None, "f16", device, weights=w, arena_tokens=64 if dry else 8192, progress=False)


def questions(n: int, rng: random.Random, prefix: tuple[int, ...], state_len: int, vocab: int):
    from basal.core.packing.tree import TokenizedQuestion

    out = []
    for _ in range(n):
        state = tuple(rng.randrange(vocab) for _ in range(state_len))
        tail = [tuple(rng.randrange(vocab) for _ in range(6)) for _ in range(2)]
        out.append(TokenizedQuestion("en", str(state), tuple(prefix + state + t for t in tail)))
    return out


def phase_model(device, dry: bool, sizes: list[str], report: Report, deadline: float) -> dict:
    """Every size, then `basal serve`'s path (a checkpoint per layout, and serve itself over HTTP), each on its own:
    a failure is recorded with its traceback and the next one still runs; the results are written after each; one
    that would not fit before `deadline` (perf_counter) is skipped, so the order is the priority: the basal-1.5
    checkpoint first (what auto picks; cheap, and it compiles the kernels of mini's shapes for the mini size), the
    sizes' invariance and speed, serve over HTTP, the basal-1.0 layout."""

    def checkpoint(name: str):
        bias = CHECKPOINTS[name]
        return f"checkpoint {name}", CHECKPOINT_NEEDS_S, lambda: checkpoint_checks(device, dry, bias)

    items = [checkpoint("basal-1.5")] if not dry else []  # the dry run checks one layout, the one with more code
    items += [(size, SIZE_NEEDS_S.get(size, 45), lambda size=size: model_checks(size, device, dry)) for size in sizes]
    items.append(
        ("serve", SERVE_NEEDS_S, lambda: serve_checks("cuda" if device.type == "cuda" else "cpu", dry, deadline))
    )
    items.append(checkpoint("basal-1.0"))
    res = {}
    for key, needs, check in items:
        left = deadline - time.perf_counter()
        if left < needs:
            res[key] = {"skipped": f"{left:.0f} s of the budget left, {needs} s needed"}
        else:
            try:
                res[key] = check()
            except Exception as e:
                res[key] = failure(e, tail=3000)
            release_memory(device)
        report.partial("P3", res)
    return res


def release_memory(device) -> None:
    """Give the last item's device memory back before the next one. A GpuBackend refers to itself (its model holds
    its bound methods), so dropping the last name frees nothing until the cycle collector runs: without it the
    weights, arenas and graph pools of every size and checkpoint would pile up on the device."""
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def timed_decisions(be, qs, prefix, letters, device, dry: bool) -> dict:
    """decisions/s of one forward over `qs`, after an eager and a capturing warm-up (the replays are timed)."""
    from basal.core.packing.passes import run_to_end
    from basal.core.packing.tree import split_forwards

    (fwd,) = split_forwards(qs, letters, {"en": prefix})
    for _ in range(0 if dry else 2):
        run_to_end(be.run(fwd.packed))
    ms = statistics.median(cuda_timer(lambda: run_to_end(be.run(fwd.packed)), 1 if dry else 10, device))
    return {
        "tokens": int(fwd.packed.n_tokens),
        "questions": len(qs),
        "ms": ms,
        "decisions_per_s": len(qs) / (ms * 1e-3),
    }


def overlap_check(be, batch, reference, device, dry: bool) -> dict:
    """Single decisions back to back, one after the other vs two in flight (core/packing/passes.py: the next forward is
    queued before the last one's readback is waited for): the bits, and the time per forward of each."""
    from basal.core.packing.passes import overlapped, run_to_end

    k, results = (2 if dry else 8), {}
    k_sequential = 1 if dry else k  # the dry run times one (its ratio means nothing there)

    def one_by_one():
        for _ in range(k_sequential):
            run_to_end(be.run(batch))

    def in_flight():
        run_to_end(overlapped((be.run(batch) for _ in range(k)), results.__setitem__))

    repeats = 1 if dry else 5
    sequential = statistics.median(cuda_timer(one_by_one, repeats, device)) / k_sequential
    overlapping = statistics.median(cuda_timer(in_flight, repeats, device)) / k
    return {
        "forwards": k,
        "sequential_ms": sequential,
        "overlapped_ms": overlapping,
        "speedup": sequential / overlapping,
        "bitwise": all(results[i].tobytes() == reference.tobytes() for i in range(k)),
    }


def interleave_check(be, single, batched, single_ref, batched_ref) -> bool:
    """The engine's hardest case on the device, in one thread: a long-lane pass (eager, paced) paused between
    layers while main-lane passes replay their graph with two in flight; every result keeps its alone bits."""
    from basal.core.packing.passes import overlapped, run_to_end

    long = be.run(batched, preemptible=True)
    next(long)  # its first layer queued: it pauses there, as the long lane steps aside
    results = {}
    run_to_end(overlapped((be.run(single) for _ in range(2)), results.__setitem__))
    resumed = run_to_end(long)
    same_single = all(r.tobytes() == single_ref.tobytes() for r in results.values())
    return resumed.tobytes() == batched_ref.tobytes() and same_single


def state_cache_check(
    be, question, prefix: tuple[int, ...], state_len: int, letters, alone, device, dry: bool
) -> tuple[dict[str, bool], dict[str, float]]:
    """The state cache on the device: a pass that fills the question's state entry (eager, its rows copied out after
    every layer), then three passes that read the entry (eager, captured, replayed): each keeps the bits of the
    question with the cache off (`alone`). Then what each costs: a miss's pass (eager, filling) and a hit's (a
    replay of the question's tokens after the entry), median ms, beside the cache-off single decision. Run last:
    reserving the entry's rows grows the prefix buffers, which drops the graphs."""
    from dataclasses import replace

    from basal.core.packing.passes import run_to_end
    from basal.core.packing.tree import split_forwards

    n = len(prefix) + state_len
    be.reserve_states(2 * n * be.net.slab.row_bytes)
    (miss,) = split_forwards([replace(question, fill=("state-check", n))], letters, {"en": prefix})
    filled = run_to_end(be.run(miss.packed))
    cached = {"en": prefix, "state-check": question.prompts[0][:n]}
    (hit,) = split_forwards([replace(question, prefix_key="state-check")], letters, cached)
    hits = [run_to_end(be.run(hit.packed)) for _ in range(3)]
    same = {
        "=state_cache_miss": filled.tobytes() == alone.tobytes(),
        "=state_cache_hits": all(h.tobytes() == alone.tobytes() for h in hits),
    }

    def refill() -> None:
        be.drop_prefix("state-check")
        run_to_end(be.run(miss.packed))

    repeats = 1 if dry else 30
    miss_ms = cuda_timer(refill, repeats, device)
    hit_ms = cuda_timer(lambda: run_to_end(be.run(hit.packed)), repeats, device)
    be.drop_prefix("state-check")
    return same, {"miss_ms_median": statistics.median(miss_ms), "hit_ms_median": statistics.median(hit_ms)}


def model_checks(size: str, device, dry: bool) -> dict:
    """Bitwise: eager = graph = replay = a larger bucket = in a 16-question batch = the eager evidence pass = two in
    flight = beside a paused long-lane pass = a state cache miss and its hits; every logit finite; then
    single-decision latency and decisions/s at 2k and 4k tokens per forward."""
    import numpy as np

    from basal.core.packing.passes import run_to_end
    from basal.core.packing.tree import split_forwards

    started = time.perf_counter()
    be = synthetic_backend(size, device, dry)
    rng = random.Random(0)
    vocab = be.weights.cfg.vocab_size
    prefix = tuple(rng.randrange(vocab) for _ in range(10 if dry else 66))
    be.prefix("en", prefix)
    letters = list(range(10))
    state_len = 8 if dry else 100
    single = questions(1, rng, prefix, state_len, vocab)
    others = questions(1 if dry else 15, rng, prefix, state_len, vocab)
    (fwd,) = split_forwards(single, letters, {"en": prefix})
    eager = run_to_end(be.run(fwd.packed))  # first use: eager
    graph = run_to_end(be.run(fwd.packed))  # second use: captured, then replayed (CUDA)
    replay = run_to_end(be.run(fwd.packed))
    bigger = run_to_end(be.run(fwd.packed, pad_to=2 * fwd.packed.n_tokens + 64))
    residual = {}
    head = be.net.head

    def head_noting_the_residual(b, *args):  # eager only: reads a device value back
        residual["max_abs"] = float(b.hr[: len(fwd.packed.readouts)].float().abs().max())
        return head(b, *args)

    be.net.head = head_noting_the_residual
    try:
        with_hidden, _ = run_to_end(be.run_with_hidden(fwd.packed))
    finally:
        be.net.head = head
    (batched,) = split_forwards(single + others, letters, {"en": prefix})
    in_batch = run_to_end(be.run(batched.packed))
    row = batched.readout_of[(0, 0)]
    pairs = {
        "eager=graph": (eager, graph),
        "graph=replay": (graph, replay),
        "=bigger_bucket": (eager, bigger),
        "=in_batch": (eager[fwd.readout_of[(0, 0)]], in_batch[row]),
        "=eager_evidence_pass": (eager, with_hidden),
    }
    same, differences = bitwise(pairs)
    same["finite"] = bool(np.isfinite(eager).all() and np.isfinite(in_batch).all())
    ms = cuda_timer(lambda b=fwd.packed, be=be: run_to_end(be.run(b)), 1 if dry else 100, device)
    overlap = overlap_check(be, fwd.packed, eager, device, dry)
    same["=overlapped"] = overlap.pop("bitwise")
    same["=interleaved"] = interleave_check(be, fwd.packed, batched.packed, eager, in_batch)
    throughput = {}
    for target in (64,) if dry else THROUGHPUT_TOKENS:
        n = max(2, target // (state_len + 12))  # each question: its state and two 6-token option tails
        throughput[str(target)] = timed_decisions(
            be, questions(n, rng, prefix, state_len, vocab), prefix, letters, device, dry
        )
    graphs = len(be.graphs.graphs)
    cache_bits, cache_ms = state_cache_check(be, single[0], prefix, state_len, letters, eager, device, dry)
    same.update(cache_bits)
    described = be.describe()
    out = {
        "bitwise": same,
        **({"differences": differences} if differences else {}),
        "single_tokens": int(fwd.packed.n_tokens),
        "single_ms_median": statistics.median(ms),
        "single_ms_p90": sorted(ms)[int(0.9 * (len(ms) - 1))],
        "throughput": throughput,
        "overlap": overlap,
        "gemms": described["gemm_kernels"],
        "fused_epilogues": described["fused_epilogues"],
        "max_abs_logit": float(abs(eager).max()),
        "max_abs_residual": residual.get("max_abs"),  # f16 overflows at 65504
        "graphs": graphs,
        "state_cache": cache_ms,  # a miss (eager, filling) and a hit (replayed), against single_ms_median
        "seconds": time.perf_counter() - started,
    }
    return out


def checkpoint_checks(device, dry: bool, bias: bool) -> dict:
    """`basal serve`'s path, which the synthetic device weights above skip: a checkpoint on disk (bf16 safetensors,
    mini shapes cut to 2 layers; the demo model's in the dry run), `load_backend(model, "auto")` (on CUDA the torch
    backend hands over to the GPU path, f16, weights read straight to the device), a template prefix, the serve
    start's CUDA graphs (`warm_up`), then a question: alone = in a batch and the warm graph = an eager pass,
    bitwise, and close to the torch CPU f32 backend on the same checkpoint."""
    import tempfile

    import numpy as np

    from basal.backends.cuda.backend import TorchBackend
    from basal.backends.cuda.gpu.backend import GpuBackend
    from basal.backends.load import load_backend
    from basal.core.model.model_dir import ModelDir
    from basal.core.model.synth import synth_model
    from basal.core.packing.passes import run_to_end
    from basal.core.packing.tree import split_forwards

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_model.") as tmp:
        preset = "demo" if dry else "mini"
        model = ModelDir.load(synth_model(Path(tmp) / "model", preset, layers=CHECKPOINT_LAYERS, bias=bias))
        written = time.perf_counter()
        picked = load_backend(model, "auto")
        be = picked if device.type == "cuda" else GpuBackend.load(model, "f16", "cpu", arena_tokens=64, progress=False)
        loaded = time.perf_counter()
        rng = random.Random(1)
        vocab = model.config.vocab_size
        prefix = tuple(rng.randrange(vocab) for _ in range(10 if dry else 66))
        be.prefix("en", prefix)
        prefixed = time.perf_counter()
        graphs = be.warm_up()
        warmed = time.perf_counter()
        state_len = 8 if dry else 100
        qs = questions(2, rng, prefix, state_len, vocab)
        letters = list(range(10))
        (alone,) = split_forwards(qs[:1], letters, {"en": prefix})
        (both,) = split_forwards(qs, letters, {"en": prefix})
        first = run_to_end(be.run(alone.packed))  # a warm bucket on CUDA: replayed from its first use
        eager = run_to_end(be.run(alone.packed, preemptible=True))  # the long lane's way: eager, layer by layer
        in_batch = run_to_end(be.run(both.packed))
        cpu = TorchBackend.load(model, dtype="f32", device="cpu") if device.type == "cuda" else picked  # f32, CPU
        cpu.prefix("en", prefix)
        reference = run_to_end(cpu.run(both.packed))
    error = float(np.abs(in_batch - reference).max()) / max(1.0, float(np.abs(reference).max()))
    row = both.readout_of[(0, 0)]
    same, differences = bitwise(
        {"alone=in_batch": (first[alone.readout_of[(0, 0)]], in_batch[row]), "warm_graph=eager": (first, eager)}
    )
    expected = "GpuBackend" if device.type == "cuda" else "TorchBackend"  # auto on a machine without CUDA: the CPU
    return {
        "checks": {
            "auto_picks_gpu_path" if device.type == "cuda" else "auto_picks_cpu": type(picked).__name__ == expected,
            "f16": be.dtype == "f16",
            **same,
            "finite": bool(np.isfinite(in_batch).all()),
            "close_to_cpu_f32": error <= CLOSE_TO_CPU,
        },
        "preset": f"{preset}, {CHECKPOINT_LAYERS} layers" + (", biases" if bias else ""),
        "differences": differences,
        "backend": type(picked).__name__,
        "max_rel_error_vs_cpu_f32": error,
        "same_decisions_as_cpu": bool((in_batch[:, :2].argmax(1) == reference[:, :2].argmax(1)).all()),
        "write_s": written - started,
        "load_s": loaded - written,
        "weights_load_s": getattr(be.weights, "load_seconds", None),
        "prefix_s": prefixed - loaded,
        "warm_up_graphs": graphs,
        "warm_up_s": warmed - prefixed,
        "seconds": time.perf_counter() - started,
    }


# -- P4 -------------------------------------------------------------------------------------------------------


def launched_kernels() -> dict[str, list[dict]]:
    """Every compiled variant of the GPU path's kernels this process launched, as the driver loaded it: warps,
    stages, shared memory, registers, spills, its constexprs and the arguments the launch marked 16-divisible.
    The launch's view of what sm90_compile.py checks offline (no spills; one variant per configuration: another
    specialisation would be a variant the offline check never compiled). Empty under the interpreter."""
    from bench.checks.sm90_compile import KERNELS, kernel_function

    out = {}
    for name in KERNELS:
        fn = kernel_function(name)
        variants = []
        for cache in getattr(fn, "device_caches", {}).values():  # JITFunction: device -> (kernels by key, ...)
            for kernel in cache[0].values():
                src, md = getattr(kernel, "src", None), kernel.metadata
                constants = {fn.arg_names[k[0]]: str(v) for k, v in getattr(src, "constants", {}).items()}
                variants.append({
                    "warps": md.num_warps, "stages": md.num_stages, "shared": md.shared,
                    "registers": getattr(kernel, "n_regs", None), "spills": getattr(kernel, "n_spills", None),
                    "constexprs": constants,
                    "divisible": divisible(fn, getattr(src, "attrs", {})),
                })  # fmt: skip
        out[name] = variants
    return out


def divisible(fn, attrs: dict) -> list[str]:
    """The arguments a launch marked 16-divisible. Triton records an entry for every specialised argument, the
    unaligned ones with an empty list, so the key alone says nothing: the `tt.divisibility` 16 inside it does."""
    return sorted(fn.arg_names[k[0]] for k, v in attrs.items() if ["tt.divisibility", 16] in [list(a) for a in v])


def kernel_lines(kernels: dict[str, list[dict]]) -> list[str]:
    if not any(kernels.values()):
        return []
    lines = ["", "kernels launched   variants   registers   spills (B)   shared (KiB)"]
    for name, variants in kernels.items():
        if not variants:
            continue
        regs = [v["registers"] for v in variants if v["registers"] is not None] or [0]
        spills = max((v["spills"] or 0) for v in variants)
        shared = max(v["shared"] for v in variants) / 1024
        lines.append(f"{name:<18} {len(variants):8d}   {min(regs):3d}-{max(regs):<5d} {spills:8d}   {shared:12.0f}")
    return lines


def any_row_count_lines(gemms: dict[str, dict]) -> list[str]:
    """Per GEMM, on how many shapes it is also invariant over P1's other row counts (M = 1, 2, 3, 17, ...),
    which serving never passes; the shapes where it is not, with the first row that differs."""
    found: dict[str, list[tuple[str, bool, str]]] = {}
    for shape, g in gemms.items():
        for gemm, (ok, detail) in g.get("any_row_count", {}).items():
            found.setdefault(gemm, []).append((shape, ok, detail))
    lines = ["", "invariant at any row count (not only serving's buckets):"] if found else []
    for gemm, rows in found.items():
        failed = "; ".join(f"{shape} {detail}" for shape, ok, detail in rows if not ok)
        passed = sum(ok for _, ok, _ in rows)
        lines.append(f"  {gemm}: {passed} of {len(rows)} shapes" + (f" (not: {failed})" if failed else ""))
    return lines


def checkpoint_lines(rows: dict[str, dict]) -> list[str]:
    """P3's checkpoints on disk: what `auto` picked, the load and warm-up times, the error against the CPU."""
    if not rows:
        return []
    lines = ["", "serve path, checkpoint on disk   backend         load s   warm-up graphs (s)   vs CPU f32   checks"]
    for key, r in rows.items():
        name = key.removeprefix("checkpoint ")
        if "checks" not in r:
            lines.append(f"{name:<32} {not_run(r)}")
            continue
        lines.append(
            f"{name:<32} {r['backend']:<14} {r['load_s']:7.2f}   {r['warm_up_graphs']:>6d} ({r['warm_up_s']:6.2f})"
            f"       {r['max_rel_error_vs_cpu_f32']:9.2e}   {verdict(r['checks'])}"
        )
    return lines


def settings_lines(read: dict) -> list[str]:
    """A line only where an R7 setting read back otherwise than wanted: then the probe's verdicts carry the run."""
    from basal.backends.cuda.gpu.environment import SETTINGS_WANTED

    wrong = {k: read[k] for k in SETTINGS_WANTED if read.get(k, "unknown") not in (SETTINGS_WANTED[k], "unknown")}
    return ["", f"cuBLAS settings that did not take effect (R7): {wrong}"] if wrong else []


def summary(phases: dict) -> str:
    """The P3 sizes against the anchors and the weight-streaming floor, then each GEMM against the ceilings, and
    the kernels the run launched (P4's `kernels`)."""
    p0 = phases.get("P0", {})
    copy_tbps, mm_tflops = p0.get("copy_TBps"), p0.get("mm_TFLOPs")
    weights_gb = {"mini": 3.0, "4.5B": 9.25, "max": 21.8}
    lines = [
        "",
        "size   single ms (p90)   H100 upstream / basal-rs   H200 target   floor @copy BW   decisions/s @2k / @4k"
        "   bitwise",
    ]
    model_rows = {k: r for k, r in phases.get("P3", {}).items() if not k.startswith("checkpoint") and k != "serve"}
    for size, r in model_rows.items():
        if not isinstance(r, dict):
            continue
        if "bitwise" not in r:
            lines.append(f"{size:<6} {not_run(r)}")
            continue
        up, rs, target = ANCHORS.get(size, (float("nan"),) * 3)
        floor = weights_gb.get(size, 0) / copy_tbps if copy_tbps else float("nan")
        rates = " / ".join(f"{t['decisions_per_s']:.0f}" for t in r.get("throughput", {}).values())
        ok = verdict(r["bitwise"])
        lines.append(
            f"{size:<6} {r['single_ms_median']:7.2f} ({r['single_ms_p90']:.2f})   {up:5.1f} / {rs:5.1f}"
            f"                {target:5.1f}         {floor:6.2f} ms      {rates:<21}   {ok}"
        )
    lines += checkpoint_lines({k: r for k, r in phases.get("P3", {}).items() if k.startswith("checkpoint")})
    lines += serve_lines(phases.get("P3", {}).get("serve"))
    overlaps = {k: r["overlap"] for k, r in phases.get("P3", {}).items() if isinstance(r, dict) and "overlap" in r}
    if overlaps:
        lines += ["", "single decisions back to back   ms/forward one by one   two in flight   speedup"]
    for size, o in overlaps.items():
        lines.append(f"{size:<31} {o['sequential_ms']:21.3f} {o['overlapped_ms']:15.3f} {o['speedup']:8.2f}x")
    cached = {k: r for k, r in model_rows.items() if isinstance(r, dict) and "state_cache" in r}
    if cached:
        lines += ["", "state cache, one question   cache off ms   miss ms (eager, fills)   hit ms (replayed)"]
    for size, r in cached.items():
        c = r["state_cache"]
        lines.append(f"{size:<27} {r['single_ms_median']:12.3f} {c['miss_ms_median']:24.3f} {c['hit_ms_median']:19.3f}")
    lines += attention_lines(phases.get("P2", {}), mm_tflops)
    lines += gemm_lines(phases.get("P1", {}), copy_tbps, mm_tflops)
    lines += difference_lines(phases)
    lines += settings_lines(p0.get("cublas_settings", {}))
    failed = [f"{name}: ERROR {r['error']}" for name, r in phases.items() if isinstance(r.get("error"), str)]
    lines += ["", "phases that failed as a whole (tracebacks in the report):", *failed] if failed else []
    p4 = phases.get("P4", {})
    if "kernels_error" in p4:
        lines += ["", f"kernels launched: ERROR {p4['kernels_error']['error']}"]
    try:
        lines += kernel_lines(p4.get("kernels", {}))
    except Exception as e:  # the listing must not cost the table above
        lines += ["", f"kernels launched: the listing failed: {type(e).__name__}: {e}"]
    return "\n".join(lines)


def interrupted_line(data: dict) -> str:
    """The table's first line, where the run was interrupted: it holds what was measured until then."""
    if "interrupted" not in data:
        return ""
    i = data["interrupted"]
    return f"\nINTERRUPTED by {i['by']} in {i['phase']} after {i['after_s']} s: what was measured until then\n"


def ran(r) -> bool:
    """A part's result holds results: it neither failed nor was skipped (`not_run` says which)."""
    return isinstance(r, dict) and "error" not in r and "skipped" not in r


def attention_lines(p2: dict, mm_tflops: float | None) -> list[str]:
    """P2's cases that did not run, then the time of one prompt attending over itself per case."""
    lines = [f"attention {name}: {not_run(r)}" for name, r in p2.items() if isinstance(r, dict) and not ran(r)]
    lines = ["", *lines] if lines else []
    timed = {k: r["timing"] for k, r in p2.items() if isinstance(r, dict) and "timing" in r}
    if timed:
        lines += ["", "attention, one prompt over itself   tokens        ms   TFLOP/s   (of mm)"]
    for name, t in timed.items():
        if not ran(t):
            lines.append(f"{name:<35} {not_run(t)}")
            continue
        of_mm = f"{t['TFLOPs'] / mm_tflops:.2f}" if mm_tflops else "-"
        lines.append(f"{name:<35} {t['tokens']:6d} {t['ms']:9.3f} {t['TFLOPs']:9.1f}   ({of_mm})")
    return lines


def gemm_lines(p1: dict, copy_tbps: float | None, mm_tflops: float | None) -> list[str]:
    """Each GEMM shape's chosen GEMM against the ceilings (or why it has none), the GEMMs at any row count, the
    `tri` tile configurations that differ, and P1's extra evidence."""
    gemms = p1.get("shapes", {})
    lines = ["", "GEMM n x k      gemm     TB/s @16 rows (of copy)   TFLOP/s @max rows (of mm)"] if gemms else []
    for shape, g in gemms.items():
        if not ran(g):
            lines.append(f"{shape:<15} {not_run(g)}")
            continue
        timed = {int(key.split("@")[1]): t for key, t in g["timings"].items() if key.startswith(g["gemm"] + "@")}
        if not timed:
            continue
        small, large = timed[min(timed)], timed[max(timed)]
        of_copy = f"{small['TBps'] / copy_tbps:.2f}" if copy_tbps else "-"
        of_mm = f"{large['TFLOPs'] / mm_tflops:.2f}" if mm_tflops else "-"
        lines.append(
            f"{shape:<15} {g['gemm']:<6}   {small['TBps']:6.2f} ({of_copy})            {large['TFLOPs']:7.1f} ({of_mm})"
        )
    lines += any_row_count_lines({shape: g for shape, g in gemms.items() if ran(g)})
    unequal = {
        shape: c for shape, c in p1.get("tri_configs", {}).items() if not p1.get("tri_configs_equal", {}).get(shape)
    }
    if unequal:
        lines += ["", "tri tile configurations that do not give the first one's bits:"]
    for shape, configs in unequal.items():
        cells = [f"{name} {v}" for name, v in configs.items() if v != SAME and name != "traceback"]
        lines.append(f"  {shape}: " + "; ".join(cells))
    for key, title in (
        ("lt_library_defaults", "cuBLASLt with the library's defaults (no R7; 4.5B shapes)"),
        ("bias", "GEMMs with a bias (basal-1.0, 4.5B shapes)"),
        ("swiglu_warps", "fused SwiGLU GEMM"),
    ):
        if key in p1 and not ran(p1[key]):
            lines += ["", f"{title}: {not_run(p1[key])}"]
    defaults = p1.get("lt_library_defaults", {})
    if defaults and ran(defaults):
        flat = ", ".join(f"{shape} {'invariant' if d['invariant'] else d['detail']}" for shape, d in defaults.items())
        lines += ["", f"cuBLASLt with the library's defaults (no R7; 4.5B shapes): {flat}"]
    biased = p1.get("bias", {})
    if biased and ran(biased):
        gemms = ", ".join(f"{shape} {b['gemm']}" for shape, b in biased.items())
        lines += ["", f"GEMMs with a bias (basal-1.0, 4.5B shapes): {gemms}"]
    warps = p1.get("swiglu_warps", {})
    if warps and ran(warps):
        columns = [k.removesuffix("_ms") for k in next(iter(warps.values())) if k.endswith("_ms")]
        lines += ["", f"{'fused SwiGLU GEMM, ms at':<27} " + "   ".join(columns) + "   same bits"]
        for size, r in warps.items():
            cells = "   ".join(f"{v:.3f}" for k, v in r.items() if k.endswith("_ms"))
            lines.append(f"{size:<27} {cells}   {r['same_bits']}")
    return lines


def difference_lines(phases: dict) -> list[str]:
    """Each failed bitwise comparison of P2 and P3, with how its values differ."""
    rows = [
        f"{where} {check}: {d['differing']} of {d['of']} values differ, by up to {d['max_abs']:.3g}"
        + (f" ({d['nan']} with a NaN)" if d.get("nan") else "")
        if "differing" in d
        else f"{where} {check}: shapes {d['shapes']}"
        for phase in ("P2", "P3")
        for where, r in phases.get(phase, {}).items()
        if isinstance(r, dict)
        for check, d in r.get("differences", {}).items()
    ]
    return ["", "bitwise checks that failed", *rows] if rows else []


def main() -> int:
    args = parse()
    if args.library_defaults:
        return library_defaults_child(args.cpu_dry_run)
    if args.table is not None:  # a saved report (e.g. bench/results/reports/): the table for bench/README.md
        print(table_text(json.loads(args.table.read_text())))
        return 0
    if args.out is None:
        print("--out DIR is required (or --table JSON to print a saved report's table)", file=sys.stderr)
        return 2
    if args.cpu_dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
        from bench.checks.interpreter_patches import patch_interpreter

        patch_interpreter()
    import torch

    from basal.backends.cuda.gpu.environment import apply_invariant_settings

    device = torch.device("cpu" if args.cpu_dry_run else "cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("no CUDA device: run with --cpu-dry-run on a machine without a GPU", file=sys.stderr)
            return 2
        apply_invariant_settings()
    args.out.mkdir(parents=True, exist_ok=True)
    report = Report(args.out / "gpu_check.json", {"dry_run": args.cpu_dry_run, "argv": sys.argv[1:]})
    current = {"phase": "start", "started": time.perf_counter()}  # what an interruption reports
    deadline = current["started"] + (args.budget_s if not args.cpu_dry_run else 1e9)
    stop = {name: deadline - seconds for name, seconds in LEAVES_S.items()}
    phases = {int(p) for p in args.phases.split(",")}
    sizes = ["toy"] if args.cpu_dry_run else args.sizes.split(",")
    steps = [
        (0, "P0", lambda: phase_env(device, args.cpu_dry_run)),
        (1, "P1", lambda: phase_gemm(device, args.cpu_dry_run, args.out, report, stop["P1"])),
        (2, "P2", lambda: phase_attention(device, args.cpu_dry_run, report, stop["P2"])),
        (3, "P3", lambda: phase_model(device, args.cpu_dry_run, sizes, report, deadline)),
    ]
    previous = signal.signal(signal.SIGTERM, functools.partial(on_sigterm, report, current))
    try:
        with torch.inference_mode():
            return run_phases(steps, phases, report, current)
    except (Interrupted, KeyboardInterrupt) as e:  # the report and the table of what was measured, then 124 / 130
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        by = "SIGTERM" if isinstance(e, Interrupted) else "KeyboardInterrupt"
        mark_interrupted(report, by, current)
        show(summary_phase(report))
        return INTERRUPTED_RC[by]
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def run_phases(steps, phases: set[int], report: Report, current: dict) -> int:
    """The phases asked for, each recorded when it ends (a phase that raises is recorded with its traceback and the
    next one runs), then P4's table. -> the exit code: 1 if a phase raised or a check failed."""
    failed = False
    for number, name, run in steps:
        if number not in phases:
            continue
        started, current["phase"] = time.perf_counter(), name
        try:
            result = run()
        except Exception as e:  # a phase's failure is data: record it, go on with the next phase
            result, failed = failure(e), True
        report.phase(name, result, time.perf_counter() - started)
    if 4 in phases:
        current["phase"] = "P4"
        show(summary_phase(report))
    return 1 if failed or not checks_passed(report.data["phases"]) else 0


def summary_phase(report: Report) -> str:
    """P4: the kernels this process launched, then the table of everything measured, recorded in the report. A
    failure in the listing (or the table) is recorded in their place and costs the other nothing."""
    started = time.perf_counter()
    try:
        kernels = {"kernels": launched_kernels()}
    except Exception as e:
        kernels = {"kernels_error": failure(e)}
    report.data["phases"]["P4"] = kernels
    text = table_text(report.data)
    report.phase("P4", {"table": text, **kernels}, time.perf_counter() - started)
    return text


def table_text(data: dict) -> str:
    """The summary table of a report's data, or why it failed (the report is written either way)."""
    try:
        return interrupted_line(data) + summary(data["phases"])
    except Exception as e:
        return "the summary table failed: " + failure(e)["traceback"]


def show(text: str) -> None:
    """Print a line or the table. A closed stdout (the log's `tee`, stopped by the same SIGTERM) leaves it in the
    report only: stdout then goes to /dev/null, or the exit's flush would fail too and turn the exit code into 120."""
    try:
        print(text, flush=True)
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def checks_passed(phases: dict) -> bool:
    """The run's verdict: every P3 size and checkpoint ran and passed its checks, every attention case ran and was
    bitwise equal, every GEMM shape was probed, and the GEMMs with a bias were probed (basal-1.0 is served
    invariantly). A part skipped for the time budget fails nothing: the table says so."""
    model = [r for r in phases.get("P3", {}).values() if isinstance(r, dict)]
    model_ok = all("error" not in r and all({**r.get("bitwise", {}), **r.get("checks", {})}.values()) for r in model)
    attention = [r for r in phases.get("P2", {}).values() if isinstance(r, dict)]
    attention_ok = all("error" not in r and r.get("bitwise_equal", True) for r in attention)
    p1 = phases.get("P1", {})
    gemm_ok = all("error" not in g for g in p1.get("shapes", {}).values())
    bias_ok = "error" not in p1.get("bias", {})
    return model_ok and attention_ok and gemm_ok and bias_ok


if __name__ == "__main__":
    sys.exit(main())
