"""Which versions run here: basal, Python, the platform and every package basal can use, read from the installed
distributions' metadata (nothing is imported). `basal doctor` prints them, and export manifests and benchmark
results carry them so that two runs can be told apart."""

from __future__ import annotations

import importlib.metadata as md
import platform

from basal import __version__

PACKAGES = ("torch", "mlx", "triton", "numpy", "tokenizers", "safetensors", "msgspec", "litestar", "uvicorn")


def versions() -> dict[str, str]:
    out = {
        "basal": __version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
    }
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "not installed"
    return out
