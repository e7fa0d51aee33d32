"""GEMM row chunks chosen per weight shape: the probe's bitwise checks (with a negative control), the choice,
the choices' bits against the 64-row reference, the disk cache and what the backend reports."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from basal.backends.cuda import ops as K
from basal.backends.cuda.backend import TorchBackend
from basal.backends.cuda.cpu import cpu_kernels
from basal.backends.cuda.cpu import gemm_chunks as G

W = torch.randn(96, 128, generator=torch.Generator().manual_seed(0))


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def test_the_library_gemm_passes_the_check():
    result = G.check_size(lambda c: torch.nn.functional.linear(c, W), 64, 128, torch.float32)
    assert result.invariant


def test_the_check_catches_a_shape_dependent_call():
    """Negative control: a call that skips the zero padding runs the lone anchor as a 1-row GEMM (its own class
    on torch CPU f32, docs/determinism.md §1), so the anchor's bits depend on the other rows."""

    def skips_padding(c: torch.Tensor) -> torch.Tensor:
        real = max(1, int((c.abs().sum(1) > 0).sum()))
        return torch.cat([torch.nn.functional.linear(c[:real], W), c.new_zeros(c.shape[0] - real, W.shape[0])])

    assert not G.check_size(skips_padding, 64, 128, torch.float32).invariant
    with pytest.raises(RuntimeError, match="no candidate"):
        G.choose([G.check_size(skips_padding, s, 128, torch.float32) for s in (16, 64)])


def _r(rows, seconds, bits=b"a", invariant=True):
    return G.SizeResult(rows, invariant, bits, seconds)


def test_choice_within_the_reference_class():
    # time per row: 16 -> 1/16, 64 -> 2/64, 256 -> 4/256 (fastest), 512 -> 9/512; 32 is in another class and
    # 128 is not invariant: neither may be used
    results = [_r(16, 1.0), _r(32, 1.0, b"b"), _r(64, 2.0), _r(256, 4.0), _r(512, 9.0), _r(128, 1.0, invariant=False)]
    assert G.choose(results) == G.ChunkSizes(256, (16, 64, 256), True)
    # 512 rows at 8.4 s is within 10% of 256's time per row: the larger size is taken
    results[4] = _r(512, 8.4)
    assert G.choose(results) == G.ChunkSizes(512, (16, 64, 256, 512), True)


def test_choice_weighs_padding_when_sizes_differ_in_bits():
    """No two sizes share a class: one fixed size, by expected time per useful row over EXPECTED_ROWS
    (16, 64, 256, 1024, 4096), padding counted as waste."""
    results = [_r(64, 1.0), _r(512, 4.0, b"b")]
    # cost(64)  = mean(ceil(n/64) * 1 / n)  = mean(1/16, 1/64, 4/256, 16/1024, 64/4096) = mean(.0625, 4 x .015625)
    # cost(512) = mean(ceil(n/512) * 4 / n) = mean(4/16, 4/64, 4/256, 8/1024, 32/4096)   = much more
    assert G.choose(results) == G.ChunkSizes(64, (64,), True)
    results = [_r(64, 1.0, invariant=False), _r(512, 4.0, b"b")]
    assert G.choose(results) == G.ChunkSizes(512, (512,), False)  # the only invariant size; bits differ from 64's


def test_a_busy_moment_does_not_pick_the_chunk_size():
    """On a shared machine a burst of load can slow every call of one size when sizes are timed one after the
    other; the round-robin probe spreads each size's calls over the whole probe, so the size that is really
    fastest per row (512 here: each call costs `rows` µs) still wins. A fake clock makes the burst exact."""
    now, calls = [0.0], [0]
    burst = range(8, 12)  # calls slowed tenfold: all four of the last size's calls when sizes run in sequence

    def fn(c: torch.Tensor) -> torch.Tensor:
        now[0] += c.shape[0] * 1e-6 * (10 if calls[0] in burst else 1) * (1 if c.shape[0] == 512 else 1.5)
        calls[0] += 1
        return torch.nn.functional.linear(c, W)

    def probe(sequential: bool) -> G.ChunkSizes:
        now[0], calls[0] = 0.0, 0
        if sequential:  # the probe before: four calls of one size, then the next size
            results = [
                G.check_sizes(fn, [s], 128, torch.float32, timing_rounds=0, clock=lambda: now[0])[0]
                for s in (8, 64, 512)
            ]
        else:
            results = G.check_sizes(fn, (8, 64, 512), 128, torch.float32, clock=lambda: now[0])
        return G.choose(results)

    assert probe(sequential=True).rows == 64  # the burst fooled the sequential probe
    assert probe(sequential=False) == G.ChunkSizes(512, (8, 64, 512), True)


def test_one_lucky_short_call_does_not_pick_the_chunk_size():
    """On a shared machine a short call sometimes lands in a quiet gap and runs several times faster than usual;
    a long one rarely does. Timing each size by its fastest call let that one lucky 64-row call beat the 512-row
    size that is faster per row in every other round; the median of each size's calls does not."""
    calls = {8: 0, 64: 0, 512: 0}
    now = [0.0]

    def fn(c: torch.Tensor) -> torch.Tensor:
        rows = c.shape[0]
        calls[rows] += 1
        lucky = rows == 64 and calls[rows] == 3  # one call of the 64-row size: five times faster than usual
        now[0] += rows * 1e-6 * (1.0 if rows == 512 else 1.5) * (0.2 if lucky else 1.0)
        return torch.nn.functional.linear(c, W)

    results = G.check_sizes(fn, (8, 64, 512), 128, torch.float32, clock=lambda: now[0])
    assert G.choose(results) == G.ChunkSizes(512, (8, 64, 512), True)


def test_calls_of_a_chunk_sizes():
    sizes = G.ChunkSizes(256, (16, 64, 256), True)
    assert sizes.calls(600) == [256, 256, 256]  # 88 rows left: the smallest tail that holds them is 256
    assert sizes.calls(520) == [256, 256, 16]
    assert sizes.calls(10) == [16] and sizes.calls(256) == [256] and sizes.calls(0) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_probed_chunk_sizes_give_the_reference_bits(dtype):
    """The probed sizes of a shape runs full chunks and tails of several sizes; every row's bits equal the
    64-row reference path, whatever the batch size."""
    w = W.to(dtype)
    probed = [G.check_size(lambda c: torch.nn.functional.linear(c, w), s, 128, dtype) for s in (8, 16, 64, 128)]
    # the same time per row for every size: which size wins is a matter of speed (timed on a shared machine, a
    # lucky 8-row call once won and left no tails to test); the bits under test are the probe's own
    sizes = G.choose([replace(r, seconds=r.rows * 1e-6) for r in probed])
    assert sizes.reference_bits and len(sizes.tails) > 1
    x = torch.randn(300, 128, generator=torch.Generator().manual_seed(1)).to(dtype)
    for n in (1, 5, 17, 64, 130, 300):
        assert _bits(K.linear(x[:n], w, None, sizes)) == _bits(K.linear(x[:n], w, None, K.ROWS)), n


def test_disk_cache_is_reused(tmp_path):
    first = G.ChunkTable(tmp_path / "chunks.json")
    sizes = first.for_weight(W)
    assert first.source[(96, 128, "float32", False)] == "probed" and (tmp_path / "chunks.json").is_file()
    second = G.ChunkTable(tmp_path / "chunks.json")
    assert second.for_weight(W) == sizes and second.source[(96, 128, "float32", False)] == "cached"
    (label, entry), *_ = second.describe([(W, None)]).items()
    assert label == "96x128 float32"
    assert entry == {"rows": sizes.rows, "tails": list(sizes.tails), "reference_bits": True, "cols": sizes.cols}


def test_column_spans():
    assert G.column_spans(96, 0) == [(0, 96)] and G.column_spans(96, 96) == [(0, 96)]
    assert G.column_spans(96, 40) == [(0, 40), (40, 80), (80, 96)]
    assert G.column_spans(96, 32) == [(0, 32), (32, 64), (64, 96)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_column_blocks_give_the_whole_width_bits(dtype, bias):
    """A sizes with column blocks (the last one narrower) gives every row the bits of the one-call path."""
    w = W.to(dtype)
    b = torch.randn(96, generator=torch.Generator().manual_seed(2)).to(dtype) if bias else None
    whole = G.ChunkSizes(64, (8, 16, 64), True)
    blocked = replace(whole, cols=40)
    x = torch.randn(300, 128, generator=torch.Generator().manual_seed(1)).to(dtype)
    for n in (1, 5, 17, 64, 130, 300):
        assert _bits(K.linear(x[:n], w, b, blocked)) == _bits(K.linear(x[:n], w, b, whole)), n


WIDE = torch.randn(1200, 64, generator=torch.Generator().manual_seed(3))  # wider than every column candidate


def _whole_bits(sizes: G.ChunkSizes, w: torch.Tensor = WIDE) -> dict[int, bytes]:
    sizes = sorted({sizes.rows, *sizes.tails})
    return {r.rows: r.bits for r in G.check_sizes(G._blocked_linear(w, None, 0), sizes, w.shape[1], w.dtype, 0)}


def _clocked(monkeypatch, seconds_per_call):
    """A fake clock that calls of `_blocked_linear` advance by `seconds_per_call(cols, rows)`."""
    now, real = [0.0], G._blocked_linear

    def blocked(weight, bias, cols):
        fn = real(weight, bias, cols)

        def timed(c):
            now[0] += seconds_per_call(cols, c.shape[0])
            return fn(c)

        return timed

    monkeypatch.setattr(G, "_blocked_linear", blocked)
    return lambda: now[0]


def test_the_probe_takes_the_fastest_column_block(monkeypatch):
    sizes = G.ChunkSizes(64, (8, 64), True)
    bits = _whole_bits(sizes)
    real = G._blocked_linear
    for seconds, cols in [
        ({0: 3.0, 1024: 1.0, 512: 1.5}, 1024),
        ({0: 3.0, 1024: 1.5, 512: 1.0}, 512),
        ({0: 3.0, 1024: 1.02, 512: 1.0}, 1024),  # within COLUMNS_NEAR_BEST: the fewest calls
        ({0: 1.0, 1024: 1.5, 512: 2.0}, 0),  # blocks slower: one call
    ]:
        monkeypatch.setattr(G, "_blocked_linear", real)
        clock = _clocked(monkeypatch, lambda c, rows, seconds=seconds: seconds[c])
        assert G.probe_columns(WIDE, None, sizes, bits, clock=clock) == replace(sizes, cols=cols), seconds


def test_the_probe_refuses_column_blocks_that_change_bits(monkeypatch):
    """Negative control: a block size whose calls round differently (here: its last block scaled by 1 + 2**-20)
    is never used, however fast: changed at every size, at the full size only or at a tail only."""
    sizes = G.ChunkSizes(64, (8, 64), True)
    bits = _whole_bits(sizes)
    real = G._blocked_linear

    def changes_bits(only_rows=None):
        def blocked(weight, bias, cols):
            fn = real(weight, bias, cols)

            def call(c):
                out = fn(c)
                if cols and (only_rows is None or c.shape[0] == only_rows):
                    out[:, -1] *= 1 + 2**-20
                return out

            return call

        return blocked

    fast_blocks = lambda cols, rows: 1.0 if cols else 3.0  # noqa: E731
    for only in (None, 64, 8):
        monkeypatch.setattr(G, "_blocked_linear", changes_bits(only))
        clock = _clocked(monkeypatch, fast_blocks)
        assert G.probe_columns(WIDE, None, sizes, bits, clock=clock) == sizes, only
    # the same blocks without the change are taken (the control: the test can tell the two apart)
    monkeypatch.setattr(G, "_blocked_linear", real)
    clock = _clocked(monkeypatch, fast_blocks)
    assert G.probe_columns(WIDE, None, sizes, bits, clock=clock).cols > 0


def test_chunk_sizes_cached_on_another_machine_is_probed_anew(monkeypatch, tmp_path):
    """The disk cache is trusted only under the key it was written with: another CPU's (or torch's, or thread
    count's, or basal release's) sizes, here one whose column blocks would change the bits, is probed again."""
    table = G.ChunkTable(tmp_path / "chunks.json")
    wrong = G.ChunkSizes(64, (8, 64), True, cols=7)
    monkeypatch.setattr(G, "machine_key", lambda: "another CPU")
    table._write((1200, 64, "float32", False), wrong)
    assert G.ChunkTable(tmp_path / "chunks.json").for_weight(WIDE) == wrong  # same key: used as it is
    monkeypatch.undo()
    fresh = G.ChunkTable(tmp_path / "chunks.json")
    assert fresh.for_weight(WIDE) != wrong and fresh.source[(1200, 64, "float32", False)] == "probed"
    monkeypatch.setattr(G.basal, "__version__", "9.9.9")
    again = G.ChunkTable(tmp_path / "chunks.json")
    assert again.for_weight(WIDE) != wrong and again.source[(1200, 64, "float32", False)] == "probed"


def test_the_machine_key_names_the_cpu_features():
    assert f"features {G._cpu_features()}|" in G.machine_key() and G._cpu_features() != "unknown"


def test_backend_reports_its_chunk_sizes(demo_model):
    described = TorchBackend.load(demo_model).describe()
    assert described["device"] == "cpu" and described["threads"] == torch.get_num_threads()
    assert described["cpu_kernels"] == cpu_kernels.kind() and described["cpu_kernels"] in {
        "compiled",
        "off",
        "unavailable",
    }
    cfg = demo_model.config
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    assert f"{2 * inter}x{hidden} float32" in described["gemm_chunks"]
    fixed = TorchBackend.load(demo_model, gemm_chunks="fixed").describe()
    assert fixed["gemm_chunks"].startswith("fixed 64 rows")


def test_models_endpoint_and_doctor_report_the_chunk_sizes(demo_model):
    from basal.doctor import chunk_lines
    from tests.servers import make_engines

    engines = make_engines(demo_model)
    info = engines.model_info(demo_model.name).compute
    assert info["backend"] == "torch" and isinstance(info["gemm_chunks"], dict) and info["gemm_chunks"]
    lines = chunk_lines(info)
    assert len(lines) == len(info["gemm_chunks"]) and all(" rows" in line for line in lines)
    blocked = {"17920x1536 float32": {"rows": 512, "tails": [8, 512], "reference_bits": True, "cols": 1024}}
    assert "512 rows in 1024-column blocks (tails 8-512" in chunk_lines({"gemm_chunks": blocked})[0]
