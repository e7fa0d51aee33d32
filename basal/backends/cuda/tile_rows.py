"""Whether attention's tile GEMMs may skip a query chunk's padding rows (issue 16), probed once per shape.

The attention layout gives every query chunk `QUERY_ROWS` rows, and the two tile GEMMs (scores = q k^T, then p v)
ran on all of them, padding included — on 25 questions over one state 43% of the rows were padding — because a row's
bits may depend on how many rows the call has. On torch's CPU GEMMs they do not, from a few rows up
(docs/determinism.md §1), but that is the library's choice, not a promise: so for the model's shapes the probe runs
both GEMMs, shaped and batched as `kernels.tree_attention_steps` calls them, with every used-row count U = 1..R, and
keeps the counts whose rows have the bits of the full R-row call. A chunk with such a U computes U rows only; any
other U keeps the full shape. Same bits either way; the result is fixed for the process (cached per shape, device
and thread count), and `describe()` reports it. On the CPU it is also kept on disk (`tile_rows.json` in the basal
cache folder, keyed like the GEMM chunks by CPU model and features, torch build and threads; none when
$BASAL_GEMM_CACHE is "off"): the probe is a few hundred GEMMs, seconds at every start otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path

import torch

from basal.backends.cuda.cpu.gemm_chunks import machine_key
from basal.core.home import cache_dir, write_text_atomic
from basal.core.model.model_dir import LlamaConfig
from basal.core.packing.attention_layout import KEY_TILE, QUERY_ROWS

PROBE_BATCHES = ((1, 1), (2, 3), (4, 2))  # (chunks, tiles per span) of the probe's calls
PROBE_VERSION = 1  # in the disk cache key: results of an older probe are probed again


@functools.cache
def invariant_rows(group: int, dim: int, kv_heads: int, rows: int, tile: int, device: str, threads: int) -> frozenset:
    """The used-row counts U in 1..rows at which both tile GEMMs give each row the bits of the full `rows` call.
    `threads`: torch's intra-op thread count (part of the key: a GEMM may split its work by it)."""
    args = (group, dim, kv_heads, rows, tile, device, threads)
    cache, key = _disk(args) if torch.device(device).type == "cpu" else (None, "")
    known = _read(cache).get(key)
    if known is not None:
        return frozenset(known)
    ok = frozenset(_probe(group, dim, kv_heads, rows, tile, torch.device(device), torch.matmul))
    if cache is not None:
        with contextlib.suppress(OSError):  # a read-only cache folder: probed again at the next start
            write_text_atomic(cache, json.dumps({**_read(cache), key: sorted(ok)}, indent=1))
    return ok


def _disk(args: tuple) -> tuple[Path | None, str]:
    """The cache file (None: no disk cache) and the entry's key: the machine, torch's build, the probe's shape."""
    path = None if os.environ.get("BASAL_GEMM_CACHE") == "off" else cache_dir() / "tile_rows.json"
    return path, hashlib.sha256(f"{machine_key()}|{args}|tile probe {PROBE_VERSION}".encode()).hexdigest()[:24]


def _read(path: Path | None) -> dict:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _probe(group: int, dim: int, kv_heads: int, rows: int, tile: int, device: torch.device, matmul) -> set[int]:
    g = torch.Generator(device="cpu").manual_seed(0)
    ok = set(range(1, rows + 1))
    for chunks, span in PROBE_BATCHES:
        q = torch.randn(chunks, kv_heads, group, rows, dim, generator=g).to(device)
        k = torch.randn(chunks, kv_heads, span, dim, tile, generator=g).to(device)
        p = torch.rand(chunks, kv_heads, span, group, rows, tile, generator=g).to(device)
        v = torch.randn(chunks, kv_heads, span, tile, dim, generator=g).to(device)
        full_s = matmul(q.reshape(chunks, kv_heads, group * rows, dim)[:, :, None], k)
        full_s = full_s.view(chunks, kv_heads, span, group, rows, tile)
        full_pv = matmul(p.view(chunks, kv_heads, span, group * rows, tile), v)
        full_pv = full_pv.view(chunks, kv_heads, span, group, rows, dim)
        for used in sorted(ok):
            if used == rows:
                continue
            qs = q[:, :, :, :used].reshape(chunks, kv_heads, group * used, dim)
            s = matmul(qs[:, :, None], k).view(chunks, kv_heads, span, group, used, tile)
            ps = p[..., :used, :].reshape(chunks, kv_heads, span, group * used, tile)
            pv = matmul(ps, v).view(chunks, kv_heads, span, group, used, dim)
            if not (_same(s, full_s[..., :used, :]) and _same(pv, full_pv[..., :used, :])):
                ok.discard(used)
    return ok


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(a.contiguous().view(torch.int32).equal(b.contiguous().view(torch.int32)))


def for_model(cfg: LlamaConfig, device: torch.device | str) -> frozenset:
    """The probe for a model's attention shape and the layout's query chunk (run at load, so no request waits)."""
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    args = (group, cfg.head_dim, cfg.num_key_value_heads, QUERY_ROWS, KEY_TILE, str(device), torch.get_num_threads())
    return invariant_rows(*args)


def describe(cfg: LlamaConfig, device: torch.device | str) -> str:
    """One line for `basal doctor` and /v1/models."""
    ok = for_model(cfg, device)
    if len(ok) == QUERY_ROWS:
        return f"used rows only (every count 1..{QUERY_ROWS} keeps the full call's bits)"
    if len(ok) <= 1:
        return f"full {QUERY_ROWS}-row chunks (fewer rows change the bits here)"
    return f"used rows where that keeps the bits ({len(ok)} of {QUERY_ROWS} counts; the others run all rows)"
