"""MLX vs torch backend on the same weights and requests (CPU here; information only: mlx-cpu uses a
reference BLAS on Linux, so this ratio says nothing about Apple Silicon — see bench/checks/mac_check.py there).

    python -m bench.compare.backend_compare                  # demo model and mini shapes cut to 1 layer, f32
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from basal.backends.cuda.backend import TorchBackend
from basal.backends.mlx.backend import MLXBackend
from basal.benchsuite.workloads import questions, state_of_tokens
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_systemone

MIX = [("1 question, short state", 1, 40), ("5 questions, ~500-token state", 5, 500)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, preset, layers in (("demo", "demo", None), ("mini, 1 layer", "mini", 1)):
            model = ModelDir.load(synth_model(Path(tmp) / preset, preset, layers=layers))
            pipelines = {
                "torch": Pipeline(model, TorchBackend.load(model, dtype="f32")),
                "mlx": Pipeline(model, MLXBackend.load(model, dtype="f32", device="cpu")),
            }
            for label, n_q, tokens in MIX:
                body = {
                    "model": "m",
                    "state": state_of_tokens(model.tokenizer, tokens, "pl", 0),
                    "questions": questions(n_q, "pl", 0),
                }
                request = parse_systemone(body, lambda m: m)
                rate = {}
                for backend, pipeline in pipelines.items():
                    pipeline.decide(request)
                    t = time.perf_counter()
                    for _ in range(a.reps):
                        pipeline.decide(request)
                    rate[backend] = n_q * a.reps / (time.perf_counter() - t)
                rows.append((name, label, rate["torch"], rate["mlx"]))
                print(rows[-1], flush=True)
    print("\n| model | request | torch-cpu dec/s | mlx-cpu dec/s | mlx / torch |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, label, t, m in rows:
        print(f"| {name} | {label} | {t:.2f} | {m:.2f} | {m / t:.2f}× |")


if __name__ == "__main__":
    main()
