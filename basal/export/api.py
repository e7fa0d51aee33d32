"""Determinism you can check across machines: the Python API of `basal export` and `basal compare`.

    from basal.export.api import export_records, compare_files

    export_records("requests.jsonl", "mac-metal-f16.jsonl", model="models/basal-1.5-mini",
                   backend="mlx", device="metal", dtype="f16", batching="single")
    export_records("requests.jsonl", "mac-cpu-f32.jsonl", model="models/basal-1.5-mini",
                   backend="torch", dtype="f32")
    result = compare_files("mac-cpu-f32.jsonl", "mac-metal-f16.jsonl")       # same decisions?
    result = compare_files("a.jsonl", "b.jsonl", bitwise=True)              # same bits?
    result = compare_files("a.jsonl", "b.jsonl", max_logit_diff=1e-4)       # within a tolerance?
    result.ok, result.failures, result.table(), result.to_json()

`export_records(requests, out, model=None, backend="auto", dtype=None, device=None, batching="single",
dialect="basal", prefix_cache=True, overwrite=False, progress=False, backend_options=None, state_cache_mb=0)
-> ExportSummary`
runs every line of `requests` (requests in either dialect, or bench items) and writes the records in the
reference export format (`basal.export.format`) to `out`, its manifest first. `model` is a model
directory or a loaded `ModelDir` (None: the built-in demo model); `backend_options` go to the backend's
``load`` (e.g. ``{"fixed_shapes": False}`` for torch's shape-dependent path). If `out` holds an interrupted run
of the same export, it is finished instead of restarted (`overwrite=True` starts over).

`compare_files(a, b, bitwise=False, max_logit_diff=None, allow_different_models=False) -> Comparison`
(from `basal.export.compare`) matches the records of two exports by id and checks the chosen policy. Both raise
`ExportFileError` (a ValueError) for files that cannot be used, with a message that says what to do.
"""

from __future__ import annotations

import json
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from basal.backends.load import load_backend_class, pick_backend
from basal.core.model.model_dir import ModelDir
from basal.core.request.plan import Dialect
from basal.export.compare import Comparison, compare_files
from basal.export.format import ExportFileError
from basal.export.manifest import build_manifest
from basal.export.run import Batching, Exporter, file_sha256, read_inputs, write_export

__all__ = ["Comparison", "ExportFileError", "ExportSummary", "compare_files", "device_name", "export_records"]


@dataclass(frozen=True)
class ExportSummary:
    out: Path
    records: int  # records in the file now
    resumed_from: int  # records that were already there (an interrupted run finished)
    manifest: dict[str, Any]


def cpu_name() -> str:
    if platform.system() == "Darwin":
        try:
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(backend: Any) -> str:
    """The name of the chip a backend runs on: the GPU's name, or the CPU's."""
    if backend.name == "torch" and backend.device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(backend.device))
    if backend.name == "mlx" and backend.device == "metal":
        import mlx.core as mx

        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        return str(info.get("device_name", "Apple GPU"))
    return cpu_name()


def export_records(
    requests: str | Path,
    out: str | Path,
    model: str | Path | ModelDir | None = None,
    backend: str = "auto",
    dtype: str | None = None,
    device: str | None = None,
    batching: Batching = "single",
    dialect: Dialect = "basal",
    prefix_cache: bool = True,
    overwrite: bool = False,
    state_cache_mb: float = 0,
    progress: bool = False,
    backend_options: dict[str, Any] | None = None,
) -> ExportSummary:
    from basal.core.model.synth import demo_model

    requests, out = Path(requests), Path(out)
    inputs = read_inputs(requests, dialect)  # every line checked before the model loads
    if not isinstance(model, ModelDir):
        model = ModelDir.load(model) if model is not None else demo_model()
    cls = load_backend_class(pick_backend(backend))
    if cls is None:
        raise ValueError(f"the {backend} backend is not available in this build of basal")
    loaded = cls.load(model, dtype=dtype, device=device, **(backend_options or {}))
    described: dict[str, Any] = {"name": loaded.name, "device": loaded.device, "dtype": loaded.dtype}
    if not prefix_cache:
        described["prefix_cache"] = False
    if state_cache_mb:
        described["state_cache_mb"] = state_cache_mb
    if backend_options:
        described["options"] = dict(sorted(backend_options.items()))
    skip = ("backend", "device", "dtype")  # threads, GEMM chunks, ...: what `basal compare` shows when bits differ
    described["compute"] = {k: v for k, v in loaded.describe().items() if k not in skip}
    inputs_section = {"path": requests.name, "sha256": file_sha256(requests), "count": len(inputs)}
    manifest = build_manifest(model, described, batching, inputs_section, device_name(loaded))
    exporter = Exporter(model, loaded, batching, prefix_cache=prefix_cache, state_cache_mb=state_cache_mb)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(inputs), unit="request", desc=f"export {loaded.name}-{loaded.device}-{loaded.dtype}")
    try:

        def on_record(n: int) -> None:
            if bar is not None:
                bar.n = n
                bar.refresh()

        done, written = write_export(exporter, inputs, out, manifest, overwrite, on_record)
    finally:
        if bar is not None:
            bar.close()
    with open(out, encoding="utf-8") as f:  # a resumed export keeps the manifest (and date) of its first run
        written_manifest = json.loads(f.readline())["manifest"]
    return ExportSummary(out, done + written, done, written_manifest)
