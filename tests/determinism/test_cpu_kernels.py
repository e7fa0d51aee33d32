"""The compiled CPU kernels (basal/backends/cuda/cpu/cpu_kernels.c) give the bits of the torch ops they replace:
det_exp and its non-positive variant, SwiGLU and RoPE on every dtype, tree attention on the
prefix-length and tree cases of test_attention_equality and across spans, and a model's logits. The negative
control: the same comparisons see a build that contracts multiply-adds into FMAs (the compiler's default on many
targets). Also: the switch, and a machine without a compiler falls back with a reason."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from basal.backends.cuda import ops as K
from basal.backends.cuda.cpu import cpu_kernels
from tests.determinism.test_attention_equality import CASES, CPU, _tree_case

LIB = cpu_kernels.load()
pytestmark = pytest.mark.skipif(LIB is None, reason=f"compiled CPU kernels: {cpu_kernels.status()}")


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32).numpy()


def _exp_inputs() -> torch.Tensor:
    """Random values over the whole range, every boundary of n = round(x log2 e), the clamps, specials."""
    g = torch.Generator().manual_seed(0)
    edges = torch.arange(-130, 131, dtype=torch.float32) * np.log(2) + 0.5 * np.log(2)
    near = torch.cat([edges + d for d in (-1e-5, 0.0, 1e-5)])
    special = torch.tensor([0.0, -0.0, -87.33654, -87.3365, -87.34, 88.72284, 88.7228, 88.73, -1e30, 1e30])
    special = torch.cat([special, torch.tensor([float("-inf"), float("inf")])])
    return torch.cat([torch.empty(300_000).uniform_(-100, 100, generator=g), near, special]).float()


def _c_exp(fn, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    fn(x.data_ptr(), out.data_ptr(), x.numel())
    return out


def test_exp_matches_det_exp_bit_for_bit():
    x = _exp_inputs()
    assert np.array_equal(_bits(_c_exp(LIB.basal_exp, x)), _bits(K.det_exp(x)))
    neg = -x.abs()
    assert np.array_equal(_bits(_c_exp(LIB.basal_exp_nonpositive, neg)), _bits(K.det_exp_nonpositive(neg)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_swiglu_matches_the_torch_ops(dtype):
    g = torch.Generator().manual_seed(1)
    gate_up = (torch.randn(37, 2 * 300, generator=g) * 6).to(dtype)
    gate_up[0, :8] = torch.tensor([-100.0, -90.0, -87.0, 0.0, 87.0, 89.0, 100.0, -0.0]).to(dtype)
    native = K.swiglu(gate_up)
    with cpu_kernels.suspended():
        ops = K.swiglu(gate_up)
    assert native.dtype == ops.dtype == dtype
    assert np.array_equal(_bits(native), _bits(ops))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rope_matches_the_torch_ops(dtype):
    """q and k as the model passes them: column slices of one q/k/v output (strided rows), in the model dtype."""
    heads, kv_heads, dim, n = 4, 2, 64, 70
    g = torch.Generator().manual_seed(3)
    qkv = (torch.randn(n, (heads + 2 * kv_heads) * dim, generator=g) * 3).to(dtype)
    qkv[0, :4] = torch.tensor([0.0, -0.0, 1e-30, -1e30]).to(dtype)
    cos, sin = K.rope_tables(512, dim, 10000.0)
    pos = torch.randint(0, 512, (n,), generator=g)
    q, k, _ = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    for x in (q.view(n, heads, dim), k.view(n, kv_heads, dim), q.contiguous().view(n, heads, dim)):
        native = K.apply_rope(x, cos[pos], sin[pos])
        with cpu_kernels.suspended():
            ops = K.apply_rope(x, cos[pos], sin[pos])
        assert native.dtype == ops.dtype == torch.float32
        assert np.array_equal(_bits(native), _bits(ops))


def _attention(q, k, v, layout, rows_of) -> torch.Tensor:
    return K.tree_attention(q, k, v, K.to_torch(layout, CPU), rows_of)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("rows", [K.QUERY_ROWS, 1])
def test_attention_matches_the_torch_ops(case, rows):
    block_len, parents = CASES[case]
    readouts = np.cumsum(block_len) - 1
    q, k, v, layout, rows_of = _tree_case(case, block_len, parents, rows, None if rows > 1 else readouts)
    native = _attention(q, k, v, layout, rows_of)
    with cpu_kernels.suspended():
        ops = _attention(q, k, v, layout, rows_of)
    assert np.array_equal(_bits(native), _bits(ops))


def test_attention_matches_across_spans(monkeypatch):
    q, k, v, layout, rows_of = _tree_case(9, [3 * K.KEY_TILE + 3, 20], [-1, 0], K.QUERY_ROWS)
    with cpu_kernels.suspended():
        ops = _attention(q, k, v, layout, rows_of)
    for budget in (1, 1_700_000, 1 << 40):  # spans of 1, a few and all 4 tiles
        monkeypatch.setattr(K, "ATTENTION_SPAN_BYTES", budget)
        assert np.array_equal(_bits(_attention(q, k, v, layout, rows_of)), _bits(ops)), budget


def test_attention_groups_end_at_their_padding_with_the_same_bits(monkeypatch):
    """Questions of many lengths on one state: the regrouped groups hold at most `GROUP_PADDING` padding rows,
    and every query keeps the bits of the grouping by tile count and `TILE_GROUP` alone (compiled and torch ops)."""
    lens = [K.KEY_TILE + 7, 1, 2, 3, 5, 9, 17, 17, 18, 20, 33, 40, 64, 64, 70, 130]
    q, k, v, layout, rows_of = _tree_case(11, lens, [-1, *[0] * (len(lens) - 1)], K.QUERY_ROWS)
    groups = K.to_torch(layout, CPU)
    for g in groups:
        padding = int((g.q_pos[:, : g.rows_used] < 0).sum())
        assert padding <= K.GROUP_PADDING * g.q_pos.shape[0] * g.rows_used, (g.q_pos.shape, g.rows_used)
    new = _attention(q, k, v, layout, rows_of)
    with cpu_kernels.suspended():
        new_ops = _attention(q, k, v, layout, rows_of)
    monkeypatch.setattr(K, "GROUP_PADDING", 1.0)  # no cut by padding: the groups before
    assert len(K.to_torch(layout, CPU)) < len(groups)
    old = _attention(q, k, v, layout, rows_of)
    with cpu_kernels.suspended():
        old_ops = _attention(q, k, v, layout, rows_of)
    for t in (new, new_ops, old_ops):
        assert np.array_equal(_bits(t), _bits(old))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_model_logits_match(demo_model, dtype):
    from tests.determinism.harness import Harness, same_bits

    h = Harness(demo_model, "torch", "cpu", dtype)
    import random

    rng = random.Random(11)
    qs = [h.question(rng, "pl", state_words=40, k=3)]
    qs += [h.question(rng, "pl", state=qs[0].state, k=k) for k in (2, 7)]
    native = h.logits(qs)
    with cpu_kernels.suspended():
        ops = h.logits(qs)
    assert all(same_bits(a, b) for a, b in zip(native, ops, strict=True))


def _fma_build(tmp_path: Path) -> ctypes.CDLL:
    if "fma" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no FMA instructions to contract into")
    return cpu_kernels.open_library(cpu_kernels.build(("-ffp-contract=fast",), out_dir=tmp_path))


def test_negative_control_a_build_with_fused_multiply_adds_is_caught(tmp_path):
    """-ffp-contract=fast (with -march=native) fuses p * r + c in the polynomial and x * cos + r * sin in RoPE:
    the comparisons above must see it, in exp, in attention and in RoPE."""
    lib = _fma_build(tmp_path)
    x = _exp_inputs()
    assert not np.array_equal(_bits(_c_exp(lib.basal_exp, x)), _bits(K.det_exp(x)))
    block_len, parents = CASES[3]
    q, k, v, layout, rows_of = _tree_case(4, block_len, parents, K.QUERY_ROWS)
    with cpu_kernels.suspended():
        ops = _attention(q, k, v, layout, rows_of)
    x = torch.randn(64, 4, 128, generator=torch.Generator().manual_seed(4)) * 3
    cos, sin = K.rope_tables(64, 128, 10000.0)
    with cpu_kernels.suspended():
        rope_ops = K.apply_rope(x, cos, sin)
    saved = cpu_kernels._loaded
    try:
        cpu_kernels._loaded = lib
        assert not np.array_equal(_bits(_attention(q, k, v, layout, rows_of)), _bits(ops))
        assert not np.array_equal(_bits(K.apply_rope(x, cos, sin)), _bits(rope_ops))
    finally:
        cpu_kernels._loaded = saved


def _status_in_subprocess(env: dict[str, str]) -> str:
    code = "from basal.backends.cuda.cpu import cpu_kernels as c; print(c.load() is None); print(c.status())"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), **env}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_switch_off_and_no_compiler_fall_back_with_a_reason(tmp_path):
    assert _status_in_subprocess({"BASAL_CPU_KERNELS": "0"}).startswith("True\noff (BASAL_CPU_KERNELS=0)")
    missing = _status_in_subprocess({"CC": str(tmp_path / "no-such-cc"), "BASAL_HOME": str(tmp_path)})
    assert missing.startswith("True\nunavailable (") and "no-such-cc" in missing


def test_a_forked_child_runs_the_kernels_on_its_own_threads():
    """The pool's threads do not survive fork(); the child must not wait on them forever."""
    gate_up = torch.randn(512, 2 * 64)
    expected = K.swiglu(gate_up)  # creates the pool here (512 rows: more than one thread)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: same computation, report whether it matched, exit without pytest's teardown
        signal.alarm(30)  # a child stuck on the parent's threads dies instead of hanging the suite
        ok = np.array_equal(_bits(K.swiglu(gate_up)), _bits(expected))
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1" and os.waitstatus_to_exitcode(status) == 0
