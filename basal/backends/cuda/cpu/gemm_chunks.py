"""GEMM row-chunk sizes per weight shape, chosen by a short probe at load (issue 16, docs/determinism.md §1).

Batch invariance needs every GEMM call to have a shape whose per-row arithmetic does not depend on the other rows
(§0, §6a). The 64-row chunk of the first version is such a shape, but it runs at half to two-thirds of the rate
the same library reaches on 256–512 rows. So, per weight shape, the probe calls the library on candidate row
counts and keeps those that pass two bitwise checks:

- **invariant**: an anchor row gives the same bits alone (zero padding), first, in the middle and last among
  random rows — the check the determinism suite makes;
- **same class as the reference** (64 rows, the numerics basal has always had): the anchor's bits equal the
  reference chunk's. On torch 2.13 CPU f32 every M >= 4 is one class (§6), so a forward can run its full chunks at
  the fastest size and its tail at a smaller one, with no padding waste and bits identical to the 64-row path.

The chunk sizes: full chunks of `rows` (the largest class member within 10% of the lowest time per row), the tail
zero-padded to the smallest class member that holds it. If no other size shares the reference's class (another
library), the sizes are a single fixed size, picked by the lowest expected time per useful row over `EXPECTED_ROWS` —
padding counted as wasted work: cost(R) = mean over n of ceil(n / R) * t(R) / n.

Column blocks: once the rows are chosen, the probe also times the chosen size with the weight split into blocks of
`COLUMN_CANDIDATES` output columns (one library call per block, each writing its columns of the output). A wide
weight (the MLP's gate/up projection, 17,920 columns on the mini shapes) ran 8-23% faster in 1,024- or 512-column
blocks on the 2026 development machines, whose caches do not hold a whole row chunk's output. A block size is used
only where every size of the choice gives the whole-width call's bits with it.

Which size is fastest only changes speed, never bits, when the chosen sizes share the reference's class; the
`describe()` dict says whether they do (`reference_bits`). Results are kept once per process (one choice per shape
and dtype) and cached on disk keyed by CPU model and features, torch version, thread count, basal's version, dtype
and shape: a restart on the same machine uses the cached choice as it is (probing or re-checking a real model's
choices costs seconds of GEMMs at every start); another machine, torch, thread count or basal release probes anew.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

import basal

REFERENCE_ROWS = 64  # the chunk of basal's first CPU path; its bits are the reference
CANDIDATE_ROWS = (8, 16, 32, 64, 128, 256, 512)
EXPECTED_ROWS = (16, 64, 256, 1024, 4096)  # rows a GEMM sees per forward (readouts .. a long document)
NEAR_BEST = 1.1  # sizes within 10% of the fastest time per row count as equally fast; the largest is taken
PROBE_VERSION = 4  # in the disk cache key: choices timed by an older probe are timed again
TIMING_ROUNDS = 2  # round-robin calls of every size after the four bitwise checks, for timing only
COLUMN_CANDIDATES = (1024, 512)  # output columns per library call, tried on weights wider than the block
COLUMNS_NEAR_BEST = 1.03  # blocks within 3% of the fastest count as equally fast; the fewest calls are taken


@dataclass(frozen=True)
class ChunkSizes:
    """Full chunks of `rows` rows, the tail zero-padded to the smallest of `tails` that holds it."""

    rows: int
    tails: tuple[int, ...]  # ascending, all <= rows, all in the same bit class as `rows`
    reference_bits: bool  # the sizes share the 64-row reference's class: bits equal basal's reference path
    cols: int = 0  # output columns per library call; 0: the whole weight in one call

    def calls(self, n: int) -> list[int]:
        """Row count of each call for `n` rows (the last one may be padded)."""
        full, rest = divmod(n, self.rows)
        out = [self.rows] * full
        if rest:
            out.append(next(t for t in self.tails if t >= rest))
        return out


FIXED = ChunkSizes(REFERENCE_ROWS, (REFERENCE_ROWS,), True)  # no probe: the first version's 64-row chunks


@dataclass(frozen=True)
class SizeResult:
    rows: int
    invariant: bool
    bits: bytes  # the anchor row's result
    seconds: float  # median call of this size (over every round of the probe)


def column_spans(n: int, cols: int) -> list[tuple[int, int]]:
    """The [start, end) output columns of each call for a weight of `n` output columns in blocks of `cols`."""
    if cols <= 0 or cols >= n:
        return [(0, n)]
    return [(s, min(s + cols, n)) for s in range(0, n, cols)]


def linear_into(
    c: torch.Tensor, w_t: torch.Tensor, b: torch.Tensor | None, spans: Sequence[tuple[int, int]], out: torch.Tensor
) -> None:
    """`out = c @ w_t (+ b)` by column blocks, each library call writing its columns of `out` (`mm`/`addmm` with
    `out=`: the kernels `F.linear` calls on 2-D inputs). The forward and the probe both run this, so the probe
    checks the forward's own calls."""
    for start, end in spans:
        part = w_t if end - start == w_t.shape[1] else w_t[:, start:end]
        dest = out if end - start == out.shape[1] else out[:, start:end]
        if b is None:
            torch.mm(c, part, out=dest)
        else:
            torch.addmm(b[start:end], c, part, out=dest)


def _blocked_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, cols: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """`F.linear(c, weight, bias)` as the forward runs it with `cols`-column blocks (0: one call)."""
    w_t, spans = weight.t(), column_spans(weight.shape[0], cols)

    def fn(c: torch.Tensor) -> torch.Tensor:
        out = c.new_empty(c.shape[0], weight.shape[0])
        linear_into(c, w_t, bias, spans, out)
        return out

    return fn


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).cpu().numpy().tobytes()


def check_size(
    fn: Callable[[torch.Tensor], torch.Tensor], rows: int, width: int, dtype: torch.dtype, seed: int = 0
) -> SizeResult:
    """Call `fn` on [rows, width] chunks: the anchor alone (zero padding), then first, middle and last among random
    rows. Invariant if all four anchor results have the same bits."""
    return check_sizes(fn, [rows], width, dtype, seed)[0]


def _size_calls(rows: int, width: int, dtype: torch.dtype, seed: int) -> list[tuple[torch.Tensor, int]]:
    """The four (chunk, anchor position) calls of one size's bitwise check."""
    g = torch.Generator().manual_seed(seed)
    anchor = torch.randn(1, width, generator=g).to(dtype)
    calls = [(torch.cat([anchor, anchor.new_zeros(rows - 1, width)]), 0)]
    for i, pos in enumerate(sorted({0, rows // 2, rows - 1})):
        others = torch.randn(rows - 1, width, generator=torch.Generator().manual_seed(seed + 1 + i)).to(dtype)
        calls.append((torch.cat([others[:pos], anchor, others[pos:]]), pos))
    return calls


def check_sizes(
    fn: Callable[[torch.Tensor], torch.Tensor],
    sizes: Sequence[int],
    width: int,
    dtype: torch.dtype,
    seed: int = 0,
    timing_rounds: int = TIMING_ROUNDS,
    clock: Callable[[], float] = time.perf_counter,
) -> list[SizeResult]:
    """`check_size` for several sizes, round-robin: round k makes the k-th call of every size before any size's
    next one, and `timing_rounds` more rounds repeat the last call for timing only, so every size has calls
    spread over the whole probe: a busy moment on a shared machine slows one call of each size instead of every
    call of one size (which once made a 32-row chunk "fastest"). Each size's time is the median of its calls,
    not the fastest: on a shared machine a short call fits into a quiet gap more often than a long one, so the
    fastest calls favoured small chunks (a 64-row o-projection "fastest" at a third of the 512-row rate)."""
    return check_cases([(fn, s) for s in sizes], width, dtype, seed, timing_rounds, clock)


def check_cases(
    cases: Sequence[tuple[Callable[[torch.Tensor], torch.Tensor], int]],
    width: int,
    dtype: torch.dtype,
    seed: int = 0,
    timing_rounds: int = TIMING_ROUNDS,
    clock: Callable[[], float] = time.perf_counter,
) -> list[SizeResult]:
    """`check_sizes` over (function, rows) cases: the same bitwise checks and round-robin timing, for comparing
    ways of computing one size as well as sizes."""
    calls = {rows: _size_calls(rows, width, dtype, seed) for _, rows in cases}
    results: list[list[bytes]] = [[] for _ in cases]
    times: list[list[float]] = [[] for _ in cases]
    for k in range(4 + timing_rounds):
        for i, (fn, rows) in enumerate(cases):
            chunk, pos = calls[rows][min(k, 3)]
            t = clock()
            out = fn(chunk)
            if k > 0:  # the first call of a case also pays for its warm-up
                times[i].append(clock() - t)
            if k < 4:
                results[i].append(_bits(out[pos]))
    return [
        SizeResult(rows, len(set(results[i])) == 1, results[i][0], statistics.median(times[i]))
        for i, (_, rows) in enumerate(cases)
    ]


def choose(results: Sequence[SizeResult], reference: int = REFERENCE_ROWS) -> ChunkSizes:
    """The chunk sizes from probe results (see the module docstring)."""
    ok = {r.rows: r for r in results if r.invariant}
    ref = ok.get(reference)
    if ref is not None:
        same = sorted(s for s, r in ok.items() if r.bits == ref.bits)
        if len(same) > 1:
            best = min(ok[s].seconds / s for s in same)
            # the largest size within NEAR_BEST of the fastest per row: one lucky short call on a busy machine
            # must not pick a tiny chunk (bits are the same either way; only speed is at stake)
            rows = max(s for s in same if ok[s].seconds / s <= NEAR_BEST * best)
            return ChunkSizes(rows, tuple(s for s in same if s <= rows), True)
    if not ok:
        raise RuntimeError(
            "no candidate GEMM row count is batch-invariant on this machine; basal cannot guarantee bitwise "
            "identical answers here (report the output of `basal doctor`)"
        )

    def cost(s: int) -> float:  # expected seconds per useful row, padding counted as waste
        return sum(-(-n // s) * ok[s].seconds / n for n in EXPECTED_ROWS) / len(EXPECTED_ROWS)

    rows = min(ok, key=lambda s: (cost(s), s))
    ref_bits = ref is not None and ok[rows].bits == ref.bits
    return ChunkSizes(rows, (rows,), ref_bits)


def probe_linear(
    weight: torch.Tensor, bias: torch.Tensor | None = None, candidates: Sequence[int] = CANDIDATE_ROWS
) -> ChunkSizes:
    """Probe `F.linear(x, weight, bias)` at each candidate row count (about 6 * sum(candidates) rows of GEMM), then
    column blocks at the chosen one (`probe_columns`)."""
    with torch.inference_mode():
        results = check_sizes(_blocked_linear(weight, bias, 0), candidates, weight.shape[1], weight.dtype)
        sizes = choose(results)
        return probe_columns(weight, bias, sizes, {r.rows: r.bits for r in results})


def probe_columns(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    sizes: ChunkSizes,
    whole_bits: dict[int, bytes],
    clock: Callable[[], float] = time.perf_counter,
) -> ChunkSizes:
    """`sizes` with the fastest column block (`COLUMN_CANDIDATES`) whose calls give the whole-width bits at every
    size of the choice (`whole_bits`: the anchor's bits per size, one call per weight); unchanged if none is faster."""
    n, width = weight.shape
    blocks = [c for c in COLUMN_CANDIDATES if c < n]
    if not blocks:
        return sizes
    variants = [0, *blocks]
    cases = [(_blocked_linear(weight, bias, c), sizes.rows) for c in variants]
    timed = check_cases(cases, width, weight.dtype, clock=clock)
    ok = {
        c: r.seconds for c, r in zip(variants, timed, strict=True) if r.invariant and r.bits == whole_bits[sizes.rows]
    }
    if 0 not in ok or len(ok) == 1:
        return sizes
    best = min(ok.values())
    # the widest block within COLUMNS_NEAR_BEST of the fastest: fewer calls where the difference is noise
    cols = max(ok, key=lambda c: (ok[c] <= COLUMNS_NEAR_BEST * best, c == 0, c))
    if cols == 0:
        return sizes
    tails = [s for s in sizes.tails if s != sizes.rows]
    checked = check_sizes(_blocked_linear(weight, bias, cols), tails, width, weight.dtype, timing_rounds=0)
    if all(r.invariant and r.bits == whole_bits[r.rows] for r in checked):
        return replace(sizes, cols=cols)
    return sizes


@functools.cache
def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@functools.cache
def _cpu_features() -> str:
    """A short hash of the CPU's feature flags: one model name can come with fewer features (a VM that hides AVX-512),
    and the library picks its kernels by them."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return hashlib.sha256(" ".join(sorted(line.split(":", 1)[1].split())).encode()).hexdigest()[:12]
    return "unknown"


def machine_key() -> str:
    """What a probe result depends on besides the shape: CPU model and features, torch and its BLAS, threads."""
    return (
        f"{_cpu_model()}|features {_cpu_features()}|torch {torch.__version__}|threads {torch.get_num_threads()}"
        f"|{platform.machine()}"
    )


class ChunkTable:
    """One choice of chunk sizes per (shape, dtype) for this process, kept on disk between processes (None: no disk
    cache)."""

    def __init__(self, cache_file: Path | None):
        self.cache_file = cache_file
        self.sizes: dict[tuple[int, int, str, bool], ChunkSizes] = {}  # (N, K, dtype, has bias) -> chunk sizes
        self.source: dict[tuple[int, int, str, bool], str] = {}  # "probed" | "cached"
        self._lock = threading.Lock()

    def for_weight(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> ChunkSizes:
        key = (weight.shape[0], weight.shape[1], str(weight.dtype).removeprefix("torch."), bias is not None)
        with self._lock:
            if key not in self.sizes:
                self.sizes[key], self.source[key] = self._load_or_probe(key, weight, bias)
            return self.sizes[key]

    def _disk_key(self, key: tuple[int, int, str, bool]) -> str:
        text = f"{machine_key()}|{key}|probe {PROBE_VERSION}|basal {basal.__version__}"
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def _read(self) -> dict:
        if self.cache_file is None:
            return {}
        try:
            return json.loads(self.cache_file.read_text())
        except (OSError, ValueError):
            return {}

    def _load_or_probe(self, key, weight, bias) -> tuple[ChunkSizes, str]:
        cached = self._read().get(self._disk_key(key))
        if cached:
            sizes = ChunkSizes(cached["rows"], tuple(cached["tails"]), cached["reference_bits"], cached.get("cols", 0))
            return sizes, "cached"
        sizes = probe_linear(weight, bias)
        self._write(key, sizes)
        return sizes, "probed"

    def _write(self, key, sizes: ChunkSizes) -> None:
        if self.cache_file is None:
            return
        data = self._read()
        data[self._disk_key(key)] = {**asdict(sizes), "shape": list(key), "machine": machine_key()}
        with contextlib.suppress(OSError):
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_file.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(self.cache_file)

    def describe(self, weights: Sequence[tuple[torch.Tensor, torch.Tensor | None]]) -> dict[str, dict[str, object]]:
        """`{"NxK dtype[+bias]": {"rows", "tails", "reference_bits", "cols"}}` (weight [N, K]) of the given GEMMs, for
        doctor, /v1/models and exports: only what the machine decides, so two runs on one machine describe alike
        (whether a choice was probed or read from the cache is in `source`)."""
        out = {}
        for w, b in weights:
            sizes = self.for_weight(w, b)
            key = (w.shape[0], w.shape[1], str(w.dtype).removeprefix("torch."), b is not None)
            label = f"{key[0]}x{key[1]} {key[2]}{'+bias' if b is not None else ''}"
            out[label] = {**asdict(sizes), "tails": list(sizes.tails)}
        return out


_TABLE: ChunkTable | None = None


def process_table() -> ChunkTable:
    """The process's table (disk cache in the basal cache folder, or $BASAL_GEMM_CACHE; "off": none)."""
    global _TABLE
    if _TABLE is None:
        from basal.core.home import cache_dir

        where = os.environ.get("BASAL_GEMM_CACHE")
        path = None if where == "off" else Path(where) if where else cache_dir() / "gemm_chunks.json"
        _TABLE = ChunkTable(path)
    return _TABLE
