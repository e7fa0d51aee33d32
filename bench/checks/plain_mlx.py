"""The speed baseline for bench/checks/mac_check.py: the same Llama in plain MLX, written the way mlx-lm writes it
(whole-array `mx.matmul`, `mx.fast.rms_norm`, `mx.fast.rope`, `mx.fast.scaled_dot_product_attention` with a
causal mask), one prompt at a time, no prefix tree. Not batch-invariant; only timed."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from basal.core.model.model_dir import ModelDir

MX_DTYPE = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}


class PlainLlama:
    def __init__(self, model: ModelDir, dtype: str):
        self.cfg = model.config
        weights: dict[str, mx.array] = {}
        for f in model.weight_files:
            weights.update(mx.load(str(f)))
        self.w = {k: v.astype(MX_DTYPE[dtype]) for k, v in weights.items()}
        mx.eval(self.w)

    def _linear(self, x: mx.array, name: str) -> mx.array:
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if name + ".bias" in self.w else y

    def letter_logits(self, tokens: Sequence[int], letter_ids: Sequence[int]) -> np.ndarray:
        cfg, w = self.cfg, self.w
        hd, nq, nkv, eps = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.rms_norm_eps
        n = len(tokens)
        h = w["model.embed_tokens.weight"][mx.array(list(tokens))][None]
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            x = mx.fast.rms_norm(h, w[p + "input_layernorm.weight"], eps)
            q = self._linear(x, p + "self_attn.q_proj").reshape(1, n, nq, hd).transpose(0, 2, 1, 3)
            k = self._linear(x, p + "self_attn.k_proj").reshape(1, n, nkv, hd).transpose(0, 2, 1, 3)
            v = self._linear(x, p + "self_attn.v_proj").reshape(1, n, nkv, hd).transpose(0, 2, 1, 3)
            q = mx.fast.rope(q, hd, traditional=False, base=cfg.rope_theta, scale=1.0, offset=0)
            k = mx.fast.rope(k, hd, traditional=False, base=cfg.rope_theta, scale=1.0, offset=0)
            a = mx.fast.scaled_dot_product_attention(q, k, v, scale=hd**-0.5, mask="causal")
            h = h + self._linear(a.transpose(0, 2, 1, 3).reshape(1, n, nq * hd), p + "self_attn.o_proj")
            x = mx.fast.rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
            gate, up = self._linear(x, p + "mlp.gate_proj"), self._linear(x, p + "mlp.up_proj")
            h = h + self._linear(gate * mx.sigmoid(gate) * up, p + "mlp.down_proj")
        last = mx.fast.rms_norm(h[0, -1:], w["model.norm.weight"], eps)
        logits = (last @ w["lm_head.weight"][mx.array(list(letter_ids))].T).astype(mx.float32)
        return np.array(logits)[0]
