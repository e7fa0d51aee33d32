"""Full-precision f32 matmuls on Apple GPUs with matrix units (M5 class).

MLX runs float32 matmul-family operations at reduced (TF32-like) precision there by default; `MLX_ENABLE_TF32=0`
keeps them in float32 (MLX docs: usage/precision and usage/environment_variables). There is no Python API for
it, and MLX reads the variable when its GEMM dispatch first needs it, so basal sets it before the first f32 matmul
of the reference mode and then checks, with one small product against float64, that it took effect (an earlier
matmul in the same process may already have fixed it).
"""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np

VARIABLE = "MLX_ENABLE_TF32"
TF32_ERROR = 1e-4  # relative error of a 128x128 f32 product: TF32 ~7e-4, float32 ~1e-7


def require_full_f32(device: mx.Device) -> None:
    """Turn reduced-precision f32 matmuls off (the torch backend's allow_tf32 = False) and prove it on `device`."""
    current = os.environ.get(VARIABLE)
    if current not in (None, "0"):
        raise RuntimeError(
            f"{VARIABLE}={current} asks MLX for reduced-precision f32 matmuls; the f32 reference "
            f"mode needs full precision: unset it or start with {VARIABLE}=0"
        )
    os.environ[VARIABLE] = "0"
    error = f32_matmul_error(device)
    if error > TF32_ERROR:
        raise RuntimeError(
            f"MLX f32 matmuls run at reduced precision here (relative error {error:.1e}): a matmul "
            f"ran before basal could turn it off; start the process with {VARIABLE}=0"
        )


def f32_matmul_error(device: mx.Device) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 128)).astype(np.float32)
    b = rng.standard_normal((128, 128)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    got = np.array(mx.matmul(mx.array(a), mx.array(b), stream=device)).astype(np.float64)
    return float(np.abs(got - exact).max() / np.abs(exact).max())
