"""A running batch's input file is indexed, not held: the runner keeps each line's number, group and place, and
reads a chunk's lines again when it claims them, so its memory grows with the line count, not the file's bytes."""

from __future__ import annotations

import json
import tracemalloc

from basal.batch.service import BatchService, BatchSettings
from basal.batch.store import open_store


def test_the_runner_holds_an_index_of_its_input_not_its_bytes(tmp_path):
    """16 MB of input (8,000 lines of 2 KB, each state its own group): the runner keeps under 8 MB and peaks under
    12 MB while reading -- per line a LineAt with at most 272 bytes of group key (~400 B with its object: ~3 MB
    here), and while reading a 1 MiB block and a 16-byte digest per custom_id. Holding the parsed lines kept
    ~50 MB for this file."""
    store = open_store(tmp_path)
    svc = BatchService(store, BatchSettings(root=tmp_path))
    path = tmp_path / "input.jsonl"
    with open(path, "wb") as f:
        for n in range(8000):
            body = {"state": f"Ticket {n}: " + "x" * 2000, "questions": {"q": {"type": "noul", "instructions": "?"}}}
            f.write(json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/basal", "body": body}).encode())
            f.write(b"\n")
    assert path.stat().st_size > 16_000_000
    row = store.add_file(path, "input.jsonl", "batch", None, 8000)
    batch, _ = store.create_batch(row["id"], "/v1/basal", 86400, "24h", None, None, None, 1)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        source = svc._read_lines(batch)
        kept, peak = (m - before for m in tracemalloc.get_traced_memory())
    finally:
        tracemalloc.stop()
    assert kept < 8 << 20, f"the runner keeps {kept / 1e6:.1f} MB for a 16 MB input"
    assert peak < 12 << 20, f"reading a 16 MB input peaked at {peak / 1e6:.1f} MB"
    assert source is not None and len(source.lines) == 8000
    assert source.read(source.lines[-1:])[0].custom_id == "c7999"
    source.close()
    store.close()
