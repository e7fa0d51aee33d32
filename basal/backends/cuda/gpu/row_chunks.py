"""Row ranges that keep a Triton kernel's element offsets inside 32 bits.

Triton computes `row * stride + column` in 32-bit ints when its arguments fit in 32 bits, so a tensor whose rows
reach past 2^31 elements would wrap to another address: on the max shapes a [T, 2F] gate/up buffer (F = 14336)
does at T ≥ 74 899 rows, which a long-lane forward reaches when `tree_max_tokens` is raised. The launchers split
such a call into row ranges instead of widening the kernels' arithmetic: every kernel is row-invariant (R1, R2,
R4), so a row computed in a range has the bits it has in the whole call, and the ranges start at multiples of
ROW_ALIGN rows, so their pointers keep the 16-byte alignment the compiled variant was specialised for. Calls within
the limit (every CUDA-graph bucket) launch once, unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

OFFSET_LIMIT = 2**31  # element offsets a kernel may form: int32
ROW_ALIGN = 1024  # rows per range are a multiple of this: 16-byte aligned starts for any row width


def row_ranges(rows: int, elements_per_row: int) -> list[tuple[int, int]]:
    """[(start, end)] covering `rows` rows, each range's `rows × elements_per_row` below OFFSET_LIMIT; one range when
    the whole call fits. `elements_per_row`: the largest row stride (in elements) of the tensors the kernel indexes
    by row."""
    if rows * elements_per_row < OFFSET_LIMIT:
        return [(0, rows)]
    per_range = (OFFSET_LIMIT - 1) // elements_per_row // ROW_ALIGN * ROW_ALIGN
    if per_range < ROW_ALIGN:
        raise ValueError(f"rows of {elements_per_row} elements are too wide for a kernel's 32-bit offsets")
    return [(start, min(start + per_range, rows)) for start in range(0, rows, per_range)]


def in_row_ranges(elements_per_row: int, *tensors: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """The tensors (rows first, the same row count) whole when their rows fit the limit, else sliced alike per
    range of `row_ranges`."""
    ranges = row_ranges(tensors[0].shape[0], elements_per_row)
    if len(ranges) == 1:
        yield tensors
        return
    for r0, r1 in ranges:
        yield tuple(t[r0:r1] for t in tensors)
