"""Llama over a packed prefix tree in MLX — the torch backend's model, op for op (see its docstring).

Two sets of building blocks, chosen once at load: on Metal, custom kernels for tree attention and the letter
readout (`metal.py`) and Metal-native norms and elementwise ops (`native.py`); on the CPU, the portable
batch-invariant ops (`ops.py`). Matmuls run in fixed 64-row chunks on both.

Every layer ends at a yield, where the engine may pause a long-lane pass. On the CPU each layer is evaluated
before it yields, and a layer over more than STEP_ROWS rows also yields inside, between row blocks and attention
groups (`_row_blocks`), with the same bits. On Metal a layer is submitted with `mx.async_eval` and the pass
blocks on the layer before it: the GPU always has the next layer queued, a paused pass leaves at most one layer
in flight, and the host's clock (which the long lane's slice is measured with) stays within one layer of the GPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from basal.backends.mlx import metal, native
from basal.backends.mlx import ops as O
from basal.core.model.checkpoint_names import EMBED, FINAL_NORM, LM_HEAD, fused_layer
from basal.core.model.model_dir import ModelDir
from basal.core.packing.attention_layout import AttentionLayout, attention_layouts
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import PackedForward, continuation_forward, single_prompt_forward

# On the CPU a layer over more rows than this yields between blocks of this many rows (and between attention
# groups), so a long-lane pass can step aside inside a layer and `long_slice_ms` holds on long prompts.
STEP_ROWS = 512
HEAD_CHUNK_ROWS = 8192  # lm_head rows multiplied at a time for the vocabulary log-sum-exp (diagnostics)
assert STEP_ROWS % O.ROWS == 0 and STEP_ROWS % O.READOUT_ROWS == 0, "blocks of whole chunks keep the bits"
MX_DTYPE = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}


@dataclass
class Layer:
    input_norm: mx.array
    qkv_t: mx.array  # [D, (H + 2 KVH) * hd]: q, k, v fused and transposed
    qkv_bias: mx.array | None
    o_t: mx.array
    o_bias: mx.array | None
    post_norm: mx.array
    gate_up_t: mx.array
    gate_up_bias: mx.array | None
    down_t: mx.array
    down_bias: mx.array | None


@dataclass
class TreeInputs:
    cos: mx.array
    sin: mx.array
    layout: AttentionLayout
    readout_layout: AttentionLayout
    readouts: np.ndarray
    all_rows: np.ndarray
    readout_rows: np.ndarray
    prefix_keys: tuple[str, ...]
    attention: dict[bool, metal.AttentionArgs] | None = None  # Metal: launch per layout (last layer or not)
    fills: tuple[tuple[str, str, mx.array], ...] = ()  # `PackedForward.fills`, the rows as an MLX array


class MLXLlama:
    def __init__(
        self,
        model: ModelDir,
        dtype: str,
        use_metal: bool,
        native_ops: bool | None = None,
        fixed_shapes: bool = True,
    ):
        """`fixed_shapes=False` is the negative control: whole-array matmuls and library elementwise ops, which
        change their arithmetic with the row count (MLX's Metal GEMM dispatch; mlx-cpu's vectorised exp)."""
        self.cfg = cfg = model.config
        if dtype not in MX_DTYPE:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(MX_DTYPE)}")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ValueError(
                f"{cfg.num_attention_heads} attention heads are not a multiple of "
                f"{cfg.num_key_value_heads} key/value heads"
            )
        self.dtype = MX_DTYPE[dtype]
        self.use_metal = use_metal
        self.native = use_metal if native_ops is None else native_ops  # tests run the native ops on the CPU too
        self.native = self.native or not fixed_shapes
        self.fixed = fixed_shapes
        weights: dict[str, mx.array] = {}
        for f in model.weight_files:
            weights.update(mx.load(str(f)))

        def get(name: str) -> mx.array:
            return weights[name].astype(self.dtype)

        self.embed = get(EMBED)
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            t = fused_layer(i, get, mx.concatenate, cfg.bias)
            self.layers.append(
                Layer(
                    input_norm=t["input_norm"],
                    qkv_t=t["qkv"].T,
                    qkv_bias=t["qkv_bias"],
                    o_t=t["o_proj"].T,
                    o_bias=t["o_bias"],
                    post_norm=t["post_norm"],
                    gate_up_t=t["gate_up"].T,
                    gate_up_bias=t["gate_up_bias"],
                    down_t=t["down"].T,
                    down_bias=t["down_bias"],
                )
            )
        self.norm = get(FINAL_NORM)
        self._lm_head = weights[LM_HEAD]
        self._letter_rows: dict[tuple[int, ...], mx.array] = {}
        self.cos, self.sin = O.rope_tables(cfg.max_position_embeddings, cfg.head_dim, cfg.rope_theta)
        self.prefix_kv: dict[str, list[tuple[mx.array, mx.array]]] = {}
        # evaluate everything now: MLX streams are per thread, and lanes compute on their own threads
        mx.eval(
            self.embed,
            self.norm,
            self._lm_head,
            self.cos,
            self.sin,
            *[v for layer in self.layers for v in vars(layer).values() if v is not None],
        )

    def letter_rows(self, letter_ids: tuple[int, ...]) -> mx.array:
        if letter_ids not in self._letter_rows:
            rows = self._lm_head[mx.array(list(letter_ids))].astype(self.dtype).astype(mx.float32)
            mx.eval(rows)  # evaluated where it is made: another lane's thread may read it
            self._letter_rows[letter_ids] = rows
        return self._letter_rows[letter_ids]

    def vocab_logsumexp(self, states: np.ndarray) -> np.ndarray:
        """log sum_v exp(head[v] . h) over the whole vocabulary, f64 [n], for final-normed states f32 [n, d]: the
        head as the model dtype holds it, products in f32 a chunk of rows at a time, the sums in f64 (diagnostics)."""
        x = mx.array(np.ascontiguousarray(states, dtype=np.float32))
        vocab = self._lm_head.shape[0]
        parts = []
        for start in range(0, vocab, HEAD_CHUNK_ROWS):
            rows = self._lm_head[start : start + HEAD_CHUNK_ROWS].astype(self.dtype).astype(mx.float32)
            logits = np.array(x @ rows.T, dtype=np.float64)
            top = logits.max(axis=1, keepdims=True)
            parts.append(top[:, 0] + np.log(np.exp(logits - top).sum(axis=1)))
        both = np.stack(parts, axis=1)
        top = both.max(axis=1, keepdims=True)
        return top[:, 0] + np.log(np.exp(both - top).sum(axis=1))

    def inputs(self, packed: PackedForward) -> TreeInputs:
        layout, readout_layout = attention_layouts(
            packed, {k: self.prefix_kv[k][0][0].shape[0] for k in packed.prefix_keys}
        )
        readouts = packed.readouts.astype(np.int64)
        readout_rows = np.full(packed.n_tokens, -1, dtype=np.int64)
        readout_rows[readouts] = np.arange(len(readouts))
        pos = mx.array(packed.positions.astype(np.int32))
        attention = None
        if self.use_metal:
            cfg = self.cfg
            shape = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
            attention = {
                False: metal.AttentionArgs(
                    metal.attention_launch(layout, np.arange(packed.n_tokens), packed.n_tokens, *shape)
                ),
                True: metal.AttentionArgs(metal.attention_launch(readout_layout, readout_rows, len(readouts), *shape)),
            }
        return TreeInputs(
            self.cos[pos],
            self.sin[pos],
            layout,
            readout_layout,
            readouts,
            np.arange(packed.n_tokens),
            readout_rows,
            packed.prefix_keys,
            attention,
            tuple((key, base, mx.array(rows.astype(np.int32))) for key, base, rows in packed.fills),
        )

    def _norm(self, x: mx.array, w: mx.array, rows: int) -> mx.array:
        if self.native:
            return native.rms_norm(x, w, self.cfg.rms_norm_eps)
        return O.rms_norm(x, w, self.cfg.rms_norm_eps, rows)

    def _linear(self, x: mx.array, w_t: mx.array, b: mx.array | None, rows: int) -> mx.array:
        if self.fixed:
            return O.linear(x, w_t, b, rows)
        # the negative control only: a GEMM whose arithmetic changes with the row count. MLX's Metal GEMM does that
        # by itself; mlx-cpu's (reference BLAS) does not, so there it splits K into 1-3 parts by the row count, as
        # a shape-driven dispatcher picks split-K (steel_gemm_splitk, docs/determinism.md §1)
        splits = 1 if self.use_metal else 1 + (x.shape[0] // O.ROWS) % 3
        edges = [w_t.shape[0] * i // splits for i in range(splits + 1)]
        parts = [x[:, lo:hi] @ w_t[lo:hi] for lo, hi in itertools.pairwise(edges)]
        y = parts[0]
        for part in parts[1:]:
            y = y + part
        return y if b is None else y + b

    def _swiglu(self, gate_up: mx.array) -> mx.array:
        return native.swiglu(gate_up) if self.native else O.swiglu(gate_up)

    def _row_blocks(self, fn: Callable[[slice], mx.array], n: int) -> Generator[None, None, mx.array]:
        """fn over rows [0, n); on the CPU in blocks of STEP_ROWS rows, each evaluated and followed by a yield (a
        point where the long lane may step aside inside a layer). A block is whole 64-row chunks, so every chunk
        holds the same rows as without blocks: the same bits."""
        if self.use_metal or n <= STEP_ROWS:
            return fn(slice(0, n))
        parts = []
        for start in range(0, n, STEP_ROWS):
            parts.append(fn(slice(start, min(start + STEP_ROWS, n))))
            mx.eval(parts[-1])
            yield
        return mx.concatenate(parts)

    def _attention_steps(self, q, key_buf, value_buf, t: TreeInputs, last: bool) -> Generator[None, None, mx.array]:
        if t.attention is not None:
            return metal.tree_attention(q, key_buf, value_buf, t.attention[last])
        layout, rows = (t.readout_layout, t.readout_rows) if last else (t.layout, t.all_rows)
        if layout.n_queries <= STEP_ROWS:
            return O.tree_attention(q, key_buf, value_buf, layout, rows)
        parts = []
        for group in O.attention_groups(q, key_buf, value_buf, layout, rows):  # one group of query chunks at a time
            mx.eval(group[1])
            parts.append(group)
            yield
        return O.gather_attention(parts, q.shape[1], q.shape[2])

    def layer(
        self, i: int, h: mx.array, t: TreeInputs, last: bool
    ) -> Generator[None, None, tuple[mx.array, tuple[mx.array, mx.array]]]:
        """One layer; yields inside it only on the CPU and only for more than STEP_ROWS rows (`_row_blocks`)."""
        cfg, lw = self.cfg, self.layers[i]
        hd, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        n = h.shape[0]
        if not last:
            qkv = yield from self._row_blocks(
                lambda r: self._linear(self._norm(h[r], lw.input_norm, O.ROWS), lw.qkv_t, lw.qkv_bias, O.ROWS), n
            )
            q, k, v = mx.split(qkv, [nq * hd, (nq + nkv) * hd], axis=-1)
        else:  # keys and values everywhere, queries only at the readouts
            kv_b = None if lw.qkv_bias is None else lw.qkv_bias[nq * hd :]
            kv = yield from self._row_blocks(
                lambda r: self._linear(self._norm(h[r], lw.input_norm, O.ROWS), lw.qkv_t[:, nq * hd :], kv_b, O.ROWS),
                n,
            )
            k, v = mx.split(kv, 2, axis=-1)
            q_b = None if lw.qkv_bias is None else lw.qkv_bias[: nq * hd]
            x = self._norm(h[mx.array(t.readouts)], lw.input_norm, O.READOUT_ROWS)
            q = self._linear(x, lw.qkv_t[:, : nq * hd], q_b, O.READOUT_ROWS)
        k = O.apply_rope(k.astype(mx.float32).reshape(-1, nkv, hd), t.cos, t.sin)
        v = v.astype(mx.float32).reshape(-1, nkv, hd)
        cos, sin = (t.cos, t.sin) if not last else (t.cos[mx.array(t.readouts)], t.sin[mx.array(t.readouts)])
        q = O.apply_rope(q.astype(mx.float32).reshape(-1, nq, hd), cos, sin)
        zero = mx.zeros((1, nkv, hd))
        key_buf = mx.concatenate([zero, *[self.prefix_kv[p][i][0] for p in t.prefix_keys], k])
        value_buf = mx.concatenate([zero, *[self.prefix_kv[p][i][1] for p in t.prefix_keys], v])
        attn = yield from self._attention_steps(q, key_buf, value_buf, t, last)
        attn = attn.astype(h.dtype).reshape(q.shape[0], nq * hd)
        chunk = O.READOUT_ROWS if last else O.ROWS
        if last:
            h = h[mx.array(t.readouts)]

        def mlp(r: slice) -> mx.array:
            hr = h[r] + self._linear(attn[r], lw.o_t, lw.o_bias, chunk)
            x = self._norm(hr, lw.post_norm, chunk)
            up = self._swiglu(self._linear(x, lw.gate_up_t, lw.gate_up_bias, chunk))
            return hr + self._linear(up, lw.down_t, lw.down_bias, chunk)

        h = yield from self._row_blocks(mlp, h.shape[0])
        return h, (k, v)

    def forward(
        self, t: TreeInputs, tokens: np.ndarray, letter_ids: tuple[int, ...]
    ) -> Generator[None, None, np.ndarray]:
        logits, _ = yield from self.forward_with_states(t, tokens, letter_ids)
        return logits

    def forward_with_states(
        self, t: TreeInputs, tokens: np.ndarray, letter_ids: tuple[int, ...]
    ) -> Generator[None, None, tuple[np.ndarray, mx.array]]:
        """`forward`, and the final-normed hidden states (f32) of every last-layer row: the readouts of `t`."""
        h = self.embed[mx.array(tokens.astype(np.int32))]
        n_layers = self.cfg.num_hidden_layers
        previous = None
        kept: list[list[tuple[mx.array, mx.array]]] = [[] for _ in t.fills]
        for i in range(n_layers):
            h, (k, v) = yield from self.layer(i, h, t, last=i == n_layers - 1)
            for kv, (_, base, rows) in zip(kept, t.fills, strict=True):  # the entry: its prefix's K/V, then the rows'
                base_k, base_v = self.prefix_kv[base][i]
                kv.append((mx.concatenate([base_k, k[rows]]), mx.concatenate([base_v, v[rows]])))
            layer_kv = [a for kv in kept for a in kv[-1]]
            if self.use_metal:
                mx.async_eval(h, *layer_kv)
                if previous is not None:
                    mx.eval(previous)  # one layer in flight where the long lane may pause (module docstring)
                previous = h
            else:
                mx.eval(h, *layer_kv)  # a layer boundary is a real boundary: the long lane may pause here
            yield
        if kept:
            mx.eval(*[a for kv in kept for pair in kv for a in pair])
        for kv, (key, _, _) in zip(kept, t.fills, strict=True):  # set once every layer is done
            self.prefix_kv[key] = kv  # as `prefix` sets it (one that ran first computed the same bits)
        x = self._norm(h, self.norm, O.READOUT_ROWS).astype(mx.float32)
        head = self.letter_rows(letter_ids)
        logits = metal.letter_readout(x, head) if self.use_metal else self._linear(x, head.T, None, O.READOUT_ROWS)
        return np.array(logits.astype(mx.float32)), x

    def compute_prefix(self, key: str, tokens: list[int], base: str | None = None) -> int:
        """K/V of a prefix at positions 0..n-1 (after the cached prefix `base`, whose K/V come first) -> bytes kept;
        the entry is set once every layer is evaluated."""
        start = 0 if base is None else self.prefix_kv[base][0][0].shape[0]
        packed = single_prompt_forward(tokens) if base is None else continuation_forward(tokens, start, base)
        t = self.inputs(packed)
        h = self.embed[mx.array(np.asarray(tokens, dtype=np.int32))]
        kv = []
        for i in range(self.cfg.num_hidden_layers):
            h, (k, v) = run_to_end(self.layer(i, h, t, last=i == self.cfg.num_hidden_layers - 1))
            if base is not None:
                k = mx.concatenate([self.prefix_kv[base][i][0], k])
                v = mx.concatenate([self.prefix_kv[base][i][1], v])
            k, v = mx.contiguous(k), mx.contiguous(v)  # their own buffers, not views into the layer's K/V GEMM
            mx.eval(h, k, v)
            kv.append((k, v))
        self.prefix_kv[key] = kv
        return sum(k.nbytes + v.nbytes for k, v in kv)
