"""Metal-native building blocks for the MLX backend: used on Metal only, where they are batch-invariant as they are.

- RMSNorm: `mx.fast.rms_norm` runs one threadgroup per row and picks its kernel by the row length only
  (mlx/backend/metal/normalization.cpp), so a row's result does not depend on how many rows there are.
- SwiGLU: Metal's elementwise kernels compute every element with the same instructions wherever it sits; one
  compiled (fused) kernel over the whole array replaces the CPU path's ~43 exactly-rounded `exp` kernels per
  64-row chunk. The CPU's vectorised `exp` has a scalar tail whose position depends on the array size, which is
  why `ops.py` keeps its workarounds there.
Matmuls stay in fixed 64-row chunks on Metal (`ops.linear`): MLX's Metal GEMM picks its kernel by the row count.
bench/checks/mac_check.py checks both claims on the hardware (op-level invariance at many row counts).
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx


def rms_norm(x: mx.array, w: mx.array, eps: float) -> mx.array:
    return mx.fast.rms_norm(x, w, eps)


@partial(mx.compile, shapeless=True)  # elementwise only: one compiled kernel for every row count
def _silu_times(g: mx.array, u: mx.array) -> mx.array:
    g32 = g.astype(mx.float32)
    return (g32 / (1.0 + mx.exp(-g32))).astype(g.dtype) * u


def swiglu(gate_up: mx.array) -> mx.array:
    """silu(gate) * up over the whole [rows, 2 * I] array, silu in f32 as the torch reference does."""
    half = gate_up.shape[-1] // 2
    return _silu_times(gate_up[:, :half], gate_up[:, half:])
