"""FLOPs of a packed forward, counted from its tokens and the model's shape (issue 16: every benchmark
reports the fraction of the machine's measured GEMM rate it reaches).

Only useful work is counted — what the tree needs, not the padding of row chunks or key tiles — so the fraction
measures the whole forward against the machine: padding, attention, Python and memory traffic all lower it.
One multiply-add is 2 FLOPs. Per layer before the last, every packed token runs the four GEMMs (q/k/v, o,
gate/up, down) and attends to the p + 1 keys of its prompt up to its position p (the cached template prefix
included: it is read, not recomputed); the last layer computes K/V for every token and the rest at the readouts
only; the head computes the letter rows at the readouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basal.core.model.model_dir import LlamaConfig
from basal.core.packing.tree import PackedForward


@dataclass(frozen=True)
class Flops:
    gemm: float  # weight GEMMs and the letter head
    attention: float  # q·k and p·v

    @property
    def total(self) -> float:
        return self.gemm + self.attention

    def __add__(self, other: Flops) -> Flops:
        return Flops(self.gemm + other.gemm, self.attention + other.attention)


NO_FLOPS = Flops(0.0, 0.0)


def gemm_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of every weight GEMM of a layer (q/k/v and gate/up fused, as the backends run them)."""
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    return {
        "qkv": (q + 2 * kv, cfg.hidden_size),
        "o": (cfg.hidden_size, q),
        "gate_up": (2 * cfg.intermediate_size, cfg.hidden_size),
        "down": (cfg.hidden_size, cfg.intermediate_size),
    }


def per_token_gemm_flops(cfg: LlamaConfig) -> dict[str, float]:
    """FLOPs of one token through each weight GEMM of one layer."""
    return {name: 2.0 * n * k for name, (n, k) in gemm_shapes(cfg).items()}


def forward_flops(cfg: LlamaConfig, packed: PackedForward) -> Flops:
    n_tokens, n_readouts = packed.n_tokens, len(packed.readouts)
    per = per_token_gemm_flops(cfg)
    layer = sum(per.values())
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    kv_share = 2.0 * cfg.hidden_size * 2 * kv  # the K/V part of the fused q/k/v GEMM
    last = n_tokens * kv_share + n_readouts * (layer - kv_share)
    head = n_readouts * 2.0 * cfg.hidden_size * len(packed.letter_ids)
    gemm = (cfg.num_hidden_layers - 1) * n_tokens * layer + last + head
    per_key = 4.0 * q  # q·k and p·v over every head, per (query, key) pair
    keys_all = float(np.sum(packed.positions.astype(np.int64) + 1))
    keys_readouts = float(np.sum(packed.positions[packed.readouts].astype(np.int64) + 1))
    attention = per_key * ((cfg.num_hidden_layers - 1) * keys_all + keys_readouts)
    return Flops(gemm, attention)
