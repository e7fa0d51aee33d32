"""Llama over a packed prefix tree, in torch. Reads top to bottom like any Llama; the tree only changes which
keys a query attends to (`kernels.tree_attention`) and the last layer, which runs at readout positions only."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from basal.backends.cuda import ops as K
from basal.backends.cuda.cpu.gemm_chunks import ChunkTable
from basal.core.model.checkpoint_names import EMBED, FINAL_NORM, LM_HEAD, fused_layer
from basal.core.model.model_dir import LlamaConfig, ModelDir
from basal.core.model.safetensors_io import bf16_bits_to_f32
from basal.core.packing.attention_layout import attention_layouts
from basal.core.packing.passes import advance, run_to_end
from basal.core.packing.tree import PackedForward, continuation_forward, single_prompt_forward

TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [q; k; v] rows fused: one GEMM
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [gate; up] rows fused
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


class LlamaWeights:
    """Checkpoint tensors (Hugging Face names) converted once to the compute dtype; q/k/v and gate/up fused."""

    def __init__(self, model: ModelDir, dtype: torch.dtype, device: torch.device):
        self.cfg: LlamaConfig = model.config
        self._index = model.open_weights()
        self.dtype, self.device = dtype, device

        def get(name: str) -> torch.Tensor:
            return self._tensor(name).to(device=device, dtype=dtype)

        self.embed = get(EMBED)
        self.layers = [
            Layer(**fused_layer(i, get, torch.cat, self.cfg.bias)) for i in range(self.cfg.num_hidden_layers)
        ]
        self.norm = get(FINAL_NORM)
        self._letter_rows: dict[tuple[int, ...], torch.Tensor] = {}

    def _tensor(self, name: str) -> torch.Tensor:
        f, key = self._index[name]
        dtype, array = f.tensor(key)
        if dtype == "BF16":
            array = bf16_bits_to_f32(np.asarray(array))
        return torch.from_numpy(np.array(array, dtype=np.float32, copy=True))

    def head_rows(self, start: int, stop: int) -> torch.Tensor:
        """lm_head rows start..stop-1 as the model dtype holds them, f32 on the device (as `letter_rows`)."""
        f, key = self._index[LM_HEAD]
        dtype, array = f.tensor(key)
        rows = np.asarray(array[start:stop])
        rows = bf16_bits_to_f32(rows) if dtype == "BF16" else rows.astype(np.float32)
        return torch.from_numpy(rows).to(self.dtype).float().to(self.device)

    @property
    def vocab_size(self) -> int:
        f, key = self._index[LM_HEAD]
        return int(f.tensor(key)[1].shape[0])

    def letter_rows(self, letter_ids: tuple[int, ...]) -> torch.Tensor:
        """The lm_head rows of the option letters, f32: logits are computed for these rows only."""
        if letter_ids not in self._letter_rows:
            f, key = self._index[LM_HEAD]
            dtype, array = f.tensor(key)
            rows = np.asarray(array[list(letter_ids)])
            rows = bf16_bits_to_f32(rows) if dtype == "BF16" else rows.astype(np.float32)
            # the head sees weights as the model dtype would hold them, computed in f32
            head = torch.from_numpy(rows).to(self.dtype).float().to(self.device)
            self._letter_rows[letter_ids] = head
        return self._letter_rows[letter_ids]


@dataclass
class TreeInputs:
    """Per-forward tensors shared by every layer."""

    cos: torch.Tensor
    sin: torch.Tensor
    layout: list  # all tokens as queries (layers before the last); see basal.core.packing.attention_layout
    readout_layout: list  # readouts as queries (last layer)
    readouts: torch.Tensor
    all_rows: torch.Tensor  # flat index -> query row, all tokens
    readout_rows: torch.Tensor  # flat index -> query row, readouts (others -1)
    prefix_keys: tuple[str, ...]
    fills: tuple[tuple[str, str, torch.Tensor], ...] = ()  # `PackedForward.fills`, the rows on the device


class TreeLlama:
    """The forward pass. `fixed_shapes=False` runs every op on the whole forward at once: the non-invariant
    negative control of the determinism tests. `chunks`: GEMM row-chunk sizes per weight shape (probed at load,
    `gemm_chunks`); None: the fixed 64-row chunks (16 at the readouts) of the first version."""

    def __init__(self, weights: LlamaWeights, fixed_shapes: bool = True, chunks: ChunkTable | None = None):
        self.w = weights
        self.cfg = weights.cfg
        self.fixed = fixed_shapes
        self.chunks = chunks
        self.prefix_kv: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # key -> per layer (K, V) f32
        cos, sin = K.rope_tables(self.cfg.max_position_embeddings, self.cfg.head_dim, self.cfg.rope_theta)
        self.cos, self.sin = cos.to(weights.device), sin.to(weights.device)
        if chunks is not None:  # probe every GEMM shape now, at load, not in the first request
            for w, b in self._gemms():
                chunks.for_weight(w, b)

    def _gemms(self) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """One weight (and bias) of every GEMM shape the forward calls."""
        lw, q_rows = self.w.layers[0], self.cfg.num_attention_heads * self.cfg.head_dim
        b = lw.qkv_bias
        return [
            (lw.qkv, b),
            (lw.qkv[q_rows:], None if b is None else b[q_rows:]),  # last layer: K/V everywhere
            (lw.qkv[:q_rows], None if b is None else b[:q_rows]),  # last layer: queries at the readouts
            (lw.o_proj, lw.o_bias),
            (lw.gate_up, lw.gate_up_bias),
            (lw.down, lw.down_bias),
        ]

    # -- layers -----------------------------------------------------------------------------------------------

    def _linear(self, x, w, b, readout: bool = False) -> Generator[None, None, torch.Tensor]:
        fixed_rows = K.READOUT_ROWS if readout else K.ROWS
        rows = self.chunks.for_weight(w, b) if self.chunks is not None else fixed_rows
        return (yield from K.linear_steps(x, w, b, rows, self.fixed))

    def _norm(self, x, w, rows):
        return K.rms_norm(x, w, self.cfg.rms_norm_eps, rows, self.fixed)

    def _kv_buffers(self, layer: int, k: torch.Tensor, v: torch.Tensor, keys: tuple[str, ...]):
        """Key/value buffer of a layer: a zero row, the cached prefixes it uses, the forward's tokens."""
        zero = k.new_zeros(1, *k.shape[1:])
        ks = [zero] + [self.prefix_kv[p][layer][0] for p in keys] + [k]
        vs = [zero] + [self.prefix_kv[p][layer][1] for p in keys] + [v]
        return torch.cat(ks), torch.cat(vs)

    def layer(
        self, i: int, h: torch.Tensor, t: TreeInputs, last: bool
    ) -> Generator[None, None, tuple[torch.Tensor, tuple]]:
        """One decoder layer. `last`: K/V for every token, everything else only at the readouts. Yields between
        row chunks and key-tile spans: pause points inside the layer (the tensors and the arithmetic do not
        change across a pause)."""
        cfg, lw = self.cfg, self.w.layers[i]
        hd, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        x = self._norm(h, lw.input_norm, K.ROWS)
        if not last:
            qkv = yield from self._linear(x, lw.qkv, lw.qkv_bias)  # [N, (H + 2 KVH) * D]
            q, k, v = qkv.split([nq * hd, nkv * hd, nkv * hd], dim=-1)
        else:  # the last layer needs keys and values everywhere, queries only at the readouts
            kv_w, kv_b = lw.qkv[nq * hd :], None if lw.qkv_bias is None else lw.qkv_bias[nq * hd :]
            kv = yield from self._linear(x, kv_w, kv_b)
            k, v = kv.split([nkv * hd, nkv * hd], dim=-1)
            q_b = None if lw.qkv_bias is None else lw.qkv_bias[: nq * hd]
            q = yield from self._linear(x[t.readouts], lw.qkv[: nq * hd], q_b, readout=True)
        k = K.apply_rope(k.view(-1, nkv, hd), t.cos, t.sin)
        v = v.float().view(-1, nkv, hd)
        q_cos, q_sin = (t.cos, t.sin) if not last else (t.cos[t.readouts], t.sin[t.readouts])
        q = K.apply_rope(q.view(-1, nq, hd), q_cos, q_sin)
        key_buf, value_buf = self._kv_buffers(i, k, v, t.prefix_keys)
        layout, rows = (t.readout_layout, t.readout_rows) if last else (t.layout, t.all_rows)
        attn = yield from K.tree_attention_steps(q, key_buf, value_buf, layout, rows, self.fixed)
        attn = attn.to(h.dtype).view(q.shape[0], nq * hd)
        chunk = K.READOUT_ROWS if last else K.ROWS
        if last:
            h = h[t.readouts]
        h = h + (yield from self._linear(attn, lw.o_proj, lw.o_bias, readout=last))
        x = self._norm(h, lw.post_norm, chunk)
        h = h + (yield from self._mlp(x, lw, readout=last))
        return h, (k, v)

    def _mlp(self, x: torch.Tensor, lw, readout: bool) -> Generator[None, None, torch.Tensor]:
        """down(SwiGLU(gate_up(x))). With probed chunk sizes, one block of rows at a time through buffers every block
        reuses: the [N, 2F] activation never exists whole, so a forward neither holds it (N x 2F floats) nor
        pays the page faults of a fresh tensor that size (on the CPU, 6-12% of the projection's time). A row's
        bits do not depend on the block: every call keeps to the sizes of its weight's layout, whose rows all have
        the same bits whatever the chunk (`gemm_chunks.py`), and SwiGLU is elementwise."""
        if self.chunks is None or not self.fixed:
            gate_up = yield from self._linear(x, lw.gate_up, lw.gate_up_bias, readout=readout)  # [N, 2F]
            return (yield from self._linear(K.swiglu(gate_up, self.fixed), lw.down, lw.down_bias, readout=readout))
        up_plan = self.chunks.for_weight(lw.gate_up, lw.gate_up_bias)
        down_plan = self.chunks.for_weight(lw.down, lw.down_bias)
        n, block = x.shape[0], max(up_plan.rows, down_plan.rows)
        lengths = ({min(n, block), n % block} - {0}) or {0}  # the row counts of the blocks
        up_rows = max(K.padded_rows(r, up_plan) for r in lengths)
        down_rows = max(K.padded_rows(r, down_plan) for r in lengths)
        gate_up = x.new_empty(up_rows, lw.gate_up.shape[0])
        act = x.new_empty(up_rows, lw.gate_up.shape[0] // 2)
        down = x.new_empty(down_rows, lw.down.shape[0])
        out = x.new_empty(n, lw.down.shape[0])
        for start in range(0, n, block):
            part = x[start : start + block]
            g = yield from K.linear_steps(part, lw.gate_up, lw.gate_up_bias, up_plan, out=gate_up)
            a = K.swiglu(g, out=act)
            out[start : start + len(part)] = yield from K.linear_steps(a, lw.down, lw.down_bias, down_plan, out=down)
            if start + block < n:
                yield  # a pause point between blocks, as between the row chunks of an unblocked GEMM
        return out

    # -- whole passes ---------------------------------------------------------------------------------------

    def inputs(self, packed: PackedForward) -> TreeInputs:
        """Per-forward tensors every layer reuses: RoPE rows, the attention layouts, readout rows."""
        dev = self.w.device
        layout, readout_layout = attention_layouts(
            packed, {k: self.prefix_kv[k][0][0].shape[0] for k in packed.prefix_keys}
        )
        n_tok = packed.n_tokens
        readouts = torch.from_numpy(packed.readouts.astype(np.int64)).to(dev)
        readout_rows = torch.full((n_tok,), -1, dtype=torch.int64, device=dev)
        readout_rows[readouts] = torch.arange(len(readouts), device=dev)
        pos = torch.from_numpy(packed.positions.astype(np.int64)).to(dev)
        return TreeInputs(
            self.cos[pos],
            self.sin[pos],
            K.to_torch(layout, dev),
            K.to_torch(readout_layout, dev),
            readouts,
            torch.arange(n_tok, device=dev),
            readout_rows,
            packed.prefix_keys,
            tuple((key, base, torch.from_numpy(rows).to(dev)) for key, base, rows in packed.fills),
        )

    def forward(
        self, t: TreeInputs, tokens: torch.Tensor, letter_ids: tuple[int, ...]
    ) -> Generator[None, None, np.ndarray]:
        """Yields after every layer and at the pause points inside one; every step runs in inference mode, every
        pause is outside it (so a paused pass leaks no torch state into whatever runs meanwhile)."""
        logits, _ = yield from inference_steps(self._forward(t, tokens, letter_ids))
        return logits

    def forward_with_states(
        self, t: TreeInputs, tokens: torch.Tensor, letter_ids: tuple[int, ...]
    ) -> Generator[None, None, tuple[np.ndarray, np.ndarray]]:
        """`forward`, and the final-normed hidden states (f32) of every last-layer row: the readouts of `t`."""
        return (yield from inference_steps(self._forward(t, tokens, letter_ids)))

    def _forward(self, t: TreeInputs, tokens: torch.Tensor, letter_ids: tuple[int, ...]):
        h = self.w.embed[tokens]
        n_layers = self.cfg.num_hidden_layers
        kept: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in t.fills]
        for i in range(n_layers):
            h, (k, v) = yield from self.layer(i, h, t, last=i == n_layers - 1)
            for kv, (_, base, rows) in zip(kept, t.fills, strict=True):  # the entry: its prefix's K/V, then the rows'
                base_k, base_v = self.prefix_kv[base][i]
                kv.append((torch.cat([base_k, k.index_select(0, rows)]), torch.cat([base_v, v.index_select(0, rows)])))
            yield
        for kv, (key, _, _) in zip(kept, t.fills, strict=True):  # set once every layer is done
            self.prefix_kv[key] = kv  # as `prefix` sets it (one that ran first computed the same bits)
        x = self._norm(h, self.w.norm, K.READOUT_ROWS).float()
        head = self.w.letter_rows(letter_ids)  # [L, D] f32: logits for the letter rows only
        rows = K.READOUT_ROWS if self.chunks is None else self.chunks.for_weight(head)
        logits = K.linear(x, head, None, rows, self.fixed)
        return logits.cpu().numpy(), x

    def compute_prefix(self, key: str, tokens: list[int], base: str | None = None) -> int:
        """K/V of a prefix at positions 0..n-1, layer by layer, exactly as a forward would compute them -> the bytes
        kept. `base`: a cached prefix that `tokens` follow (its K/V first, then theirs: a state extending another).
        The entry is set only once every layer is done, as its own tensors (no view into a larger buffer)."""
        start = 0 if base is None else self.prefix_kv[base][0][0].shape[0]
        packed = single_prompt_forward(tokens) if base is None else continuation_forward(tokens, start, base)
        t = self.inputs(packed)
        h = self.w.embed[torch.from_numpy(np.asarray(tokens, dtype=np.int64)).to(self.w.device)]
        kv = []
        n_layers = self.cfg.num_hidden_layers
        for i in range(n_layers):
            h_next, (k, v) = run_to_end(self.layer(i, h, t, last=i == n_layers - 1))
            if base is not None:
                k, v = torch.cat([self.prefix_kv[base][i][0], k]), torch.cat([self.prefix_kv[base][i][1], v])
            kv.append((k.contiguous().clone(), v.contiguous().clone()))
            h = h_next
        self.prefix_kv[key] = kv
        return sum(k.nbytes + v.nbytes for k, v in kv)


HEAD_CHUNK_ROWS = 8192  # lm_head rows read and multiplied at a time: the whole head is never held twice


def head_logsumexp(head_rows, vocab_size: int, states: np.ndarray, device) -> np.ndarray:
    """log sum_v exp(head[v] . h) over the whole vocabulary, f64 [n], for hidden states f32 [n, d]; `head_rows(a,
    b)` gives rows a..b-1 in f32 (as the model dtype holds them). Products in f32, the sums in f64."""
    with torch.inference_mode():
        x = torch.from_numpy(np.ascontiguousarray(states, dtype=np.float32)).to(device)
        parts = []
        for start in range(0, vocab_size, HEAD_CHUNK_ROWS):
            rows = head_rows(start, min(start + HEAD_CHUNK_ROWS, vocab_size))
            parts.append(torch.logsumexp((x @ rows.T).double(), dim=1))
        return torch.logsumexp(torch.stack(parts, dim=1), dim=1).cpu().numpy()


T = TypeVar("T")


def inference_steps(steps: Generator[None, None, T]) -> Generator[None, None, T]:
    """Run each step of `steps` in torch inference mode and pause outside it (CPU and GPU models)."""
    while True:
        with torch.inference_mode():
            ended, value = advance(steps)
        if ended:
            return value
        yield
