"""The CUDA settings the invariant path needs (docs/gpu-path.md R7), applied before CUDA initialises its libraries."""

from __future__ import annotations

import os
import re
from pathlib import Path

CUBLAS_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "1"}  # KiB: no room for split-K


def apply_invariant_settings() -> None:
    """Small fixed cuBLAS workspaces, cuBLASLt, no reduced-precision or split-K reductions, no TF32."""
    os.environ.update(CUBLAS_ENV)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:  # torch >= 2.10: (allow_reduced_precision, allow_splitk)
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = (False, False)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = (False, False)
    except (TypeError, ValueError):
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    if torch.cuda.is_available():
        torch.backends.cuda.preferred_blas_library("cublaslt")


def nvidia_driver(path: str = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA kernel module's version ("580.159.03"), which a driver update changes. CUDA's driver API version
    (13000) does not move with most driver updates, so it cannot tell a stale engine table on its own."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)\s", text)
    return found.group(1) if found else None


def versions(device) -> dict[str, str]:
    """What the engine table is keyed by (R10): GPU, SMs, driver, CUDA, torch, Triton."""
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
