"""The GPU path's prefix buffers in plain torch (no Triton): where entries go, what moves, what is counted, and when a
planned blob or a captured graph must learn of it (`prefix_slab.py`, docs/gpu-path.md §4)."""

from __future__ import annotations

import pytest
import torch

from basal.backends.cuda.gpu.prefix_slab import PrefixSlab

LAYERS, KVH, D = 2, 2, 4


def slab() -> PrefixSlab:
    return PrefixSlab(LAYERS, KVH, D, torch.float32, torch.float16, torch.device("cpu"))


def kv(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Distinct K/V of `n` tokens for every layer (the layer is in the values, so a mix-up of layers shows)."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, KVH, D, generator=g) + 10 * i, (torch.randn(n, KVH, D, generator=g) + 10 * i).half())
        for i in range(LAYERS)
    ]


def rows_of(s: PrefixSlab, key: str) -> list[tuple[bytes, bytes]]:
    first, n = s.rows[key]
    part = slice(first, first + n)
    return [(s.k[i][part].numpy().tobytes(), s.v[i][part].numpy().tobytes()) for i in range(LAYERS)]


def expected(*parts: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[bytes, bytes]]:
    return [
        (torch.cat([p[i][0] for p in parts]).numpy().tobytes(), torch.cat([p[i][1] for p in parts]).numpy().tobytes())
        for i in range(LAYERS)
    ]


def test_without_a_reservation_the_buffers_hold_exactly_the_template_prefixes():
    s = slab()
    assert s.k[0].shape[0] == 1 and s.capacity == 0  # the kernel needs a row to point at
    en, pl = kv(5, 1), kv(3, 2)
    assert s.place("en", en) == 5 * s.row_bytes
    s.place("pl", pl)
    assert s.capacity == 8 and s.k[1].shape == (8, KVH, D) and s.rows == {"en": (0, 5), "pl": (5, 3)}
    assert rows_of(s, "en") == expected(en) and rows_of(s, "pl") == expected(pl)
    assert s.row_bytes == LAYERS * KVH * D * (4 + 2) and s.nbytes("pl") == 3 * s.row_bytes and s.nbytes("x") == 0


def test_placing_and_dropping_inside_the_reservation_moves_no_buffer():
    s = slab()
    s.place("en", kv(4, 1))
    s.reserve(20)
    assert s.capacity == 24
    buffers, generation = [t.data_ptr() for t in (*s.k, *s.v)], s.generation
    version = s.version
    s.place("a", kv(6, 2), base="en")  # fresh rows: nothing planned could point there
    assert s.version == version
    s.drop("a")  # its rows keep its bits until reused: no bump either
    assert s.version == version and "a" not in s.rows
    s.place("b", kv(3, 3), base="en")  # into a's old rows: a plan made before could read them
    assert s.version == version + 1 and s.rows["b"] == (4, 7)
    s.place("en", kv(4, 1))  # a key set again
    assert s.version == version + 2
    assert [t.data_ptr() for t in (*s.k, *s.v)] == buffers and s.generation == generation


def test_an_entry_with_a_base_is_the_base_rows_then_its_own():
    s = slab()
    en, state, more = kv(4, 1), kv(5, 2), kv(2, 3)
    s.place("en", en)
    s.reserve(30)
    s.place("s1", state, base="en")
    s.place("s2", more, base="s1")
    assert rows_of(s, "s1") == expected(en, state)
    assert rows_of(s, "s2") == expected(en, state, more)
    assert s.nbytes("s2") == 11 * s.row_bytes


def two_gaps() -> tuple[PrefixSlab, dict]:
    """Room for 20 rows: entries b and d of 5 rows each, with the 5-row gaps a and c left before them."""
    s = slab()
    s.reserve(20)
    parts = {key: kv(5, seed) for seed, key in enumerate("abcd")}
    for key, part in parts.items():
        s.place(key, part)
    s.drop("a")
    s.drop("c")
    return s, parts


def test_compaction_gathers_the_free_rows_and_keeps_every_bit():
    """Two free ranges of 5 rows, an entry of 8: first fit fails, the entries slide down, it fits after them."""
    s, parts = two_gaps()
    buffers, version, generation = [t.data_ptr() for t in (*s.k, *s.v)], s.version, s.generation
    big = kv(8, 9)
    s.place("e", big)
    assert s.rows == {"b": (0, 5), "d": (5, 5), "e": (10, 8)}
    assert all(rows_of(s, key) == expected(parts[key]) for key in "bd") and rows_of(s, "e") == expected(big)
    assert s.version > version  # plans made before point at the old rows
    assert [t.data_ptr() for t in (*s.k, *s.v)] == buffers and s.generation == generation  # graphs stay valid


def test_compaction_leaves_the_entries_a_forward_reads_where_they_are():
    s, parts = two_gaps()
    s.place("e", kv(8, 9), pinned={"b"})  # b is read by a pass in flight: it stays at rows 5..9
    assert s.rows["b"] == (5, 5) and s.rows["d"] == (0, 5) and s.rows["e"] == (10, 8)
    assert all(rows_of(s, key) == expected(parts[key]) for key in "bd")


def test_growing_keeps_every_row_where_it_was_and_says_so():
    """Past the reservation (and compaction) the buffers grow, by a quarter at least: new addresses (`generation`:
    the backend drops its graphs), the same rows (a pass paused in flight still reads the right ones)."""
    s = slab()
    s.reserve(8)
    a = kv(6, 1)
    s.place("a", a)
    generation = s.generation
    s.place("b", kv(6, 2))
    assert s.generation == generation + 1 and s.capacity == 12 and s.rows["a"] == (0, 6)
    assert rows_of(s, "a") == expected(a)
    s.place("c", kv(1, 3))
    assert s.capacity == 15  # 12 + 12 // 4: one more entry does not reallocate again and again


def test_a_wrong_layer_count_is_refused():
    with pytest.raises(ValueError, match="2 layers"):
        slab().place("a", kv(3, 1)[:1])


def test_buffers_past_the_kernels_offsets_are_refused_with_the_key_to_lower():
    with pytest.raises(ValueError, match="lower state_cache_mb"):
        slab().reserve(2**31 // (KVH * D))


def test_compaction_bumps_the_version_only_when_it_moves_an_entry():
    s = slab()
    s.reserve(15)
    for seed, key in enumerate("abc"):
        s.place(key, kv(5, seed))
    s.drop("c")
    version = s.version
    s.compact()  # nothing below c's free rows to move into
    assert s.version == version and s.rows["b"] == (5, 5)
    s.drop("a")
    s.compact()  # b slides into a's rows: a plan made before reads b at rows 5..9
    assert s.rows["b"] == (0, 5) and s.version == version + 1
