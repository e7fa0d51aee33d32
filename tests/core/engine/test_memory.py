"""After a very large request, freed heap memory goes back to the system (glibc keeps it otherwise).

The allocation runs in a fresh interpreter: in a process that has run other tests the heap has holes, the small
survivors may land in them instead of between the large blocks, and glibc then trims the freed blocks by itself,
so the measurement would depend on which tests ran before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]  # `python -c` imports basal from its working folder

PROBE = """
import sys
from basal.core.engine.memory import release_free_memory

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 >> 20

large, small = [], []
for i in range(3000):  # 190 MB in blocks under the mmap threshold, pinned apart by small survivors
    large.append(bytes(64000) + bytes([i % 256]))
    small.append(bytes(600) + bytes([i % 256]))
del large
held = rss_mb()
released = release_free_memory() if sys.argv[1] == "release" else False
print(held, rss_mb(), released, len(small))
"""


def run_probe(mode: str) -> tuple[int, int, str, str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    held, after, released, survivors = out.stdout.split()
    return int(held), int(after), released, survivors


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_is_returned():
    held, after, released, survivors = run_probe("release")
    assert released == "True" and survivors == "3000"
    assert held - after > 100, (held, after)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_negative_control_without_the_trim_the_heap_stays_held():
    held, after, _, _ = run_probe("keep")
    assert held > 150 and held - after < 20, (held, after)


def test_freezing_the_start_up_heap_turns_collections_on():
    """`basal serve` loads with collections off; the freeze after the load is where they come back."""
    import gc

    from basal.core.engine.memory import freeze_startup_heap

    gc.disable()
    try:
        assert freeze_startup_heap() > 0 and gc.isenabled()
    finally:
        gc.unfreeze()  # this test process goes on collecting everything
        gc.enable()
