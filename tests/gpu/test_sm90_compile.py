"""Offline sm_90 compilation of the kernels with the pinned Triton (docs/gpu-path.md §8.1 b), specialised as a launch
specialises them: no GEMM spills, pipelined GEMM loads, shared memory within the limit, wgmma where BM >= 64.
`make test` compiles every shipped GEMM config of every dtype (plain, fused, with a bias) and one of each other
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


def _shipped_gemms():
    from bench.checks import sm90_compile as sc

    return sc.shipped_gemms()


def _check(case):
    from bench.checks import sm90_compile as sc

    usage = sc.compile_case(case)
    assert not sc.problems(case, usage), (case.label, usage)
    if case.kernel == "attention" and usage.stack:
        warnings.warn(f"attention {case.label} spills {usage.stack} B", stacklevel=1)
    return usage


def _fused_gemms():
    from bench.checks import sm90_compile as sc

    return sc.fused_gemms()


def test_shipped_gemm_configs_compile_for_sm90_without_spills():
    from bench.checks import sm90_compile as sc

    for tiles in _shipped_gemms():
        usage = _check(sc.gemm_case(tiles))
        assert usage.wgmma  # every shipped config has BM 64: warpgroup MMA
    for tiles, epilogue in _fused_gemms():  # the SwiGLU epilogue's second accumulator must not spill either
        assert _check(sc.gemm_case(tiles, epilogue=epilogue)).wgmma


def test_gemm_configs_with_a_bias_compile_for_sm90_without_spills():
    """basal-1.0 checkpoints: every shipped config, plain and fused, with the bias in its epilogue."""
    from bench.checks import sm90_compile as sc

    for tiles, epilogue in [(t, "none") for t in _shipped_gemms()] + _fused_gemms():
        assert _check(sc.gemm_case(tiles, epilogue=epilogue, bias=True)).wgmma


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_the_other_dtypes_gemms_compile_for_sm90_without_spills(dtype):
    """`basal serve --dtype bf16 | f32` runs these: bf16 the f16 tiles, f32 tf32x3 dots with gate_up at 64×32."""
    from bench.checks import sm90_compile as sc

    for case in sc.dtype_gemm_cases(dtype):
        assert _check(case).wgmma, case.label


def test_negative_control_the_f16_gate_up_tile_in_f32_spills():
    """Why f32 takes another gate_up tile: its fused SwiGLU at f16's 64×64 spills, and the check catches it."""
    from basal.backends.cuda.gpu.kernel_configs import gemm_tiles
    from bench.checks import sm90_compile as sc

    case = sc.gemm_case(gemm_tiles(17920, 1536, "f16"), "f32", epilogue="swiglu")
    assert any("spills" in p for p in sc.problems(case, sc.compile_case(case)))


def test_negative_control_a_gemm_compiled_without_the_launch_specialisation_is_caught():
    """Compiled with no argument known aligned (not what a launch runs), the GEMM's loads are not pipelined and
    it spills: the check must say so, which is why cases are compiled as the JIT specialises them."""
    from dataclasses import replace

    from bench.checks import sm90_compile as sc

    case = sc.gemm_case(_shipped_gemms()[-1])
    unspecialised = replace(case, unaligned=tuple(name for name, _ in case.signature))
    assert any("not pipelined" in p for p in sc.problems(unspecialised, sc.compile_case(unspecialised)))
    assert sc.compile_case(case).async_copies


def test_each_other_kernel_compiles_for_sm90():
    from basal.backends.cuda.gpu.kernel_configs import ATTENTION, MODEL_SHAPES
    from bench.checks import sm90_compile as sc

    h, f, _, q, kv = MODEL_SHAPES["4.5B"]
    usage = _check(sc.attention_case(ATTENTION["f32"], q, kv))
    assert usage.wgmma or usage.mma_sync  # tensor cores
    for case in sc.row_cases(h, f, q, kv):
        _check(case)


@pytest.mark.slow
def test_every_kernel_and_config_compiles_for_sm90():
    from bench.checks import sm90_compile as sc

    for case in sc.all_cases():
        _check(case)
