"""The one command a Mac user runs and sends back: proves the MLX backend's Metal path on real hardware, times it
against plain MLX, and exits non-zero if any check fails.

    python -m bench.checks.mac_check                        # mini shapes (synthesized, ~3 GB), Metal, f16 / bf16 / f32
    python -m bench.checks.mac_check --preset 4.5B          # basal-1.5-4.5B shapes (~9 GB in f16)
    python -m bench.checks.mac_check --layers 8             # quicker
    python -m bench.checks.mac_check --model DIR            # a real Basal model directory
    python -m bench.checks.mac_check --bias                 # the basal-1.0 layout (attention and MLP biases)
    python -m bench.checks.mac_check --device cpu --preset demo --dtypes f32 --quick   # any machine (the CI smoke test)

Checks (each isolated: one failing does not stop the others): bitwise invariance per dtype — alone vs batched at
any position, reversed batch, prefix cache off, repeated runs, questions on the same state (a tree), block edges
around the 64-token tiles, a long prompt, a pass paused at every layer while other batches run; Metal-native ops
row-invariant at many row counts; a negative control (chunking off must change bits, or the checks prove
nothing); f32 agreement with the torch CPU reference (max |Δ logit| <= 1e-4, enforced) and 16-bit decisions; f32
matmuls at full precision (MLX_ENABLE_TF32). Speed: a single decision and a 16-question batch with basal, plain MLX
(bench/checks/plain_mlx.py, the mlx-lm way) and mlx-lm itself where installed, on the same prompts. Per dtype, a
`basal export` of a request file (--requests) compared with a torch CPU f32 export (`basal compare`). `basal serve`
itself over HTTP (bench/checks/serve_check.py): it must pick MLX on Metal by itself, answer both dialects, give the same
answers twice and in a batch of concurrent requests, and shut down gracefully (--no-serve skips it). Writes a JSON
report (--json) and the exports (--exports), and prints a table.

Nobody on the project has a Mac: none of this has run on Apple hardware yet. Please send the JSON report and
the exports directory.
Reference points (docs/benchmarks.md §4, M2 Max, single mini decision): 80 ms basal-rs, 130 ms plain MLX f16.
"""

from __future__ import annotations

import os

os.environ.setdefault("MLX_ENABLE_TF32", "0")  # before MLX's first matmul: read once per process (precision.py)

import argparse
import gc
import importlib.metadata
import json
import math
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np

from basal.backends.cuda.cpu import cpu_kernels
from basal.backends.mlx import native
from basal.backends.mlx import ops as O
from basal.backends.mlx.backend import MLXBackend
from basal.backends.mlx.precision import TF32_ERROR, f32_matmul_error
from basal.core.decision.distribution import distribution
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from basal.core.model.prompt import option_orders, render_prompt
from basal.core.model.synth import synth_model
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import TokenizedQuestion, split_forwards
from bench.checks.serve_check import serve_checks, serve_lines

DEFAULT_REQUESTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "export_requests.jsonl"
AGREEMENT_BOUND = 1e-4  # f32 letter logits vs the torch CPU reference (tests/determinism/test_cross_backend.py)
NEAR_TIE = 0.02
WORDS = "order customer package arrived damaged refund invoice deadline payment late box item".split()


@dataclass
class Check:
    name: str
    ok: bool | None  # None: measured, not judged
    detail: str
    seconds: float = 0.0
    error: str | None = None


@dataclass
class Report:
    environment: dict
    checks: list[Check] = field(default_factory=list)
    speed: list[dict] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    def run(self, name: str, fn: Callable[[], tuple[bool | None, str]]) -> None:
        """Run one check in isolation: an exception fails this check only."""
        t = time.perf_counter()
        try:
            ok, detail = fn()
            check = Check(name, ok, detail)
        except Exception as e:  # reported, never hidden: the traceback goes into the JSON report
            check = Check(name, False, f"error: {type(e).__name__}: {e}", error=traceback.format_exc())
        check.seconds = round(time.perf_counter() - t, 3)
        self.checks.append(check)
        mark = {True: "ok", False: "FAIL", None: "--"}[check.ok]
        print(f"  {mark:<4} {name:<40} {check.detail}", flush=True)


def environment(device: str, model: ModelDir) -> dict:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    env = {
        "platform": platform.platform(),
        "macos": platform.mac_ver()[0] or None,
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "packages": {p: version(p) for p in ("mlx", "mlx-metal", "mlx-cpu", "mlx-lm", "torch", "numpy")},
        "MLX_ENABLE_TF32": os.environ.get("MLX_ENABLE_TF32"),
        "device": device,
        "model": {"name": model.name, "layers": model.config.num_hidden_layers, "hidden": model.config.hidden_size},
        # the torch CPU reference runs the compiled kernels where clang builds them (never tried on macOS yet)
        "torch_cpu_kernels": cpu_kernels.status(),
    }
    if mx.metal.is_available():
        try:
            info = mx.metal.device_info()
            env["gpu"] = {k: v if isinstance(v, int | float | str) else str(v) for k, v in info.items()}
        except Exception as e:  # the report still goes out without it
            env["gpu"] = {"error": str(e)}
    return env


class Questions:
    """Seeded questions on random or given states, tokenized for `model`."""

    def __init__(self, model: ModelDir, seed: int = 0):
        self.tok, self.rng = model.tokenizer, random.Random(seed)

    def make(self, n: int, state: str | None = None, state_words: tuple[int, int] = (1, 60)) -> list:
        out = []
        for _ in range(n):
            st = state or " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(*state_words)))
            k = self.rng.randint(2, 10)
            opts = [" ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(1, 4))) for _ in range(k)]
            question = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(1, 8))) + "?"
            prompts = tuple(
                tuple(self.tok.encode(render_prompt(st, question, [opts[i] for i in p], "en")))
                for p in option_orders(k)
            )
            out.append(TokenizedQuestion("en", st, prompts))
        return out


def bits(logits) -> list[bytes]:
    return [np.ascontiguousarray(o, dtype=np.float32).view(np.uint32).tobytes() for q in logits for o in q]


class Subject:
    """One backend (dtype, fixed shapes or not) with cached and uncached pipelines."""

    def __init__(self, model: ModelDir, device: str, dtype: str, fixed_shapes: bool = True):
        self.backend = MLXBackend.load(model, dtype=dtype, device=device, fixed_shapes=fixed_shapes)
        self.cached = Pipeline(model, self.backend)
        self.plain = Pipeline(model, self.backend, prefix_cache=False)

    def logits(self, qs, cache: bool = True):
        return run_to_end((self.cached if cache else self.plain).letter_logits(qs))

    def alone(self, qs):
        return [self.logits([q])[0] for q in qs]


def alone_vs_batched(s: Subject, qs: Questions, n: int) -> bool:
    """The anchor question alone and at the front, middle and back of batches of several sizes."""
    anchor = qs.make(1)[0]
    reference = bits([s.logits([anchor])[0]])
    for others in (1, 3, n):
        mates = qs.make(others)
        for at in {0, others // 2, others}:
            if bits([s.logits([*mates[:at], anchor, *mates[at:]])[at]]) != reference:
                return False
    return True


def paused_pass(s: Subject, qs: Questions) -> bool:
    """A pass paused at every layer while other batches run gives the same bits (the long lane)."""
    questions, interlopers = qs.make(4), qs.make(3)
    reference = s.logits(questions)
    (forward,) = split_forwards(questions, s.cached.letter_ids, s.cached.prefixes)
    steps, result = s.backend.run(forward.packed), None
    while result is None:
        try:
            next(steps)
        except StopIteration as done:
            result = done.value
        else:
            s.logits(interlopers)
    return all(
        bits([[result[row][: len(reference[qi][order])]]]) == bits([[reference[qi][order]]])
        for (qi, order), row in forward.readout_of.items()
    )


def invariance_checks(report: Report, model: ModelDir, device: str, dtype: str, a) -> Subject:
    s = Subject(model, device, dtype)
    qs = Questions(model, seed=1)
    n = 4 if a.quick else 12

    def same(x, y) -> tuple[bool, str]:
        ok = bits(x) == bits(y)
        return ok, "same bits" if ok else "DIFFERENT bits"

    report.run(
        f"{dtype} alone = batched (any position)", lambda: (alone_vs_batched(s, qs, n), f"up to {n + 1} questions")
    )
    group = qs.make(n)
    together = s.logits(group)
    report.run(f"{dtype} reversed batch", lambda: same(s.logits(group[::-1])[::-1], together))
    report.run(f"{dtype} prefix cache off", lambda: same(s.logits(group, cache=False), together))
    report.run(f"{dtype} repeated run", lambda: same(s.logits(group), together))
    first = qs.make(1, state_words=(40, 40))[0]
    siblings = [first, *qs.make(3 if a.quick else 6, state=first.state)]
    report.run(f"{dtype} tree (same state)", lambda: same(s.logits(siblings), s.alone(siblings)))
    edges = [qs.make(1, state_words=(w, w))[0] for w in ((14, 17, 31) if a.quick else (14, 15, 16, 17, 30, 31, 33, 60))]
    report.run(f"{dtype} block edges around tiles", lambda: same(s.logits(edges), s.alone(edges)))
    long_q = qs.make(2, state_words=(a.long_words, a.long_words))
    report.run(
        f"{dtype} long prompt",
        lambda: (*same(s.logits(long_q), s.alone(long_q))[:1], f"{len(long_q[0].prompts[0])} tokens"),
    )
    report.run(f"{dtype} paused between layers", lambda: (paused_pass(s, qs), "interleaved with 3 questions"))
    report.run(f"{dtype} native ops row-invariant", lambda: native_ops_invariant(device, dtype))
    return s


def native_ops_invariant(device: str, dtype: str) -> tuple[bool | None, str]:
    """The Metal-native ops give one row the same bits at every row count and position (native.py's claim)."""
    dt = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}[dtype]
    rng = np.random.default_rng(0)
    x = mx.array(rng.standard_normal((300, 512)).astype(np.float32) * 3).astype(dt)
    w = mx.array(rng.random(512).astype(np.float32)).astype(dt)
    wt = mx.array(rng.standard_normal((512, 384)).astype(np.float32) * 0.05).astype(dt)
    ops = {
        "rms_norm": lambda r: native.rms_norm(r, w, 1e-5),
        "swiglu": native.swiglu,
        "linear (64-row chunks)": lambda r: O.linear(r, wt, None, O.ROWS),
    }
    varying = []
    for name, fn in ops.items():
        seen = set()
        for m in (1, 2, 7, 16, 17, 63, 64, 65, 200, 299):
            for at in {0, m // 2, m - 1}:
                rows = mx.concatenate([x[1 : at + 1], x[:1], x[at + 1 : m]])
                out = fn(rows)[at]
                mx.eval(out)
                seen.add(np.array(out.astype(mx.float32)).tobytes())
        if len(seen) > 1:
            varying.append(name)
    ok = not varying
    detail = "one result per row for " + ", ".join(ops) if ok else "varies with the row count: " + ", ".join(varying)
    if device != "metal":
        return None, detail + " (a Metal claim; measured on the CPU for information)"
    return ok, detail


def negative_control(model: ModelDir, device: str, dtype: str) -> tuple[bool, str]:
    """Whole-array matmuls and library elementwise ops: the same comparisons must now see a difference."""
    s = Subject(model, device, dtype, fixed_shapes=False)
    qs = Questions(model, seed=2)
    differences = sum(not alone_vs_batched(s, qs, 12) for _ in range(3))
    ok = differences > 0
    return ok, f"chunking off: {differences}/3 rounds differ" + ("" if ok else " — the checks CANNOT FAIL")


def agreement_questions(model: ModelDir) -> list:
    return Questions(model, seed=3).make(6)


def decision_questions(model: ModelDir) -> list:
    return Questions(model, seed=4).make(8)


def agreement(model: ModelDir, ours) -> tuple[bool, str]:
    """f32 MLX logits (of `agreement_questions`) vs the torch CPU f32 reference."""
    from basal.backends.cuda.backend import TorchBackend

    qs = agreement_questions(model)
    ref = run_to_end(Pipeline(model, TorchBackend.load(model, dtype="f32", device="cpu")).letter_logits(qs))
    diff = max(
        float(np.abs(a - b).max()) for qa, qb in zip(ours, ref, strict=True) for a, b in zip(qa, qb, strict=True)
    )
    same = decisions(ours) == decisions(ref)
    return (
        diff <= AGREEMENT_BOUND and same,
        f"max |Δ logit| {diff:.2e} (bound {AGREEMENT_BOUND:g}), same decisions: {same}",
    )


def decisions(logits) -> list[int]:
    return [distribution(q, option_orders(len(q[0])), 1.4).argmax for q in logits]


def decisions_16_bit(low, f32) -> tuple[bool, str]:
    """The 16-bit decisions (of `decision_questions`) equal f32's wherever f32 is not a near tie."""

    def margin(q) -> float:
        top2 = np.sort(distribution(q, option_orders(len(q[0])), 1.4).p_cal)[-2:]
        return float(top2[1] - top2[0])

    clear = [i for i, q in enumerate(f32) if margin(q) > NEAR_TIE]
    same = all(decisions([low[i]]) == decisions([f32[i]]) for i in clear)
    return same, f"{len(clear)}/{len(f32)} questions not near a tie, same decisions: {same}"


def export_and_compare(
    model: ModelDir, device: str, dtype: str, requests: Path, exports: Path
) -> tuple[bool | None, str]:
    """`basal export` of the request file with this backend and dtype, and `basal compare` with a CPU f32 export of
    the same requests (written once per model): f32 must agree within the bound; 16-bit is reported (near ties
    may flip there; the enforced 16-bit decision check is `decisions_16_bit`)."""
    from basal.export.api import export_records
    from basal.export.compare import compare_files

    exports.mkdir(parents=True, exist_ok=True)
    reference = exports / f"{model.name}-torch-cpu-f32.jsonl"
    if not reference.exists():
        export_records(requests, reference, model, "torch", "f32", device="cpu", batching="single", overwrite=True)
    ours = exports / f"{model.name}-mlx-{device}-{dtype}.jsonl"
    export_records(requests, ours, model, "mlx", dtype, device=device, batching="tree", overwrite=True)
    c = compare_files(reference, ours, max_logit_diff=AGREEMENT_BOUND if dtype == "f32" else None)
    detail = f"{ours.name}: {c.policy} policy, max |Δ logit| {c.max_abs_diff:.2e}, {len(c.flips)} decisions differ"
    return (c.ok if dtype == "f32" else None), detail


def precision_check(device: str) -> tuple[bool, str]:
    err = f32_matmul_error(mx.gpu if device == "metal" else mx.cpu)
    return err <= TF32_ERROR, f"f32 matmul relative error {err:.1e} (TF32 would be ~7e-4)"


def speed(model: ModelDir, device: str, dtype: str, subject: Subject, runs: int) -> dict:
    """Single decisions (median, p90) and a 16-question batch: basal, plain MLX, mlx-lm where installed."""
    from bench.checks.plain_mlx import PlainLlama

    qs = Questions(model, seed=5).make(16)
    letters = subject.cached.letter_ids

    def timed(fn, q) -> float:
        t = time.perf_counter()
        fn(q)
        return time.perf_counter() - t

    def summary(fn) -> dict:
        for q in qs[:2]:
            fn(q)
        single = sorted(timed(fn, qs[i % len(qs)]) for i in range(runs))
        batch = sum(timed(fn, q) for q in qs) if fn is not basal_one else timed(lambda _: subject.logits(qs), None)
        return {
            "single_ms_median": round(statistics.median(single) * 1000, 2),
            "single_ms_p90": round(single[max(0, math.ceil(0.9 * len(single)) - 1)] * 1000, 2),
            "batch16_decisions_per_s": round(len(qs) / batch, 2),
        }

    def basal_one(q):
        return subject.logits([q])

    rows = {"basal": summary(basal_one)}
    plain = PlainLlama(model, dtype)
    rows["plain MLX"] = summary(lambda q: [plain.letter_logits(p, letters) for p in q.prompts])
    try:
        import mlx_lm

        lm, _ = mlx_lm.load(str(model.path))
        ids = mx.array(list(letters))

        def mlx_lm_one(q):
            for p in q.prompts:
                mx.eval(lm(mx.array([list(p)]))[0, -1, ids])

        rows["mlx-lm"] = summary(mlx_lm_one)
    except ImportError:
        pass
    except Exception as e:  # mlx-lm present but could not load this directory: said, not hidden
        rows["mlx-lm"] = {"error": f"{type(e).__name__}: {e}"}
    base = rows["plain MLX"]["single_ms_median"]
    for name, row in rows.items():
        if "single_ms_median" in row:
            row["vs_plain_mlx"] = round(base / row["single_ms_median"], 2)
            print(
                f"  {dtype:<4} {name:<10} single {row['single_ms_median']:>8.1f} ms (p90 {row['single_ms_p90']:.1f}), "
                f"batch of 16: {row['batch16_decisions_per_s']:.1f}/s, {row['vs_plain_mlx']:.2f}x plain MLX"
            )
    return {"dtype": dtype, "rows": rows}


@dataclass
class DtypeResult:
    """What a dtype's pass leaves for the checks across dtypes, once its backend is released."""

    agreement_logits: list
    decision_logits: list


def dtype_pass(report: Report, model: ModelDir, a, dtype: str) -> DtypeResult:
    """Everything one dtype needs its backend for; the backend is dropped afterwards (a mini f32 copy is 6 GB).
    The export for `basal compare` loads its own backend (as `basal export` does)."""
    subject = invariance_checks(report, model, a.device, dtype, a)
    result = DtypeResult(subject.logits(agreement_questions(model)), subject.logits(decision_questions(model)))
    if a.requests:
        report.run(
            f"{dtype} export vs CPU f32 export",
            lambda: export_and_compare(model, a.device, dtype, Path(a.requests), Path(a.exports)),
        )
    if dtype != "f32" or a.dtypes == "f32":
        print(f"speed ({dtype}):")
        report.speed.append(speed(model, a.device, dtype, subject, a.runs))
    return result


def release() -> None:
    gc.collect()
    mx.clear_cache()


def serve_over_http(quick: bool) -> tuple[bool | None, str]:
    """`basal serve --backend auto` on a synthetic checkpoint (the demo's with --quick, else mini cut to 2 layers):
    on a Mac with Metal it must serve MLX on Metal, elsewhere the CPU."""
    expect = "metal" if "metal" in MLXBackend.devices() else "cpu"
    result = serve_checks(expect, demo=quick)
    if "checks" not in result:  # its packages are missing (skipped), or the server did not start (error)
        return (None, result["skipped"]) if "skipped" in result else (False, result["error"])
    return all(result["checks"].values()), serve_lines(result)[-1].removeprefix("basal serve over HTTP ")


def check_model(report: Report, model: ModelDir, a) -> None:
    report.run("f32 matmuls at full precision", lambda: precision_check(a.device))
    results: dict[str, DtypeResult] = {}
    for dtype in [d for d in a.dtypes.split(",") if d]:
        try:
            results[dtype] = dtype_pass(report, model, a, dtype)
        except Exception as e:  # this dtype's remaining checks are lost; the others still run
            report.checks.append(Check(f"{dtype} pass", False, f"error: {e}", error=traceback.format_exc()))
            print(f"  FAIL {dtype} pass: {e}")
        release()
    control = "f16" if a.device == "metal" and "f16" in a.dtypes else a.dtypes.split(",")[0]
    report.run(f"negative control ({control})", lambda: negative_control(model, a.device, control))
    release()
    if "f32" in results:
        f32 = results["f32"]
        report.run("f32 agreement with torch CPU", lambda: agreement(model, f32.agreement_logits))
        for dtype, r in results.items():
            if dtype != "f32":
                report.run(
                    f"{dtype} decisions vs f32", lambda r=r: decisions_16_bit(r.decision_logits, f32.decision_logits)
                )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a Basal model directory (default: synthesize --preset)")
    ap.add_argument("--preset", default="mini", help="mini, 4.5B, ... or several: mini,4.5B")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--bias", action="store_true", help="synthesize the basal-1.0 layout (attention and MLP biases)")
    ap.add_argument("--device", default="metal", choices=["metal", "cpu"])
    ap.add_argument("--dtypes", default="f16,bf16,f32")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--long-words", type=int, default=1500, help="state length of the long-prompt check")
    ap.add_argument("--quick", action="store_true", help="fewer questions per check")
    ap.add_argument("--json", default="mac_check.json", help="where to write the report")
    ap.add_argument(
        "--requests",
        default=str(DEFAULT_REQUESTS) if DEFAULT_REQUESTS.exists() else "",
        help="request file for the exports ('' for none)",
    )
    ap.add_argument("--exports", default="mac_check_exports", help="where the exports go (send them with the report)")
    ap.add_argument("--no-serve", dest="serve", action="store_false", help="skip `basal serve` over HTTP")
    a = ap.parse_args(argv)
    if a.device not in MLXBackend.devices():
        print(f"MLX device {a.device} is not available here (devices: {', '.join(MLXBackend.devices())})")
        return 2
    reports = []
    with tempfile.TemporaryDirectory() as tmp:
        sources = [Path(a.model)] if a.model else [None] * len(a.preset.split(","))
        for i, source in enumerate(sources):
            preset = a.preset.split(",")[i]
            path = source or synth_model(Path(tmp) / preset, preset, layers=a.layers, bias=a.bias)
            model = ModelDir.load(path)
            report = Report(environment(a.device, model))
            env = report.environment
            print(
                f"basal mac check: {env['platform']}, MLX {env['packages']['mlx']}, device {a.device}, "
                f"model {model.name} ({model.config.num_hidden_layers} layers)"
            )
            with mx.stream(mx.gpu if a.device == "metal" else mx.cpu):  # the script's own ops (plain MLX, op checks)
                check_model(report, model, a)
            reports.append(report)
            if source is None:
                shutil.rmtree(path, ignore_errors=True)  # several GB each
    if a.serve:  # once per run: it serves a checkpoint of its own, whatever the presets
        reports[-1].run("basal serve over HTTP", lambda: serve_over_http(a.quick))
    Path(a.json).write_text(
        json.dumps([asdict(r) for r in reports] if len(reports) > 1 else asdict(reports[0]), indent=2)
    )
    failed = [c for r in reports for c in r.failed]
    judged = [c for r in reports for c in r.checks if c.ok is not None]
    verdict = "FAILED: " + ", ".join(c.name for c in failed) if failed else "all checks passed"
    print(f"{len(judged) - len(failed)}/{len(judged)} checks passed — {verdict}; report: {a.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
