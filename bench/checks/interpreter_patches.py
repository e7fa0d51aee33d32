"""Four patches that make the Triton interpreter fit for bitwise kernel tests on the CPU (docs/gpu-path.md §8.1 a).

1. **An order-fixed `tl.dot`** (that also reads bf16 operands: the stock one multiplies their raw bits). The stock
   interpreter computes a dot as `np.matmul(a, b) + acc`; numpy hands it to
   OpenBLAS, whose micro-kernel makes a row's bits depend on its position inside the tile (measured: rows at tile
   offsets 6-11, 18-23, ... differed), so a correct tree-attention kernel fails tree-against-alone. The replacement
   multiplies in f64 (exact for f16, bf16 and f32 inputs), reduces over K with `np.add.reduce`, rounds once to the
   accumulator dtype and adds the accumulator: every output element depends on its own row and column only.
2. **Scalars as loop bounds under numpy ≥ 2.4.** The interpreter keeps scalars as 1-element arrays and converts
   them with `int(array)`, which numpy 2.4 refuses for arrays that are not 0-d (`range(0, K, BK)` fails).
3. **f32 -> bf16 rounds to nearest even**, as the GPU's `cvt.rn.bf16.f32`; the stock interpreter truncates. A NaN
   stays a NaN: the quiet NaN 0x7FC0 with the input's sign (the payload is dropped).
4. **No integer-overflow sanitising** (off on the GPU too unless debugging): it widens every integer op to int64
   and checks it, which made index arithmetic most of the interpreter's time.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np


def require_interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("set TRITON_INTERPRET=1 before triton is imported (run in a process of its own)")


def patch_interpreter() -> None:
    """Install both patches; fails loudly if this Triton's interpreter lacks what they replace."""
    require_interpreter()
    from triton.runtime import interpreter

    builder = getattr(interpreter, "InterpreterBuilder", None)
    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if builder is None or not hasattr(builder, "create_dot") or patch_tensor is None:
        raise RuntimeError("the Triton interpreter changed (InterpreterBuilder.create_dot, _patch_lang_tensor)")
    if getattr(builder.create_dot, "order_fixed", False):
        return

    import triton.language as tl

    def as_f64(h) -> np.ndarray:
        data = np.asarray(h.data)
        if h.dtype.scalar == tl.bfloat16:  # the interpreter keeps bf16 as its uint16 bits
            data = (data.astype(np.uint32) << 16).view(np.float32)
        return data.astype(np.float64)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a64, b64 = as_f64(a), as_f64(b)
        products = a64[..., :, :, None] * b64[..., None, :, :]  # [.., M, K, N]
        total = np.add.reduce(products, axis=-2).astype(d.data.dtype)
        return interpreter.TensorHandle(total + d.data, d.dtype.scalar)

    def patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    stock_cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            u = np.asarray(src.data, dtype=np.float32).view(np.uint32)
            rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # finite values and infinities (never wraps for those)
            nan = (u & 0x7FFFFFFF) > 0x7F800000  # rounding would turn a small payload into inf and wrap a negative
            bits = np.where(nan, ((u >> 16) & 0x8000) | 0x7FC0, rounded).astype(np.uint16)  # a quiet NaN, its sign
            return interpreter.TensorHandle(bits, dst_type.scalar)
        return stock_cast(self, src, dst_type)

    stock_init = builder.__init__

    def init(self, *args, **kwargs):
        stock_init(self, *args, **kwargs)
        self.options = dataclasses.replace(self.options, sanitize_overflow=False)

    builder.__init__ = init
    create_dot.order_fixed = True
    builder.create_dot = create_dot
    builder.cast_impl = cast_impl
    interpreter._patch_lang_tensor = patch_lang_tensor
