"""After a very large request, freed heap memory goes back to the system (glibc keeps it otherwise)."""

from __future__ import annotations

import sys

import pytest

from basal.core.memory import release_free_memory


def rss_mb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 >> 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_is_returned():
    large, small = [], []
    for i in range(3000):  # 190 MB in blocks under the mmap threshold, pinned apart by small survivors
        large.append(bytes(64000) + bytes([i % 256]))
        small.append(bytes(600) + bytes([i % 256]))
    del large
    held = rss_mb()
    assert release_free_memory()
    assert held - rss_mb() > 100, (held, rss_mb())
    assert len(small) == 3000
