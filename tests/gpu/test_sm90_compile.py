"""Offline sm_90 compilation of the kernels with the pinned Triton (docs/gpu-path.md §8.1 b): no GEMM spills, shared
memory within the limit, wgmma where BM >= 64. `make test` compiles every shipped GEMM config and one of each other
kernel at 4.5B shapes; the whole matrix (every kernel × config × model shape) is marked slow. Triton caches
compiled kernels (~/.triton/cache), so reruns on the same machine take seconds."""

from __future__ import annotations

import importlib.util
import os
import warnings

import pytest

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed (Linux only)"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles need the real Triton frontend"),
]

SHAPES = {"mini": (1536, 8960, 12, 2), "4.5B": (2048, 11008, 16, 2), "max": (4096, 14336, 32, 8)}


def _shipped_gemms():
    from basal.backends.cuda.gpu.kernel_configs import gemm_tiles

    shapes = [s for h, f, q, kv in SHAPES.values() for s in (((q + 2 * kv) * 128, h), (h, q * 128), (2 * f, h), (h, f))]
    return sorted({gemm_tiles(n, k) for n, k in shapes}, key=lambda t: t.name)


def _all_cases():
    from basal.backends.cuda.gpu import sm90_compile as sc
    from basal.backends.cuda.gpu.kernel_configs import ATTENTION, GEMM_REGIMES

    cases = [sc.gemm_case(t) for regime in GEMM_REGIMES.values() for t in regime]
    for h, f, q, kv in SHAPES.values():
        cases += [sc.attention_case(cfg, q, kv) for cfg in ATTENTION.values()]
        cases += sc.row_cases(h, f, q, kv)
    return cases


def _check(case):
    from basal.backends.cuda.gpu import sm90_compile as sc

    usage = sc.compile_case(case)
    assert not sc.problems(case, usage), (case.label, usage)
    if case.kernel == "attention" and usage.stack:
        warnings.warn(f"attention {case.label} spills {usage.stack} B", stacklevel=1)
    return usage


def _fused_gemms():
    """(tiles, epilogue) of every fused GEMM the models ship: SwiGLU on gate_up, the residual add on o and down."""
    from basal.backends.cuda.gpu.kernel_configs import epilogue_tiles

    cases = set()
    for h, f, q, _kv in SHAPES.values():
        cases.add((epilogue_tiles(2 * f, h, "swiglu"), "swiglu"))
        cases |= {(epilogue_tiles(h, q * 128, "residual"), "residual"), (epilogue_tiles(h, f, "residual"), "residual")}
    return sorted(cases, key=lambda c: (c[0].name, c[1]))


def test_shipped_gemm_configs_compile_for_sm90_without_spills():
    from basal.backends.cuda.gpu import sm90_compile as sc

    for tiles in _shipped_gemms():
        usage = _check(sc.gemm_case(tiles))
        assert usage.wgmma  # every shipped config has BM 64: warpgroup MMA
    for tiles, epilogue in _fused_gemms():  # the SwiGLU epilogue's second accumulator must not spill either
        assert _check(sc.gemm_case(tiles, epilogue=epilogue)).wgmma


def test_each_other_kernel_compiles_for_sm90():
    from basal.backends.cuda.gpu import sm90_compile as sc
    from basal.backends.cuda.gpu.kernel_configs import ATTENTION

    h, f, q, kv = SHAPES["4.5B"]
    usage = _check(sc.attention_case(ATTENTION["f32"], q, kv))
    assert usage.wgmma or usage.mma_sync  # tensor cores
    for case in sc.row_cases(h, f, q, kv):
        _check(case)


@pytest.mark.slow
def test_every_kernel_and_config_compiles_for_sm90():
    for case in _all_cases():
        _check(case)
