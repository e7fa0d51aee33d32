"""`basal export` with the state cache on (hits, a partial hit, misses) and off: `basal compare --bitwise` passes,
single, batch and tree, torch and MLX in f32."""

from __future__ import annotations

import json

import pytest

from basal.core.packing import state_cache
from basal.export.api import compare_files, export_records
from tests.conftest import DATA
from tests.export.conftest import combos

REQUESTS = DATA / "state_cache_requests.jsonl"  # 7 requests on 3 states: repeats, a longer state, a repeated line
F32 = [c for c in combos() if c[2] == "f32"]


@pytest.mark.parametrize("combo", F32, ids=["-".join(c) for c in F32])
def test_export_with_the_state_cache_on_and_off_is_bitwise_identical(combo, demo_model, tmp_path, monkeypatch):
    backend, device, dtype = combo
    made: list[state_cache.StateCache] = []
    plain_init = state_cache.StateCache.__init__

    def recorded(self, *args, **kwargs):
        plain_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(state_cache.StateCache, "__init__", recorded)
    off = tmp_path / "off.jsonl"
    export_records(REQUESTS, off, demo_model, backend, dtype, device, "single")
    assert not made
    for batching in ("single", "batch", "tree"):
        on = tmp_path / f"on-{batching}.jsonl"
        export_records(REQUESTS, on, demo_model, backend, dtype, device, batching, state_cache_mb=64)
        result = compare_files(off, on, bitwise=True)
        assert result.ok, result.table()
        assert result.in_both == 7 and result.orders_bitwise == result.orders == 14 and result.answers == 7
    counts = made[0].counts  # single: one request after another
    assert counts.hits >= 3 and counts.partial_hits == 1 and counts.misses == 2


def test_export_of_evidence_requests_with_the_state_cache_on_and_off_is_bitwise_identical(
    demo_model, tmp_path, monkeypatch
):
    """The same requests asking for evidence: hits read the entries' hidden states, and the records (letter logits
    and answers, evidence spans included) compare `--bitwise` with the cache off."""
    made: list[state_cache.StateCache] = []
    plain_init = state_cache.StateCache.__init__
    monkeypatch.setattr(
        state_cache.StateCache, "__init__", lambda self, *a, **k: plain_init(self, *a, **k) or made.append(self)
    )
    lines = [json.loads(line) for line in REQUESTS.read_text().splitlines() if line]
    for line in lines:
        for question in line["request"]["questions"].values():
            question["evidence"] = True
    requests = tmp_path / "evidence.jsonl"
    requests.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    off, on = tmp_path / "off.jsonl", tmp_path / "on.jsonl"
    export_records(requests, off, demo_model, "torch", "f32", "cpu", "single")
    export_records(requests, on, demo_model, "torch", "f32", "cpu", "single", state_cache_mb=64)
    result = compare_files(off, on, bitwise=True)
    assert result.ok, result.table()
    assert result.in_both == 7 and result.answers == 7
    assert off.read_text().count('"evidence": [{') == on.read_text().count('"evidence": [{') > 0
    counts = made[0].counts
    assert counts.hits >= 3 and counts.partial_hits == 1 and counts.misses == 2
