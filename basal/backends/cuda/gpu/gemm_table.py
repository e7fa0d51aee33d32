"""Which GEMM each weight shape uses, decided by an on-device bitwise probe (docs/gpu-path.md §3.1, R5, R6, R10).

Candidates: `lt` (cuBLASLt through torch under the R7 settings: split-K off, 1 KiB workspace) and `tri` (our
fixed-order Triton GEMM). A shape may use a GEMM only after the probe showed, on this device, that every row's
bits are the same at every row count the process will pass (the buckets) and at another offset in its pass.
The fastest GEMM that passes wins (timed only where more than one passes). The table is keyed by GPU, driver,
library versions and dtype; a stored table whose key differs from the running process is stale and refused (the
probe then runs again). A model with biases (basal-1.0) is probed with them: a library's bias epilogue may be
another kernel.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from basal.core.home import cache_dir, write_text_atomic

log = logging.getLogger(__name__)

Gemm = Callable[..., torch.Tensor]  # (x, w, out, bias=None) -> out = x · wᵀ (+ bias)


def lt_linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """cuBLASLt; a bias goes into its epilogue (`addmm` with a 1-D bias), added before the rounding."""
    if bias is None:
        return torch.mm(x, w.t(), out=out)
    return torch.addmm(bias, x, w.t(), out=out)


def tri_linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    from basal.backends.cuda.gpu.triton_gemm import linear

    return linear(x, w, out, bias=bias)


def fused_gemm(epilogue: str) -> Gemm:
    """The `tri` GEMM with a fused epilogue, as a GEMM the probe runs: SwiGLU returns [M, N/2]; the residual
    add adds a constant row (elementwise, so a row's residual moves with the row)."""

    def run(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        from basal.backends.cuda.gpu.triton_gemm import linear

        if epilogue == "swiglu":
            return linear(x, w, epilogue="swiglu", bias=bias)
        residual = torch.full((x.shape[0], w.shape[0]), 0.5, dtype=x.dtype, device=x.device)
        return linear(x, w, out=residual, epilogue="residual", residual=residual, bias=bias)

    return run


GEMMS: dict[str, Gemm] = {"lt": lt_linear, "tri": tri_linear}
PREFERENCE = ("lt", "tri")  # on equal standing (no timing), the library first


@dataclass
class Candidate:
    invariant: bool
    ms: float | None = None  # at the timing row count, where measured (only where two or more are invariant)
    detail: str = ""


@dataclass
class ShapeEntry:
    n: int
    k: int
    gemm: str
    candidates: dict[str, Candidate] = field(default_factory=dict)
    fused: str = ""  # the epilogue this shape's `tri` GEMM carries, once probed invariant ("" none)
    fused_detail: str = ""
    bias: bool = False  # probed with a bias (basal-1.0 checkpoints): the GEMMs ran their bias epilogues


@dataclass
class GemmTable:
    key: dict[str, str]  # versions(device) + dtype
    row_counts: list[int]
    shapes: list[ShapeEntry]

    def gemm(self, n: int, k: int) -> str:
        for s in self.shapes:
            if (s.n, s.k) == (n, k):
                return s.gemm
        raise KeyError(f"GEMM shape {n}x{k} was not probed")

    def fused(self, n: int, k: int) -> str:
        return next((s.fused for s in self.shapes if (s.n, s.k) == (n, k)), "")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> GemmTable:
        raw = json.loads(text)
        shapes = [
            ShapeEntry(
                s["n"],
                s["k"],
                s["gemm"],
                {n: Candidate(**c) for n, c in s["candidates"].items()},
                s.get("fused", ""),
                s.get("fused_detail", ""),
                s.get("bias", False),
            )
            for s in raw["shapes"]
        ]
        return cls(raw["key"], raw["row_counts"], shapes)

    def save(self, path: Path) -> None:
        """Written whole or not at all: a temporary file of this call's own, then a rename (two servers starting
        at once each write theirs; the last rename wins, and no reader sees a torn file)."""
        write_text_atomic(path, self.to_json())


def table_path(dtype: str) -> Path:
    """Where the GPU path keeps the table it probed (basal doctor reads it)."""
    return cache_dir() / "gpu" / f"gemm_table-{dtype}.json"


def table_key(versions: dict[str, str], dtype: str) -> dict[str, str]:
    return {**versions, "dtype": dtype}


def load_table(path: Path, key: dict[str, str]) -> tuple[GemmTable | None, str]:
    """-> (table, why): None with the reason when the file is missing, unreadable or stale."""
    if not path.is_file():
        return None, "no table yet"
    try:
        table = GemmTable.from_json(path.read_text())
    except (ValueError, KeyError, TypeError) as e:
        return None, f"unreadable ({e})"
    changed = sorted(k for k in set(key) | set(table.key) if key.get(k) != table.key.get(k))
    if changed:
        return None, "stale: " + ", ".join(f"{k} {table.key.get(k)!r} -> {key.get(k)!r}" for k in changed)
    return table, "current"


def choose(candidates: dict[str, Candidate]) -> str:
    """The fastest invariant GEMM; without timings the preferred order; refuses when none is invariant."""
    ok = [name for name in PREFERENCE if name in candidates and candidates[name].invariant]
    if not ok:
        raise RuntimeError("no GEMM is bitwise invariant over the row counts for this shape on this device")
    timed = [n for n in ok if candidates[n].ms is not None]
    return min(timed, key=lambda n: candidates[n].ms) if timed else ok[0]


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of `t`'s rows, for a bitwise comparison on its device (-0.0 and NaN payloads count)."""
    return t.detach().contiguous().view(torch.uint8)


def probe_gemm(gemm: Gemm, x: torch.Tensor, w: torch.Tensor, row_counts: Sequence[int]) -> tuple[bool, str]:
    """Every row at every M against the same row computed at the largest M, and once more with the rows rotated, so
    every row also runs at another offset inside the library's tiles (a kernel whose bits depend on a row's position
    in its tile fails here, whichever rows that position holds). Compared on the device: no copies to the host."""
    m_max = max(row_counts)

    def run(rows: torch.Tensor) -> torch.Tensor:
        return gemm(rows, w, torch.empty(rows.shape[0], w.shape[0], dtype=x.dtype, device=x.device))

    reference = _as_bits(run(x[:m_max]))
    for m in sorted(row_counts):
        if not torch.equal(_as_bits(run(x[:m])), reference[:m]):
            return False, f"rows differ at M={m} from the same rows at M={m_max}"
        if m > 1:
            shift = 1 + 36 % (m - 1)  # in [1, m-1]: every row moves
            rotated = _as_bits(run(x[:m].roll(shift, 0)))
            if not torch.equal(rotated, reference[:m].roll(shift, 0)):
                return False, f"rows differ at M={m} when moved by {shift} rows"
    return True, f"every row equal at {len(row_counts)} row counts, in place and moved"


def probe_safely(gemm: Gemm, x: torch.Tensor, w: torch.Tensor, row_counts: Sequence[int]) -> tuple[bool, str]:
    """`probe_gemm`, with a GEMM that raises counted as not invariant (a library that refuses a shape under
    the R7 settings, say): another GEMM may still serve the shape, so a start must not die of it."""
    try:
        return probe_gemm(gemm, x, w, row_counts)
    except Exception as e:  # any library or compiler error rules the GEMM out, with its reason
        log.warning("GEMM probe failed on [%d, %d]: %s: %s", w.shape[0], w.shape[1], type(e).__name__, e)
        return False, f"raised {type(e).__name__}: {e}"[:500]


def weight_copies(w: torch.Tensor) -> list[torch.Tensor]:
    """`w` and enough copies of it to cover twice the L2 cache (at most 32), so timings cycle through them and
    small weights are read from memory, as in a forward, not from L2. On the CPU: `w` alone."""
    if not w.is_cuda:
        return [w]
    l2 = getattr(torch.cuda.get_device_properties(w.device), "L2_cache_size", 64 << 20)
    n = min(32, max(1, -(-2 * l2 // (w.numel() * w.element_size()))))
    return [w] + [w.clone() for _ in range(n - 1)]


def time_gemm(
    gemm: Gemm, x: torch.Tensor, w: torch.Tensor, rows: int, repeats: int = 20, copies: list | None = None
) -> float:
    """Median ms of `repeats` calls at `rows` (CUDA events on a GPU), cycling through copies of `w` (L2-cold).
    `copies`: `weight_copies(w)`, made once by a caller that times several row counts."""
    out = torch.empty(rows, w.shape[0], dtype=x.dtype, device=x.device)
    ws = copies or weight_copies(w)
    gemm(x[:rows], w, out)
    times = []
    for i in range(repeats):
        wi = ws[i % len(ws)]
        if x.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            gemm(x[:rows], wi, out)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            gemm(x[:rows], wi, out)
            times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def random_operands(
    m: int, n: int, k: int, dtype: torch.dtype, generator: torch.Generator, bias: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x [m, k], w [n, k] scaled by k^-1/2 and, with `bias`, b [n]: seeded normal values (never zeros), drawn on
    the generator's device. On a GPU that takes milliseconds; drawn on the host, the probe of a max-size model spent
    seconds per shape of its start (and of a GPU check's window) on random numbers."""
    device = generator.device

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device)

    x = normal(m, k).to(dtype)
    w = (normal(n, k) * k**-0.5).to(dtype)
    return x, w, (normal(n) * 0.1).to(dtype) if bias else None


def probe(
    shapes: Sequence[tuple[int, int]],
    dtype: torch.dtype,
    device: torch.device,
    row_counts: Sequence[int],
    key: dict[str, str],
    gemms: Sequence[str] = PREFERENCE,
    timing_rows: int | None = 128,
    epilogues: dict[tuple[int, int], str] | None = None,
    bias: bool = False,
) -> GemmTable:
    """Probe every candidate GEMM on every (N, K) with seeded random data (never zeros). `epilogues`: the
    fused epilogue a shape would carry on `tri`; where `tri` wins, the fused kernel is probed too, and the shape
    fuses only if it passes (otherwise its separate kernels run). `bias`: the model's GEMMs add a bias, so every
    GEMM is probed (and timed) with one: a library may pick another kernel for its bias epilogue."""
    g = torch.Generator(device=device).manual_seed(0)
    entries = []
    m_max = max(row_counts)
    for n, k in dict.fromkeys(shapes):
        x, w, b = random_operands(m_max, n, k, dtype, g, bias)

        def with_bias(gemm: Gemm, b: torch.Tensor | None = b) -> Gemm:
            return gemm if b is None else functools.partial(gemm, bias=b)

        candidates = {}
        for name in gemms:
            ok, detail = probe_safely(with_bias(GEMMS[name]), x, w, row_counts)
            candidates[name] = Candidate(ok, None, detail)
        invariant = [name for name, c in candidates.items() if c.invariant]
        if timing_rows and len(invariant) > 1:  # timed only where there is a choice to make
            for name in invariant:
                candidates[name].ms = time_gemm(with_bias(GEMMS[name]), x, w, min(timing_rows, m_max))
        entry = ShapeEntry(n, k, choose(candidates), candidates, bias=bias)
        epilogue = (epilogues or {}).get((n, k), "")
        if epilogue and entry.gemm == "tri":
            ok, entry.fused_detail = probe_safely(with_bias(fused_gemm(epilogue)), x, w, row_counts)
            entry.fused = epilogue if ok else ""
        entries.append(entry)
    return GemmTable(key, list(row_counts), entries)


def describe(table: GemmTable | None, why: str) -> list[str]:
    """Lines for `basal doctor`."""
    if table is None:
        return [f"  GEMM table: {why}"]
    lines = [f"  GEMM table ({why}; {table.key.get('gpu')}, {table.key.get('dtype')}):"]
    for s in table.shapes:
        measured = ", ".join(
            f"{n} {'invariant' if c.invariant else 'NOT invariant'}" + (f" {c.ms:.3f} ms" if c.ms is not None else "")
            for n, c in s.candidates.items()
        )
        fused = f"; fused {s.fused}" if s.fused else (f"; not fused: {s.fused_detail}" if s.fused_detail else "")
        lines.append(f"    {s.n:>6} x {s.k:<6}{' +bias' if s.bias else ''} -> {s.gemm:<4} ({measured}{fused})")
    return lines
