"""One layer's checkpoint tensors (Hugging Face names) as every backend holds them: a fused matrix stacks its
checkpoint matrices by rows in the order listed (q, k, v: one GEMM; gate, up: one GEMM), its bias the same way.
Kept in one place so that the torch, GPU and MLX loaders cannot fuse in different orders."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

EMBED, FINAL_NORM, LM_HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
LAYER = {  # fused name -> checkpoint names under model.layers.{i}.
    "input_norm": ("input_layernorm",),
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o_proj": ("self_attn.o_proj",),
    "post_norm": ("post_attention_layernorm",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}
BIASES = {"qkv": "qkv_bias", "o_proj": "o_bias", "gate_up": "gate_up_bias", "down": "down_bias"}  # basal-1.0 only


def fused_layer(i: int, get: Callable[[str], T], cat: Callable[[Sequence[T]], T], bias: bool) -> dict[str, T | None]:
    """Layer `i`'s tensors by fused name (`qkv`, `qkv_bias`, `o_proj`, `o_bias`, ...): `get` loads one checkpoint
    tensor, `cat` stacks tensors by rows. The bias entries are None where the checkpoint has no biases (basal-1.5)."""
    p = f"model.layers.{i}."

    def load(parts: tuple[str, ...], kind: str) -> T:
        tensors = [get(p + part + kind) for part in parts]
        return tensors[0] if len(tensors) == 1 else cat(tensors)

    out: dict[str, T | None] = {}
    for name, parts in LAYER.items():
        out[name] = load(parts, ".weight")
        if name in BIASES:
            out[BIASES[name]] = load(parts, ".bias") if bias else None
    return out
