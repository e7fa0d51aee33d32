"""Offline sm_90 (H100/H200) compilation of every kernel × shipped config, without a GPU (docs/gpu-path.md §8.1 b).

`triton.compile` with a `GPUTarget("cuda", 90, 32)` runs the whole pipeline down to a cubin using the ptxas Triton
bundles; the bundled `cuobjdump --dump-resource-usage` then reads registers, stack (spills) and shared memory. A
GEMM that spills, any kernel over the 227 KiB of shared memory an sm_90 block may use, a BM ≥ 64 GEMM without
wgmma, or a multi-stage GEMM whose loads are not asynchronous (not pipelined) fails the check; attention spills
are reported (they differ between Triton versions).

A kernel is compiled as the JIT specialises it at a launch: every pointer 16-byte aligned and every int a
multiple of 16 (`tt.divisibility`), except the arguments a case names as `unaligned` (a `do_not_specialize` M, a
pointer into the metadata blob at an odd offset). Without that, Triton cannot vectorise or pipeline the loads:
the GEMMs compiled single-buffered at ~255 registers and "spilled", a variant no launch ever runs.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SHARED_LIMIT = 227 * 1024
SM90 = ("cuda", 90, 32)


@dataclass(frozen=True)
class Case:
    kernel: str  # "gemm" | "attention" | "rmsnorm" | "rope_kv" | "swiglu" | "letter_readout"
    label: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, object], ...]
    warps: int
    stages: int = 1
    unaligned: tuple[str, ...] = ()  # arguments a launch may pass unaligned / not a multiple of 16


@dataclass(frozen=True)
class Usage:
    registers: int
    stack: int
    shared: int
    wgmma: bool
    mma_sync: bool
    async_copies: bool = False  # cp.async / TMA loads: the K loop is software-pipelined over its stages


def _sig(names: str, types: str) -> tuple[tuple[str, str], ...]:
    return tuple(zip(names.split(), types.split(), strict=True))


TRITON_TYPES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}


def gemm_case(tiles, dtype: str = "f16", epilogue: str = "none", bias: bool = False) -> Case:
    from basal.backends.cuda.gpu.kernel_configs import EPILOGUES

    names = "x_ptr w_ptr y_ptr r_ptr b_ptr M N K stride_xm stride_wn stride_ym stride_rm"
    sig = _sig(names, f"*{TRITON_TYPES[dtype]} " * 5 + "i32 " * 7)
    precision = "tf32x3" if dtype == "f32" else "ieee"  # triton_gemm.dot_precision
    consts = (("BM", tiles.bm), ("BN", tiles.bn), ("BK", tiles.bk), ("SPLIT_K", 1), ("PRECISION", precision))
    consts += (("EPILOGUE", EPILOGUES[epilogue]), ("HAS_BIAS", bias))
    label = f"{dtype} " + tiles.name + ("" if epilogue == "none" else f"+{epilogue}") + ("+bias" if bias else "")
    return Case("gemm", label, sig, consts, tiles.warps, tiles.stages, unaligned=("M",))  # do_not_specialize


def attention_case(cfg, heads: int, kv_heads: int, dim: int = 128, dtype: str = "f16") -> Case:
    """`dtype`: the compute dtype (V and the output; Q and K too in the f16 precision mode)."""
    vo = TRITON_TYPES[dtype]
    qk = "fp32" if cfg.precision == "f32" else vo
    names = "q_ptr k_ptr v_ptr pk_ptr pv_ptr out_ptr tiles_ptr count_ptr ranges_ptr stride_qt stride_kt stride_ot"
    sig = _sig(names + " scale_log2e", f"*{qk} *{qk} *{vo} *{qk} *{vo} *{vo} *i32 *i32 *i32 i32 i32 i32 fp32")
    group = heads // kv_heads
    consts = (
        ("G", group), ("NT", cfg.tokens_per_tile(group)), ("BM", cfg.bm), ("BN", cfg.bn), ("D", dim),
        ("KVH", kv_heads), ("N_RANGES", 9), ("PRECISION", "tf32x3" if qk == "fp32" else "ieee"),
        ("F32", qk == "fp32"), ("ANCHOR_AT_QUERY", False),
    )  # fmt: skip
    label = f"{dtype} {cfg.precision}-G{group}-KVH{kv_heads}"
    return Case("attention", label, sig, consts, cfg.warps, cfg.stages, unaligned=("count_ptr",))  # counts[1:2]


def row_cases(hidden: int, inter: int, heads: int, kv_heads: int, dim: int = 128) -> list[Case]:
    from basal.backends.cuda.gpu.kernel_configs import READOUT_CHUNK, READOUT_LETTERS, elementwise_block, norm_config

    norm = norm_config(hidden)
    slots = 1 << (heads + 2 * kv_heads - 1).bit_length()
    return [
        Case(
            "rmsnorm", f"H{hidden}",
            _sig("h_ptr y_ptr w_ptr x_ptr H eps stride_h stride_y stride_x", "*fp16 " * 4 + "i32 fp32 i32 i32 i32"),
            (("HAS_Y", True), ("BLOCK", norm.block)), norm.warps,
        ),
        Case(
            "rope_kv", f"H{heads}-KVH{kv_heads}",
            _sig("qkv_ptr pos_ptr cos_ptr sin_ptr q_ptr k_ptr v_ptr stride_qkv", "*fp16 *i32 *fp32 *fp32 *fp32 *fp32 *fp16 i32"),  # noqa: E501
            (("H", heads), ("KVH", kv_heads), ("D", dim), ("SLOTS", slots)), 4,
        ),
        Case(
            "swiglu", f"F{inter}", _sig("gu_ptr a_ptr F stride_gu stride_a", "*fp16 *fp16 i32 i32 i32"),
            (("BLOCK", elementwise_block(inter)),), 4,
        ),
        Case(
            "letter_readout", f"H{hidden}",
            _sig("x_ptr w_ptr out_ptr H L stride_x", "*fp16 *fp32 *fp32 i32 i32 i32"),
            (("BL", READOUT_LETTERS), ("CHUNK", READOUT_CHUNK)), 4,
        ),
    ]  # fmt: skip


KERNELS = ("gemm", "attention", "rmsnorm", "rope_kv", "swiglu", "letter_readout")


def shipped_gemms(dtype: str = "f16") -> list:
    """The GEMM tiles the model sizes ship in `dtype` (one per weight shape: qkv, o, gate_up, down)."""
    from basal.backends.cuda.gpu.kernel_configs import MODEL_SHAPES, gemm_tiles, weight_shapes

    weights = [w for h, f, _, q, kv in MODEL_SHAPES.values() for w in weight_shapes(h, f, q, kv).values()]
    return sorted({gemm_tiles(n, k, dtype) for n, k in weights}, key=lambda t: t.name)


def fused_gemms(dtype: str = "f16") -> list:
    """(tiles, epilogue) of every fused GEMM the sizes ship in `dtype` (kernel_configs.FUSED_EPILOGUES)."""
    from basal.backends.cuda.gpu.kernel_configs import FUSED_EPILOGUES, MODEL_SHAPES, gemm_tiles, weight_shapes

    cases = set()
    for h, f, _, q, kv in MODEL_SHAPES.values():
        weights = weight_shapes(h, f, q, kv)
        cases |= {(gemm_tiles(*weights[name], dtype), epilogue) for name, epilogue in FUSED_EPILOGUES.items()}
    return sorted(cases, key=lambda c: (c[0].name, c[1]))


def dtype_gemm_cases(dtype: str) -> list[Case]:
    """The GEMMs `dtype` ships: plain, fused and with a bias (what `basal serve --dtype` runs)."""
    plain = [(t, "none") for t in shipped_gemms(dtype)]
    return [gemm_case(t, dtype, epilogue, b) for t, epilogue in plain + fused_gemms(dtype) for b in (False, True)]


def all_cases() -> list[Case]:
    """Every kernel × config: the shipped GEMMs of every dtype plain, fused and with a bias, the f16 GEMM regime
    candidates, attention (both precisions, each compute dtype) and the row kernels at every model size."""
    from basal.backends.cuda.gpu.kernel_configs import ATTENTION, DTYPES, GEMM_REGIMES, MODEL_SHAPES

    candidates = {t for regime in GEMM_REGIMES.values() for t in regime} - set(shipped_gemms())
    cases = [gemm_case(t, bias=b) for t in sorted(candidates, key=lambda t: t.name) for b in (False, True)]
    cases += [case for dtype in DTYPES for case in dtype_gemm_cases(dtype)]
    for h, f, _, q, kv in MODEL_SHAPES.values():
        cases += [attention_case(ATTENTION["f32"], q, kv, dtype=dtype) for dtype in DTYPES]
        cases += [attention_case(ATTENTION["f16"], q, kv, dtype=dtype) for dtype in ("f16", "bf16")]
        cases += row_cases(h, f, q, kv)
    return cases


def kernel_function(name: str):
    from basal.backends.cuda.gpu import triton_attention, triton_gemm, triton_rowwise

    return {
        "gemm": triton_gemm.gemm_kernel,
        "attention": triton_attention.tree_attention_kernel,
        "rmsnorm": triton_rowwise.rmsnorm_kernel,
        "rope_kv": triton_rowwise.rope_kv_kernel,
        "swiglu": triton_rowwise.swiglu_kernel,
        "letter_readout": triton_rowwise.letter_readout_kernel,
    }[name]


def compile_case(case: Case) -> Usage:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = dict(case.constexprs)
    signature = {n: ("constexpr" if n in consts else t) for n, t in case.signature} | dict.fromkeys(consts, "constexpr")
    fn = kernel_function(case.kernel)
    attrs = {
        (fn.arg_names.index(name),): [["tt.divisibility", 16]]
        for name, kind in case.signature
        if name not in consts and name not in case.unaligned and (kind.startswith("*") or kind == "i32")
    }
    src = ASTSource(fn, signature, constexprs=consts, attrs=attrs)
    compiled = triton.compile(
        src, target=GPUTarget(*SM90), options={"num_warps": case.warps, "num_stages": case.stages}
    )
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        text = subprocess.run(
            [str(cuobjdump), "--dump-resource-usage", str(cubin)], capture_output=True, text=True, check=True
        ).stdout

    def field(name: str) -> int:
        found = re.search(rf"{name}:(\d+)", text)
        if not found:
            raise RuntimeError(f"cuobjdump printed no {name}: {text}")
        return int(found.group(1))

    ptx = compiled.asm["ptx"]
    shared = max(field("SHARED"), int(compiled.metadata.shared))
    return Usage(field("REG"), field("STACK"), shared, "wgmma" in ptx, "mma.sync" in ptx, "cp.async" in ptx)


def problems(case: Case, usage: Usage) -> list[str]:
    """What fails the check (warnings are not problems)."""
    out = []
    if usage.shared > SHARED_LIMIT:
        out.append(f"shared memory {usage.shared} B > {SHARED_LIMIT} B")
    if case.kernel == "gemm":
        if usage.stack > 0:
            out.append(f"GEMM spills ({usage.stack} B of stack)")
        if dict(case.constexprs)["BM"] >= 64 and not usage.wgmma:
            out.append("BM >= 64 GEMM without wgmma")
        if case.stages > 1 and not usage.async_copies:
            out.append(f"GEMM of {case.stages} stages without asynchronous copies (its loads are not pipelined)")
    return out
