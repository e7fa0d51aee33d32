"""Custom Metal kernels (`mx.fast.metal_kernel`) for tree attention and the letter readout.

The kernel bodies live in `kernels/*.metal`, with a comment on their tiling. This module packs their arguments
and sizes their grids; those host-side steps are plain numpy and run (and are tested) without Metal.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import mlx.core as mx
import numpy as np

from basal.core.attention_plan import KEY_TILE, AttentionPlan

KERNELS = Path(__file__).parent / "kernels"
MAX_HEAD_DIM = 256
THREADGROUP = 64


@cache
def _kernel(name: str, inputs: tuple[str, ...]):
    return mx.fast.metal_kernel(
        name=f"basal_{name}",
        input_names=list(inputs),
        output_names=["out"],
        source=(KERNELS / f"{name}.metal").read_text(),
    )


@dataclass(frozen=True)
class Launch:
    """Everything one kernel call needs besides the big tensors."""

    arrays: dict[str, np.ndarray]  # int32 index / parameter arrays
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    output_shape: tuple[int, ...]


def _grid(threads: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """One thread per item, rounded up to whole threadgroups (the kernels return early past the end)."""
    total = max(THREADGROUP, -(-threads // THREADGROUP) * THREADGROUP)
    return (total, 1, 1), (THREADGROUP, 1, 1)


def attention_launch(
    plan: AttentionPlan, query_rows: np.ndarray, n_queries: int, heads: int, kv_heads: int, dim: int
) -> Launch:
    """Flatten the plan's chunk key lists into one [C, L] table and give every query its chunk and position."""
    if dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {dim} > {MAX_HEAD_DIM}: raise MAX_HEAD_DIM in basal/backends/mlx/metal.py")
    width = max((k.shape[1] for _, _, k in plan.groups), default=KEY_TILE)
    tables, chunk_of, pos_of = [], np.zeros(n_queries, dtype=np.int32), np.zeros(n_queries, dtype=np.int32)
    base = 0
    for q_idx, q_pos, k_idx in plan.groups:
        table = np.zeros((k_idx.shape[0], width), dtype=np.int32)
        table[:, : k_idx.shape[1]] = k_idx
        tables.append(table)
        for c in range(q_idx.shape[0]):
            live = q_pos[c] >= 0
            rows = query_rows[q_idx[c, live]]
            chunk_of[rows] = base + c
            pos_of[rows] = q_pos[c, live]
        base += k_idx.shape[0]
    key_idx = np.concatenate(tables) if tables else np.zeros((1, width), dtype=np.int32)
    params = np.asarray([heads, kv_heads, dim, width, n_queries], dtype=np.int32)
    grid, group = _grid(n_queries * heads)
    return Launch(
        {"key_idx": key_idx, "query_chunk": chunk_of, "query_pos": pos_of, "params": params},
        grid,
        group,
        (n_queries, heads, dim),
    )


def readout_launch(n_readouts: int, n_letters: int, dim: int) -> Launch:
    grid, group = _grid(n_readouts * n_letters)
    params = np.asarray([n_readouts, n_letters, dim], dtype=np.int32)
    return Launch({"params": params}, grid, group, (n_readouts, n_letters))


def tree_attention(
    q: mx.array, key_buf: mx.array, value_buf: mx.array, plan: AttentionPlan, query_rows: np.ndarray
) -> mx.array:
    n_q, heads, dim = q.shape
    launch = attention_launch(plan, query_rows, n_q, heads, key_buf.shape[1], dim)
    kernel = _kernel("tree_attention", ("q", "keys", "values", "key_idx", "query_chunk", "query_pos", "params"))
    a = launch.arrays
    (out,) = kernel(
        inputs=[
            q,
            key_buf,
            value_buf,
            mx.array(a["key_idx"]),
            mx.array(a["query_chunk"]),
            mx.array(a["query_pos"]),
            mx.array(a["params"]),
        ],
        template=[("KEY_TILE", KEY_TILE), ("MAX_D", MAX_HEAD_DIM)],
        grid=launch.grid,
        threadgroup=launch.threadgroup,
        output_shapes=[launch.output_shape],
        output_dtypes=[mx.float32],
    )
    return out


def letter_readout(x: mx.array, head: mx.array) -> mx.array:
    launch = readout_launch(x.shape[0], head.shape[0], x.shape[1])
    kernel = _kernel("letter_readout", ("x", "head", "params"))
    (out,) = kernel(
        inputs=[x, head, mx.array(launch.arrays["params"])],
        grid=launch.grid,
        threadgroup=launch.threadgroup,
        output_shapes=[launch.output_shape],
        output_dtypes=[mx.float32],
    )
    return out
