"""Custom Metal kernels (`mx.fast.metal_kernel`) for tree attention and the letter readout.

The kernel bodies live in `kernels/*.metal`, with a comment on their tiling. This module packs their arguments
and sizes their grids into a `KernelCall`: the one description both the real launch (`KernelCall.run`, Metal
only) and the Linux test harness (tests/backends/metal_emulation.py, which runs MLX's generated source under a
C++ stand-in for Metal) use. The host-side steps are plain numpy and run without Metal.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import mlx.core as mx
import numpy as np

from basal.core.packing.attention_layout import KEY_TILE, AttentionLayout

KERNELS = Path(__file__).parent / "kernels"
MAX_HEAD_DIM = 256
SIMD_WIDTH = 32
# tree attention: a threadgroup is a block of queries of one chunk x the heads of one key/value head, at most this
# many simdgroups (512 threads: half of the 1024 a Metal threadgroup may hold)
ATTENTION_MAX_SIMDS = 16
STAGE_FLOATS = 4096  # keys or values staged at a time in threadgroup memory (16 KiB; Apple GPUs have 32 KiB)
READOUT_THREADGROUP = 64
# MLX passes an input of fewer elements in the `constant` address space, and names the compiled kernel after it
# (mlx/backend/metal/custom_kernel.cpp, max_constant_array_size): every index / parameter array is padded to this
# many elements so that one compiled kernel serves every forward.
MIN_BUFFER = 8

ATTENTION_INPUTS = ("q", "keys", "values", "key_idx", "group_queries", "group_chunk", "query_pos", "params")
READOUT_INPUTS = ("x", "head", "params")


@cache
def _kernel(name: str, inputs: tuple[str, ...]):
    return mx.fast.metal_kernel(
        name=f"basal_{name}",
        input_names=list(inputs),
        output_names=["out"],
        source=(KERNELS / f"{name}.metal").read_text(),
    )


def _padded(a: np.ndarray) -> np.ndarray:
    """int32, flattened to at least MIN_BUFFER elements (trailing zeros, never read by the kernels)."""
    a = np.ascontiguousarray(a, dtype=np.int32)
    if a.size >= MIN_BUFFER:
        return a
    flat = np.zeros(MIN_BUFFER, dtype=np.int32)
    flat[: a.size] = a.reshape(-1)
    return flat


@dataclass(frozen=True)
class Launch:
    """Everything one kernel call needs besides the big tensors (numpy: built and tested without Metal)."""

    arrays: dict[str, np.ndarray]  # int32 index / parameter arrays, each >= MIN_BUFFER elements
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    output_shape: tuple[int, ...]
    template: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class KernelCall:
    """One launch of a kernel: name, inputs in signature order, template, grid. `run` needs Metal."""

    name: str
    input_names: tuple[str, ...]
    inputs: tuple[mx.array, ...]
    launch: Launch

    def run(self) -> mx.array:
        (out,) = _kernel(self.name, self.input_names)(**self.kwargs())
        return out

    def kwargs(self, verbose: bool = False) -> dict:
        return dict(
            inputs=list(self.inputs),
            template=list(self.launch.template),
            grid=self.launch.grid,
            threadgroup=self.launch.threadgroup,
            output_shapes=[self.launch.output_shape],
            output_dtypes=[mx.float32],
            verbose=verbose,
        )


def attention_launch(
    layout: AttentionLayout, query_rows: np.ndarray, n_queries: int, heads: int, kv_heads: int, dim: int
) -> Launch:
    """Flatten the layout's chunk key lists into one [C, L] table, give every query its position, and cut every
    chunk's queries into blocks of `QB`: one threadgroup per (block, key/value head) reads each key once for the
    block's QB queries x the group's heads (kernels/tree_attention.metal)."""
    if dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {dim} > {MAX_HEAD_DIM}: raise MAX_HEAD_DIM in basal/backends/mlx/metal.py")
    if kv_heads <= 0 or heads % kv_heads:
        raise ValueError(f"{heads} attention heads are not a whole number of groups of {kv_heads} key/value heads")
    group = heads // kv_heads
    if group > ATTENTION_MAX_SIMDS:
        raise ValueError(f"{group} query heads per key/value head > {ATTENTION_MAX_SIMDS} simdgroups per threadgroup")
    # queries per block: as many as fit, but no more than a chunk holds (a readout layout has one query per chunk,
    # and idle simdgroups would only wait at the barriers). The bits do not depend on it.
    per_chunk = max((int((g.q_pos >= 0).sum(axis=1).max()) for g in layout.groups if g.q_pos.size), default=1)
    qb = max(1, min(ATTENTION_MAX_SIMDS // group, per_chunk))
    width = max((g.width for g in layout.groups), default=KEY_TILE)
    if width % KEY_TILE:
        raise ValueError(f"key lists of {width} keys are not whole tiles of {KEY_TILE}")
    pos_of = np.full(n_queries, -1, dtype=np.int32)
    blocks, block_chunk = [], []
    tables, base = [], 0
    for q_idx, q_pos, k_idx in layout.explicit():
        table = np.zeros((k_idx.shape[0], width), dtype=np.int32)
        table[:, : k_idx.shape[1]] = k_idx
        tables.append(table)
        for c in range(q_idx.shape[0]):
            live = q_pos[c] >= 0
            rows = query_rows[q_idx[c, live]]
            pos_of[rows] = q_pos[c, live]
            for b0 in range(0, len(rows), qb):
                block = np.full(qb, -1, dtype=np.int32)
                block[: len(rows[b0 : b0 + qb])] = rows[b0 : b0 + qb]
                blocks.append(block)
                block_chunk.append(base + c)
        base += k_idx.shape[0]
    missing = np.flatnonzero(pos_of < 0)
    if missing.size:  # the kernel would never compute them: refuse before any launch
        raise ValueError(f"{missing.size} queries (first: row {missing[0]}) are missing from the attention layout")
    key_idx = np.concatenate(tables) if tables else np.zeros((1, width), dtype=np.int32)
    group_queries = np.stack(blocks) if blocks else np.full((1, qb), -1, dtype=np.int32)
    group_chunk = np.asarray(block_chunk or [0], dtype=np.int32)
    n_blocks = len(group_chunk)
    params = np.asarray([heads, kv_heads, dim, width, n_queries, n_blocks], dtype=np.int32)
    threads = qb * group * SIMD_WIDTH
    max_d = -(-dim // SIMD_WIDTH) * SIMD_WIDTH
    stage = min(SIMD_WIDTH, STAGE_FLOATS // max_d)
    return Launch(
        {
            "key_idx": _padded(key_idx),
            "group_queries": _padded(group_queries),
            "group_chunk": _padded(group_chunk),
            "query_pos": _padded(pos_of),
            "params": _padded(params),
        },
        (n_blocks * kv_heads * threads, 1, 1),
        (threads, 1, 1),
        (n_queries, heads, dim),
        (("KEY_TILE", KEY_TILE), ("MAX_D", max_d), ("QB", qb), ("GROUP", group), ("STAGE", stage)),
    )


def readout_launch(n_readouts: int, n_letters: int, dim: int) -> Launch:
    """One thread per (readout, letter), rounded up to whole threadgroups (the kernel returns early past the end)."""
    total = max(READOUT_THREADGROUP, -(-(n_readouts * n_letters) // READOUT_THREADGROUP) * READOUT_THREADGROUP)
    params = _padded(np.asarray([n_readouts, n_letters, dim]))
    return Launch({"params": params}, (total, 1, 1), (READOUT_THREADGROUP, 1, 1), (n_readouts, n_letters))


def _require_f32(**tensors: mx.array) -> None:
    for name, t in tensors.items():
        if t.dtype != mx.float32:
            raise TypeError(f"{name} is {t.dtype}; the Metal kernels read float32 only")


class AttentionArgs:
    """A forward's attention launch with its index arrays on the device: built once, reused by every layer."""

    def __init__(self, launch: Launch):
        self.launch = launch
        self.arrays = tuple(mx.array(launch.arrays[n]) for n in ATTENTION_INPUTS[3:])


def attention_call(q: mx.array, key_buf: mx.array, value_buf: mx.array, args: AttentionArgs) -> KernelCall:
    _require_f32(q=q, keys=key_buf, values=value_buf)
    heads, kv_heads, dim = (int(v) for v in args.launch.arrays["params"][:3])
    if q.shape[1:] != (heads, dim) or key_buf.shape[1:] != (kv_heads, dim) or value_buf.shape != key_buf.shape:
        raise ValueError(f"attention shapes q {q.shape}, keys {key_buf.shape} do not match the launch")
    return KernelCall("tree_attention", ATTENTION_INPUTS, (q, key_buf, value_buf, *args.arrays), args.launch)


def readout_call(x: mx.array, head: mx.array) -> KernelCall:
    _require_f32(x=x, head=head)
    if x.shape[1] != head.shape[1]:
        raise ValueError(f"readout rows of {x.shape[1]} values against letter rows of {head.shape[1]}")
    launch = readout_launch(x.shape[0], head.shape[0], x.shape[1])
    return KernelCall("letter_readout", READOUT_INPUTS, (x, head, mx.array(launch.arrays["params"])), launch)


def tree_attention(q: mx.array, key_buf: mx.array, value_buf: mx.array, args: AttentionArgs) -> mx.array:
    return attention_call(q, key_buf, value_buf, args).run()


def letter_readout(x: mx.array, head: mx.array) -> mx.array:
    return readout_call(x, head).run()
