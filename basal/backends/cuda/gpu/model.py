"""Llama over a packed tree on the GPU kernels (docs/gpu-path.md §4-§5). Reads top to bottom like the torch CPU model:
the same layers, the same rounding points, the last layer at readout rows only — but every op is one fixed Triton
kernel (or a probed cuBLASLt GEMM) writing into preallocated buffers, so a forward can be captured as a CUDA graph
and padding a forward to a bucket changes nothing but M.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, fields

import torch

from basal.backends.cuda.gpu import triton_attention as attn_kernels
from basal.backends.cuda.gpu import triton_gemm as tri
from basal.backends.cuda.gpu import triton_rowwise as rows
from basal.backends.cuda.gpu.kernel_configs import READOUT_LETTERS, AttentionConfig
from basal.backends.cuda.gpu.prefix_slab import PrefixSlab
from basal.backends.cuda.gpu.weights_direct import DeviceWeights
from basal.backends.cuda.ops import rope_tables
from basal.core.model.model_dir import LlamaConfig

Linear = Callable[..., torch.Tensor]  # (x, w, out, bias=None) -> out = x · wᵀ (+ bias)
Prefixes = tuple[list[torch.Tensor], list[torch.Tensor]]  # every layer's prefix K buffer, then its V buffer


@dataclass
class Buffers:
    """Activations of one forward: [T, ...] per token, [R, ...] per readout. Views of an arena share its addresses."""

    h: torch.Tensor  # [T, hidden] residual stream
    x: torch.Tensor  # [T, hidden] normed
    y: torch.Tensor  # [T, hidden] o / down output, added into h by the next norm
    qkv: torch.Tensor  # [T, (H + 2 KVH) D]
    q: torch.Tensor  # [T, H, D] attention dtype
    k: torch.Tensor  # [T, KVH, D] attention dtype
    v: torch.Tensor  # [T, KVH, D]
    attn: torch.Tensor  # [T, H, D]
    gate_up: torch.Tensor  # [T, 2F]; [T, 0] where the GEMM fuses SwiGLU and never writes it
    act: torch.Tensor  # [T, F]
    hr: torch.Tensor  # [R, hidden] and the rest: the last layer at the readouts
    xr: torch.Tensor
    yr: torch.Tensor
    attn_r: torch.Tensor  # [R, H D]
    gate_up_r: torch.Tensor
    act_r: torch.Tensor
    logits: torch.Tensor  # [R, 16] f32
    letters: torch.Tensor  # [16, hidden] f32: the LM-head rows of this forward's letters, zero past them

    @classmethod
    def allocate(
        cls, cfg: LlamaConfig, tokens: int, readouts: int, dtype, att_dtype, device, gate_up: bool = True
    ) -> Buffers:
        """`gate_up`: allocate the [T, 2F] gate/up activation (not needed where SwiGLU is fused into the GEMM: on
        the max shapes that saves 470 MB of the 8192-token arena, and 57 KB per token of every eager pass)."""
        hid, f, d, h = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_attention_heads
        kvh, up = cfg.num_key_value_heads, 2 * f if gate_up else 0

        def z(*shape, dt=dtype):
            return torch.zeros(shape, dtype=dt, device=device)

        t, r = tokens, readouts
        return cls(
            z(t, hid), z(t, hid), z(t, hid), z(t, (h + 2 * kvh) * d), z(t, h, d, dt=att_dtype),
            z(t, kvh, d, dt=att_dtype), z(t, kvh, d), z(t, h, d), z(t, up), z(t, f),
            z(r, hid), z(r, hid), z(r, hid), z(r, h * d), z(r, up), z(r, f), z(r, READOUT_LETTERS, dt=torch.float32),
            z(READOUT_LETTERS, hid, dt=torch.float32),
        )  # fmt: skip

    def view(self, tokens: int, readouts: int) -> Buffers:
        """The first rows of every buffer: the same addresses for every forward of a bucket."""
        per_readout = {"hr", "xr", "yr", "attn_r", "gate_up_r", "act_r", "logits"}

        def rows(name: str) -> torch.Tensor:
            whole = getattr(self, name)
            return whole if name == "letters" else whole[: readouts if name in per_readout else tokens]

        return Buffers(**{f.name: rows(f.name) for f in fields(self)})


class GpuLlama:
    """The forward pass over device buffers. `linear_for(n, k)` gives the probed GEMM of a weight shape."""

    def __init__(
        self,
        weights: DeviceWeights,
        linear_for: Callable[[int, int], Linear],
        attention: AttentionConfig,
        fuses: Callable[[int, int], bool] = lambda n, k: False,
    ):
        """`fuses(n, k)`: whether the GEMM of weight shape [n, k] carries its epilogue (the `tri` GEMM does:
        the residual add of o and down, SwiGLU for gate_up), with the bits of the separate kernels."""
        self.w, self.cfg, self.att = weights, weights.cfg, attention
        self._fuses_shape = fuses
        self.att_dtype = torch.float32 if attention.precision == "f32" else weights.dtype
        cos, sin = rope_tables(self.cfg.max_position_embeddings, self.cfg.head_dim, self.cfg.rope_theta)
        self.cos, self.sin = cos.to(weights.device), sin.to(weights.device)
        self.group = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        self.tokens_per_tile = attention.tokens_per_tile(self.group)
        self._linear_for = linear_for
        cfg = self.cfg
        self.slab = PrefixSlab(  # every cached prefix, at stable addresses (prefix_slab.py)
            cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, self.att_dtype, weights.dtype, weights.device
        )

    @property
    def prefix_rows(self) -> dict[str, tuple[int, int]]:
        """key -> (first row, length) of every cached prefix in the prefix buffers."""
        return self.slab.rows

    def prefix_buffers(self) -> Prefixes:
        """The layers' prefix buffers as they are now: what a forward (or a graph's capture) reads throughout."""
        return list(self.slab.k), list(self.slab.v)

    def linear(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x · wᵀ (+ bias: basal-1.0 checkpoints, added in the GEMM's epilogue) on the shape's probed GEMM."""
        return self._linear_for(w.shape[0], w.shape[1])(x, w, out, bias)

    def fuses(self, w: torch.Tensor) -> bool:
        return self._fuses_shape(w.shape[0], w.shape[1])

    def add_linear(self, x, w, bias, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """h += x · wᵀ (+ bias) in the GEMM's epilogue where it fuses; otherwise the product goes to y, returned
        for the next norm to add (the same rounding either way)."""
        if self.fuses(w):
            tri.linear(x, w, out=h, epilogue="residual", residual=h, bias=bias)
            return None
        return self.linear(x, w, y, bias)

    def gate_up_swiglu(self, x, w, bias, gate_up: torch.Tensor, act: torch.Tensor) -> None:
        """act = silu(x · gateᵀ) · (x · upᵀ), fused into the GEMM where it can be (gate_up is then never written)."""
        if self.fuses(w):
            tri.linear(x, w, out=act, epilogue="swiglu", bias=bias)
        else:
            rows.swiglu(self.linear(x, w, gate_up, bias), act)

    def _pending(self, layer: int, y: torch.Tensor) -> torch.Tensor | None:
        """What the next norm still adds after `layer`: its down projection's output, unless the GEMM added it."""
        return None if layer < 0 or self.fuses(self.w.layers[layer].down) else y

    def allocate(self, tokens: int, readouts: int) -> Buffers:
        gate_up = not self.fuses(self.w.layers[0].gate_up)  # every layer's gate_up has one shape
        return Buffers.allocate(self.cfg, tokens, readouts, self.w.dtype, self.att_dtype, self.w.device, gate_up)

    def layer(
        self, i: int, b: Buffers, meta: dict[str, torch.Tensor], last: bool, on_kv=None, prefix: Prefixes | None = None
    ) -> None:
        """One decoder layer. The residual adds happen in the o and down GEMMs where they fuse, else in the next
        norm (the previous layer's down projection in the first one). `prefix`: the prefix buffers to read (by
        default the slab's now)."""
        prefix_k, prefix_v = prefix if prefix is not None else self.prefix_buffers()
        cfg, lw = self.cfg, self.w.layers[i]
        eps = cfg.rms_norm_eps
        rows.rmsnorm(b.h, lw.input_norm, eps, b.x, self._pending(i - 1, b.y))
        self.linear(b.x, lw.qkv, b.qkv, lw.qkv_bias)
        rows.rope_kv(b.qkv, meta["positions"], self.cos, self.sin, b.q, b.k, b.v)
        if on_kv is not None:
            on_kv(i, b.k, b.v)
        tiles, count = (meta["readout_tiles"], meta["counts"][1:2]) if last else (meta["tiles"], meta["counts"][0:1])
        attn_kernels.tree_attention(
            b.q, b.k, b.v, prefix_k[i], prefix_v[i], b.attn, tiles, count, meta["ranges"], self.att
        )
        attn = b.attn.view(b.attn.shape[0], -1)  # [T, H D]
        if last:  # queries, MLP and head only at the readouts
            torch.index_select(attn, 0, meta["readouts"], out=b.attn_r)
            torch.index_select(b.h, 0, meta["readouts"], out=b.hr)
            rows.rmsnorm(b.hr, lw.post_norm, eps, b.xr, self.add_linear(b.attn_r, lw.o_proj, lw.o_bias, b.hr, b.yr))
            self.gate_up_swiglu(b.xr, lw.gate_up, lw.gate_up_bias, b.gate_up_r, b.act_r)
            self.add_linear(b.act_r, lw.down, lw.down_bias, b.hr, b.yr)
        else:
            rows.rmsnorm(b.h, lw.post_norm, eps, b.x, self.add_linear(attn, lw.o_proj, lw.o_bias, b.h, b.y))
            self.gate_up_swiglu(b.x, lw.gate_up, lw.gate_up_bias, b.gate_up, b.act)
            self.add_linear(b.act, lw.down, lw.down_bias, b.h, b.y)

    def head(self, b: Buffers) -> torch.Tensor:
        """All 16 readout columns from `b.letters`: rows past a forward's letters are zero, so their columns are 0
        and the letters' columns have the bits of a narrower readout; a graph then serves every letter set."""
        last_down = self._pending(self.cfg.num_hidden_layers - 1, b.yr)
        rows.rmsnorm(b.hr, self.w.norm, self.cfg.rms_norm_eps, b.xr, last_down)
        return rows.letter_readout(b.xr, b.letters, READOUT_LETTERS, b.logits)

    def forward(
        self, b: Buffers, meta: dict[str, torch.Tensor], on_kv=None, prefix: Prefixes | None = None
    ) -> Generator[None, None, torch.Tensor]:
        """Eager, layer by layer (yields after each, for the long lane); returns the device logits [R, 16]. The
        letters' LM-head rows must be in `b.letters`. `prefix`: the prefix buffers, taken at the start by default,
        so a pass paused while the slab grows reads the buffers its blob was planned for (the rows are the same)."""
        prefix = prefix if prefix is not None else self.prefix_buffers()
        torch.index_select(self.w.embed, 0, meta["tokens"], out=b.h)
        n_layers = self.cfg.num_hidden_layers
        for i in range(n_layers):
            self.layer(i, b, meta, last=i == n_layers - 1, on_kv=on_kv, prefix=prefix)
            yield
        return self.head(b)
