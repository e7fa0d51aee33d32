"""Run on a Mac with Apple Silicon: proves the MLX backend's Metal path is batch-invariant on real hardware,
agrees with the torch CPU reference, and prints its speed.

    python -m bench.mac_check                       # mini shapes (synthesized, 3 GB), Metal, f16 and f32
    python -m bench.mac_check --layers 8            # quicker
    python -m bench.mac_check --model DIR           # a real Basal model directory
    python -m bench.mac_check --device cpu --preset demo   # the same script on any machine (smoke test)

Nobody on the project has a Mac: the Metal kernels have not been run by us. Please send the printed report.
Reference points (basal-contract.md §5.9, M2 Max, single decision): mini 80 ms with basal-rs, 130 ms with plain
MLX f16 (upstream).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from basal.backends.cuda.backend import TorchBackend
from basal.backends.mlx.backend import MLXBackend
from basal.core.compute import run_to_end
from basal.core.decision import distribution
from basal.core.model_dir import ModelDir
from basal.core.pipeline import Pipeline
from basal.core.prompt import option_orders
from basal.core.synth import synth_model
from basal.doctor import _questions


def bits(logits) -> list[bytes]:
    return [np.asarray(o, dtype=np.float32).tobytes() for q in logits for o in q]


def invariance(model: ModelDir, device: str, dtype: str) -> list[str]:
    backend = MLXBackend.load(model, dtype=dtype, device=device)
    cached, plain = Pipeline(model, backend), Pipeline(model, backend, prefix_cache=False)
    qs = _questions(model, 8)
    together = run_to_end(cached.letter_logits(qs))
    checks = {
        "alone = batched": bits([run_to_end(cached.letter_logits([q]))[0] for q in qs]) == bits(together),
        "reversed batch order": bits(run_to_end(cached.letter_logits(qs[::-1]))[::-1]) == bits(together),
        "prefix cache off": bits(run_to_end(plain.letter_logits(qs))) == bits(together),
        "repeated run": bits(run_to_end(cached.letter_logits(qs))) == bits(together),
    }
    return [f"  {dtype:<4} {name:<22} {'ok' if ok else 'DIFFERENT'}" for name, ok in checks.items()]


def agreement(model: ModelDir, device: str) -> str:
    qs = _questions(model, 4)
    ours = run_to_end(Pipeline(model, MLXBackend.load(model, dtype="f32", device=device)).letter_logits(qs))
    ref = run_to_end(Pipeline(model, TorchBackend.load(model, dtype="f32", device="cpu")).letter_logits(qs))
    diff = max(
        float(np.abs(a - b).max()) for qa, qb in zip(ours, ref, strict=True) for a, b in zip(qa, qb, strict=True)
    )
    same = all(
        distribution(a, option_orders(len(a[0])), 1.0).argmax == distribution(b, option_orders(len(b[0])), 1.0).argmax
        for a, b in zip(ours, ref, strict=True)
    )
    return f"  f32 MLX vs torch CPU: max |Δ logit| {diff:.2e} (bound 1e-4), same decisions: {same}"


def speed(model: ModelDir, device: str, dtype: str, runs: int) -> str:
    pipeline = Pipeline(model, MLXBackend.load(model, dtype=dtype, device=device))
    qs = _questions(model, 16)
    for q in qs[:3]:
        run_to_end(pipeline.letter_logits([q]))
    single = []
    for i in range(runs):
        t = time.perf_counter()
        run_to_end(pipeline.letter_logits([qs[i % len(qs)]]))
        single.append(time.perf_counter() - t)
    t = time.perf_counter()
    run_to_end(pipeline.letter_logits(qs))
    batch_s = time.perf_counter() - t
    return (
        f"  {dtype}: single decision median {statistics.median(single) * 1000:.1f} ms "
        f"(p90 {sorted(single)[int(0.9 * (len(single) - 1))] * 1000:.1f} ms); "
        f"16 questions in one batch: {len(qs) / batch_s:.1f} decisions/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--device", default="metal", choices=["metal", "cpu"])
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    if a.device not in MLXBackend.devices():
        raise SystemExit(f"MLX device {a.device} is not available here (devices: {', '.join(MLXBackend.devices())})")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(a.model) if a.model else synth_model(Path(tmp) / "m", a.preset, layers=a.layers)
        model = ModelDir.load(path)
        print(
            f"basal mac check: {platform.platform()} {platform.machine()}, model {model.name} "
            f"({model.config.num_hidden_layers} layers), MLX device {a.device}"
        )
        print("bitwise invariance:")
        for dtype in ("f16", "f32", "bf16"):
            for line in invariance(model, a.device, dtype):
                print(line)
        print("agreement:")
        print(agreement(model, a.device))
        print("speed:")
        for dtype in ("f16", "f32"):
            print(speed(model, a.device, dtype, a.runs))


if __name__ == "__main__":
    main()
