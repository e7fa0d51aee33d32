"""The CUDA settings the invariant path needs (docs/gpu-path.md R7), applied before CUDA initialises its libraries."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

CUBLAS_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "1"}  # KiB: no room for split-K


# the reads back of R7 and the value each must have; a torch without one of these names reads "unknown"
SETTINGS_WANTED = {
    "allow_tf32": False,
    "allow_fp16_reduced_precision_reduction": False,
    "allow_fp16_reduced_precision_reduction_split_k": False,
    "allow_bf16_reduced_precision_reduction": False,
    "allow_bf16_reduced_precision_reduction_split_k": False,
    "allow_fp16_accumulation": False,
}


def disallow_reduced_reductions() -> None:
    """No reduced-precision reductions and no split-K in cuBLAS(Lt)'s 16-bit GEMMs: the pair form of torch >= 2.10
    (allow_reduced_precision, allow_splitk). A plain False there means (False, True): split-K stays allowed."""
    import torch

    matmul = torch.backends.cuda.matmul
    for name in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"):
        try:
            setattr(matmul, name, (False, False))
        except Exception:  # an older torch refuses the pair; the GEMM probe then has the last word
            setattr(matmul, name, False)
    with contextlib.suppress(AttributeError, RuntimeError):  # torch >= 2.7: else 16-bit GEMMs may accumulate in f16
        matmul.allow_fp16_accumulation = False


def invariant_settings() -> dict[str, object]:
    """R7 as torch reads it back now: name -> value ("unknown" where this torch has no such setting)."""
    import torch

    out: dict[str, object] = {}
    for name in SETTINGS_WANTED:
        try:
            out[name] = bool(getattr(torch.backends.cuda.matmul, name))
        except (AttributeError, RuntimeError):
            out[name] = "unknown"
    out.update({k: os.environ.get(k) for k in CUBLAS_ENV})
    return out


def apply_invariant_settings() -> dict[str, object]:
    """Small fixed cuBLAS workspaces, cuBLASLt, no reduced-precision or split-K reductions, no TF32. -> the settings
    read back; one that did not take is logged (the GEMM probe still rules out any GEMM that is not invariant,
    so serving goes on)."""
    os.environ.update(CUBLAS_ENV)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    disallow_reduced_reductions()
    if torch.cuda.is_available():
        torch.backends.cuda.preferred_blas_library("cublaslt")
    read = invariant_settings()
    wrong = {k: v for k, v in read.items() if k in SETTINGS_WANTED and v not in (SETTINGS_WANTED[k], "unknown")}
    if wrong:
        log.warning("invariant cuBLAS settings did not take effect: %s (torch %s)", wrong, torch.__version__)
    return read


def nvidia_driver(path: str = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA kernel module's version ("580.159.03"), which a driver update changes. CUDA's driver API version
    (13000) does not move with most driver updates, so it cannot tell a stale GEMM table on its own."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)\s", text)
    return found.group(1) if found else None


def device_stack(device) -> dict[str, str]:
    """What the GEMM table is keyed by (R10): GPU, SMs, driver, CUDA, torch, Triton."""
    import torch

    out = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = "not installed"
    if getattr(device, "type", str(device)) == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        out["gpu"] = props.name
        out["sms"] = str(props.multi_processor_count)
        api = getattr(torch._C, "_cuda_getDriverVersion", None)
        out["driver"] = nvidia_driver() or "unknown"
        out["cuda_driver_api"] = str(api()) if api else "unknown"
        out["cublas"] = f"bundled with torch {torch.__version__} (CUDA {torch.version.cuda})"
    else:
        out |= {"gpu": "cpu (Triton interpreter)", "sms": "0", "driver": "none", "cublas": "none"}
    return out
