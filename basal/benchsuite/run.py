"""`basal bench`: run the named suites on one model (a given directory, or a preset synthesized for the run) and
write each suite's results with the context they were measured in (machine load before and after, GEMM limit)."""

from __future__ import annotations

import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from basal.benchsuite import machine_load
from basal.benchsuite.report import write
from basal.benchsuite.suites import SUITES, Bench, model_shape
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.progress import Progress


def suite_names(requested: Sequence[str]) -> list[str]:
    """The suites to run (all where none are named); an unknown name is refused before anything loads."""
    names = list(requested) or list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)}")
    return names


def _synthesized(folder: Path, preset: str, layers: int, quiet: bool) -> ModelDir:
    print(f"synthesizing {preset} cut to {layers} layer(s) for the benchmark", file=sys.stderr)
    disable = True if quiet else None  # None: tqdm's own choice, a bar on a terminal only
    with tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc="weights", disable=disable) as bar:

        def on_total(n: int) -> None:  # the bar learns the size once the weights are planned
            bar.total = n
            bar.refresh()

        written = synth_model(folder / "model", preset, layers=layers, on_bytes=bar.update, on_total=on_total)
    return ModelDir.load(written)


def run_suites(
    names: Sequence[str],
    model: ModelDir | None,
    preset: str,
    layers: int,
    backend: str,
    dtype: str | None,
    *,
    full: bool,
    transformers: bool,
    out: Path,
    plot: bool,
    quiet: bool,
) -> None:
    """Run `names` (see `suite_names`) on `model`, or on `preset` cut to `layers` layers where `model` is None,
    printing each suite's markdown table and writing its files under `out`."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        if model is None:
            model = _synthesized(Path(tmp), preset, layers, quiet)
        print(f"loading {model.name} on the {backend} backend and measuring the GEMM limit", file=sys.stderr)
        bench = Bench(model, backend, dtype, quick=not full, transformers=transformers)
        if bench.limit:
            rates = ", ".join(f"{k} {v:.0f}" for k, v in bench.limit.gflops.items())
            print(
                f"GEMM limit of this machine for the model's shapes: {bench.limit.combined_gflops:.0f} GFLOP/s "
                f"({bench.limit.rows}-row F.linear: {rates})",
                file=sys.stderr,
            )
        hf_device, hf_dtype = bench.baseline_placement
        context = {
            "model": model_shape(model),
            "backend": bench.backend.name,
            "device": bench.backend.device,
            "dtype": bench.backend.dtype,
            "quick": not full,
            "gemm_limit": bench.limit.as_dict() if bench.limit else None,
            "transformers_baseline": {"device": hf_device, "dtype": hf_dtype} if bench.transformers else None,
            # threads, GEMM chunks, compiled CPU kernels: how the numbers were computed (torch backend)
            "compute": bench.backend.describe(),
        }
        for i, name in enumerate(names):
            before = machine_load.measure()
            with Progress(f"bench {name} ({i + 1}/{len(names)} suites)", min_interval_s=10, enabled=not quiet) as p:
                if warning := before.warning():
                    p.write(f"warning before {name}: {warning}")
                bench.progress = p
                result = SUITES[name](bench)
            after = machine_load.measure()
            load = {"before": before.to_json(), "after": after.to_json()}
            files = write(result, out, context, plot, load)
            print(result.markdown(), flush=True)
            print("wrote " + ", ".join(str(f) for f in files), flush=True)
