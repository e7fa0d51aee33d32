"""Backend selection. The protocol itself (`Backend`) is in `basal.core.packing.backend`, so core can drive it.

A backend loads a model directory, caches the K/V of the template prefixes once, and runs `PackedForward`es.
`run` is a generator that yields after every layer (and may yield inside one), so that a long-lane job can pause
at any yield (the engine drives it; a backend never sleeps or reorders), and returns ``float32[readouts, letters]``.
"""

from __future__ import annotations

import importlib.util
import logging
import platform

from basal.core.model.model_dir import ModelDir
from basal.core.packing.backend import Backend

__all__ = ["BACKENDS", "DTYPES", "Backend", "load_backend", "pick_backend", "torch_installed"]

log = logging.getLogger(__name__)

BACKENDS = ("torch", "mlx")
DTYPES = ("f32", "f16", "bf16")


def _apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def pick_backend(name: str = "auto") -> str:
    """``auto``: CUDA -> torch, Apple Silicon with MLX -> mlx, else torch on the CPU.

    MLX is asked first: a Mac has no CUDA, and torch is an extra there, so importing it first would fail on the
    default Mac install (and cost a second where it is installed)."""
    if name != "auto":
        if name not in BACKENDS:
            raise ValueError(f"unknown backend {name!r}; choose auto, {', '.join(BACKENDS)}")
        return name
    if _apple_silicon() and load_backend_class("mlx") is not None:
        return "mlx"
    if not torch_installed():
        raise ValueError(
            "no backend is installed: torch is missing (pip install 'basal-bitwise[torch]', or 'basal-bitwise[cuda]' "
            "on NVIDIA); MLX serves only on Apple Silicon"
        )
    return "torch"


def torch_installed() -> bool:
    """Whether torch can be imported here (without importing it: that takes a second or more). A finder that
    refuses torch (an import hook, a broken install) counts as not installed."""
    try:
        return importlib.util.find_spec("torch") is not None
    except ImportError:
        return False


def load_backend_class(name: str):
    """The backend class by name, or None if that backend is not built in this version."""
    if name == "torch":
        from basal.backends.cuda.backend import TorchBackend

        return TorchBackend
    if importlib.util.find_spec("mlx") is None:  # MLX is not installed on this platform
        return None
    from basal.backends.mlx.backend import MLXBackend  # type: ignore[import-not-found]

    return MLXBackend


def load_backend(
    model: ModelDir, backend: str = "auto", dtype: str | None = None, device: str | None = None
) -> Backend:
    name = pick_backend(backend)
    cls = load_backend_class(name)
    if cls is None:
        raise ValueError(f"the {backend} backend is not available in this build of basal")
    if name == "mlx" and not _apple_silicon():
        log.warning(
            "MLX runs on the CPU here (mlx[cpu], a slow reference BLAS): about 10x slower than the torch backend "
            "on the same machine; use --backend torch unless you are checking MLX itself"
        )
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return cls.load(model, dtype=dtype, device=device)
