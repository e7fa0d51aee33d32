"""Cached prefixes' K/V at stable addresses: one buffer per layer for K and one for V, entries as row ranges in them
(docs/gpu-path.md §4, docs/caches.md §2).

A forward reads its cached prefix (a template prefix, or a state cache entry: template and state) at `rows[key]`
of the layer's prefix buffers, through the chain ranges of its metadata blob; a CUDA graph holds the buffers'
addresses. So entries come and go inside the buffers: placing or dropping one moves nothing else and reallocates
nothing, and the captured graphs stay valid. Only three things change what a planned blob would read, and each
bumps `version` (the backend plans such a forward again, which is cheap host work):

- a placement into rows a dropped entry held (until then they still hold that entry's bits);
- a key placed again (a template prefix set anew);
- compaction: no free range is long enough, so entries slide down inside the buffers, in row order; an entry a
  forward in flight reads (`pinned`) stays where it is.

Where even compaction leaves no room the buffers grow (`generation` bumps: the backend drops its graphs). Without
rows reserved (`reserve`, the state cache off) they grow to exactly the rows of the template prefixes, the memory of
one buffer per layer holding them; with the state cache on they are sized once for its budget and grow, by a
quarter at least, only past it (a pass's new entries are placed before the cache evicts others).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from basal.backends.cuda.gpu.row_chunks import OFFSET_LIMIT

GROWTH = 4  # with rows reserved, a slab that must grow takes at least 1/GROWTH more rows


class PrefixSlab:
    """The prefix buffers of every layer: `k[i]`, `v[i]` [capacity (at least 1), KVH, D], entries `rows[key] = (first
    row, length)`."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, k_dtype, v_dtype, device):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.k_dtype, self.v_dtype, self.device = k_dtype, v_dtype, device
        self.capacity = 0
        self.reserved = False  # rows set aside for the state cache: growth takes slack
        self.rows: dict[str, tuple[int, int]] = {}
        self.version = 0  # bumps when a planned blob could read other bits at its rows
        self.generation = 0  # bumps when the buffers are reallocated (a graph holds the old addresses)
        self._freed = np.zeros(0, dtype=bool)  # rows a dropped entry held, not written since the last bump
        with torch.inference_mode():
            self.k, self.v = self._buffers(0)
        sizes = sum(torch.empty(0, dtype=dt).element_size() for dt in (k_dtype, v_dtype))
        self.row_bytes = layers * kv_heads * head_dim * sizes  # one token's K and V, every layer

    def _buffers(self, capacity: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        def z(dtype) -> torch.Tensor:
            return torch.zeros(max(capacity, 1), self.kv_heads, self.head_dim, dtype=dtype, device=self.device)

        return [z(self.k_dtype) for _ in range(self.layers)], [z(self.v_dtype) for _ in range(self.layers)]

    def nbytes(self, key: str) -> int:
        """The bytes an entry's rows hold (K and V, every layer); 0 if there is none."""
        return self.rows[key][1] * self.row_bytes if key in self.rows else 0

    @property
    def used_rows(self) -> int:
        return sum(n for _, n in self.rows.values())

    # -- changes --------------------------------------------------------------------------------------------------

    @torch.inference_mode()  # the buffers are written in inference mode, whoever calls
    def reserve(self, rows: int) -> None:
        """Room for `rows` more than the entries hold now (the state cache's budget), allocated now: before any graph
        is captured, so serving never grows the buffers unless the budget is passed."""
        self.reserved = True
        target = self.used_rows + rows
        if target > self.capacity:
            self._grow(target)

    @torch.inference_mode()
    def place(
        self,
        key: str,
        layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
        base: str | None = None,
        pinned: Iterable[str] = (),
    ) -> int:
        """Keep an entry: `base`'s rows (a cached prefix it extends), then `layers[i]` = (K, V) [n, KVH, D] of its
        further tokens at layer i. Replaces an entry of that key. `pinned`: entries forwards in flight read, which
        compaction must not move. -> the entry's bytes."""
        if len(layers) != self.layers:
            raise ValueError(f"an entry needs K/V for {self.layers} layers, got {len(layers)}")
        n_base = self.rows[base][1] if base is not None else 0
        n = n_base + layers[0][0].shape[0]
        replaced = self.rows.pop(key, None)
        if replaced is not None:
            self._freed[replaced[0] : replaced[0] + replaced[1]] = True
        first = self._alloc(n, {*pinned, *(() if base is None else (base,))})
        bump = replaced is not None or bool(self._freed[first : first + n].any())
        b0 = self.rows[base][0] if base is not None else 0  # pinned above: compaction left it where it was
        for i, (k, v) in enumerate(layers):
            if n_base:
                self.k[i][first : first + n_base].copy_(self.k[i][b0 : b0 + n_base])
                self.v[i][first : first + n_base].copy_(self.v[i][b0 : b0 + n_base])
            self.k[i][first + n_base : first + n].copy_(k)
            self.v[i][first + n_base : first + n].copy_(v)
        self.rows[key] = (first, n)
        if bump:
            self._bump()
        return n * self.row_bytes

    def drop(self, key: str) -> None:
        """Free an entry's rows (nothing if there is none). They keep its bits until another entry is placed there,
        so a blob planned before still reads the right keys: no bump here."""
        found = self.rows.pop(key, None)
        if found is not None:
            self._freed[found[0] : found[0] + found[1]] = True

    def _bump(self) -> None:
        self._freed[:] = False
        self.version += 1

    # -- where an entry goes ------------------------------------------------------------------------------------

    def _alloc(self, n: int, pinned: set[str]) -> int:
        """First fit over the free ranges; else compact, then first fit; else grow. -> the entry's first row."""
        first = self._first_fit(n, sorted(self.rows.values()))
        if first is None:
            self.compact(pinned)
            first = self._first_fit(n, sorted(self.rows.values()))
        if first is None:
            end = max((a + m for a, m in self.rows.values()), default=0)
            slack = self.capacity + self.capacity // GROWTH if self.reserved else 0
            self._grow(max(end + n, slack))
            first = end
        return first

    def _first_fit(self, n: int, taken: list[tuple[int, int]], limit: int | None = None) -> int | None:
        """The lowest row where `n` rows fit between the `taken` ranges (sorted) and before `limit` (the capacity)."""
        limit = self.capacity if limit is None else limit
        at = 0
        for a, m in taken:
            if a - at >= n and at + n <= limit:
                return at
            at = max(at, a + m)
        return at if at + n <= limit else None

    @torch.inference_mode()
    def compact(self, pinned: Iterable[str] = ()) -> None:
        """Slide every entry but the pinned ones down to the lowest rows where it fits, in row order, so the free rows
        gather at the end (between pinned entries where some stay). An entry never moves up: the rows below it are
        taken by entries placed before it or by pinned ones, so its own rows are always a place it fits."""
        pinned = set(pinned)
        fixed = sorted(r for key, r in self.rows.items() if key in pinned)
        movable = sorted((r, key) for key, r in self.rows.items() if key not in pinned)
        taken = list(fixed)
        moved = False
        for (start, n), key in movable:
            first = self._first_fit(n, taken, limit=start + n)
            assert first is not None and first <= start  # its own rows fit
            if first < start:
                for bufs in (self.k, self.v):
                    for buf in bufs:
                        buf[first : first + n].copy_(buf[start : start + n].clone())  # ranges may overlap
                self.rows[key] = (first, n)
                moved = True
            taken = sorted([*taken, (first, n)])
        if moved:
            self._bump()

    @torch.inference_mode()
    def _grow(self, capacity: int) -> None:
        """New buffers of `capacity` rows, every row where it was (a forward paused in flight reads the same rows)."""
        if capacity * self.kv_heads * self.head_dim >= OFFSET_LIMIT:  # the attention kernel's 32-bit offsets
            raise ValueError(
                f"cached prefixes of {capacity} tokens pass the attention kernel's 32-bit offsets; lower state_cache_mb"
            )
        k, v = self._buffers(capacity)
        keep = min(self.capacity, capacity)
        for new, old in zip([*k, *v], [*self.k, *self.v], strict=True):
            new[:keep].copy_(old[:keep])
        self.k, self.v, self.capacity = k, v, capacity
        self._freed = np.zeros(capacity, dtype=bool)
        self.generation += 1
        self.version += 1


class FillRows:
    """The `on_kv` hook of a pass that fills state cache entries (`PackedForward.fills`): each layer's K/V at the
    fills' rows, copied out right after the layer wrote them (its buffers are reused by the next layer), for
    `PrefixSlab.place` once the pass is done."""

    def __init__(self, fills: Sequence[tuple[str, str, np.ndarray]], device):
        self.fills = [(key, base, torch.from_numpy(rows.astype(np.int64)).to(device)) for key, base, rows in fills]
        self.kept: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in fills]

    def __call__(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        for kept, (_, _, rows) in zip(self.kept, self.fills, strict=True):
            if len(kept) != layer:
                raise RuntimeError(f"fill rows of layer {layer} after {len(kept)} layers; this is a bug")
            kept.append((k.index_select(0, rows), v.index_select(0, rows)))

    def entries(self) -> list[tuple[str, str, list[tuple[torch.Tensor, torch.Tensor]]]]:
        """(key, base, per layer (K, V) of the rows): what `place` keeps."""
        return [(key, base, kept) for (key, base, _), kept in zip(self.fills, self.kept, strict=True)]
