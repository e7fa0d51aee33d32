"""Fixed kernel configurations per model shape (docs/gpu-path.md §3). Plain Python: read by the kernels' launchers,
the offline compile check and gpu_check.py.

A configuration is part of the numerics: Triton's `tl.sum` order follows the register layout, which follows the
tile shape and warp count, so these are constants per (shape, dtype) and never chosen from the forward (R2, R6).
`gemm_tiles` is the one configuration the invariant path ships per weight shape; `GEMM_REGIMES` are the
candidates the H200 run compares (they may be mixed only where the device probe proves equal bits).
"""

from __future__ import annotations

from dataclasses import dataclass

BK = 64  # GEMM K step, everywhere (R1)
READOUT_LETTERS = 16  # letter logits per readout row, padded with a mask
READOUT_CHUNK = 512  # hidden elements per step of the letter readout
EPILOGUES = {"none": 0, "residual": 1, "swiglu": 2}  # the `tri` GEMM's fused epilogues (triton_gemm.py)
FUSED_EPILOGUES = {"o_proj": "residual", "gate_up": "swiglu", "down": "residual"}  # what each `tri` GEMM carries

# (hidden, intermediate, layers, heads, kv heads) of the basal sizes, head dim 128 (docs/gpu-path.md §1)
MODEL_SHAPES = {"mini": (1536, 8960, 32, 12, 2), "4.5B": (2048, 11008, 60, 16, 2), "max": (4096, 14336, 50, 32, 8)}


def weight_shapes(hidden: int, inter: int, heads: int, kv: int, head_dim: int = 128) -> dict[str, tuple[int, int]]:
    """[N, K] of a layer's GEMM weights, q/k/v and gate/up fused, by their names in `DeviceLayer`."""
    return {
        "qkv": ((heads + 2 * kv) * head_dim, hidden),
        "o_proj": (hidden, heads * head_dim),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
    }


@dataclass(frozen=True)
class GemmTiles:
    bm: int
    bn: int
    warps: int
    stages: int
    bk: int = BK

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}-w{self.warps}-s{self.stages}"


# Candidates per M regime (§3.1's table); the H200 run (gpu_check.py P1) says which of them agree bitwise.
GEMM_REGIMES = {
    "S": (GemmTiles(64, 64, 4, 4), GemmTiles(64, 32, 4, 5), GemmTiles(64, 16, 4, 5)),
    "M": (GemmTiles(128, 64, 4, 4),),
    "L": (GemmTiles(128, 128, 8, 3),),
}


DTYPES = ("f16", "bf16", "f32")  # the GPU path's compute dtypes (f32: the reference mode, tf32x3 dots)


def gemm_tiles(n: int, k: int, dtype: str = "f16") -> GemmTiles:
    """The shipped configuration of weight shape [N, K] in `dtype`: the small-M regime, because single decisions
    (M ≈ 128) are bandwidth-bound and no split-K may raise their CTA count. In f32 the fused SwiGLU's two tf32x3
    accumulators do not fit a 64×64 tile's registers (offline sm_90: 255 registers, 16-24 B spilled), so gate_up
    takes 64×32 there (189 registers, none spilled)."""
    if n >= 17920:  # gate_up: 560-896 CTAs at M = 128
        return GemmTiles(64, 32, 4, 5) if dtype == "f32" else GemmTiles(64, 64, 4, 4)
    if n >= 6144:  # max qkv
        return GemmTiles(64, 64, 4, 4)
    if n <= 1536 and k in (1536, 8960):  # mini o and down: BN 16 keeps >= 96 CTAs
        return GemmTiles(64, 16, 4, 5)
    return GemmTiles(64, 32, 4, 5)


@dataclass(frozen=True)
class AttentionConfig:
    bm: int  # query rows per tile: tokens_per_tile × GQA group
    bn: int  # keys per logical tile, anchored at position 0
    warps: int
    stages: int
    precision: str  # "f32": Q, K f32 and tf32x3 dots; "f16": Q, K, P in the compute dtype

    def tokens_per_tile(self, group: int) -> int:
        if group > self.bm:
            raise ValueError(f"GQA group {group} > {self.bm} query rows per tile")
        return self.bm // group


ATTENTION = {
    "f32": AttentionConfig(64, 32, 4, 2, "f32"),
    "f16": AttentionConfig(64, 64, 4, 2, "f16"),
}


@dataclass(frozen=True)
class RowConfig:
    block: int  # power of two >= the row length
    warps: int


def norm_config(hidden: int) -> RowConfig:
    block = 1 << max(hidden - 1, 1).bit_length()
    return RowConfig(block, 8 if block >= 4096 else 4)


def elementwise_block(width: int) -> int:
    """Columns per program of SwiGLU and friends (any fixed value is invariant, R4)."""
    return min(1024, 1 << max(width - 1, 1).bit_length())
