"""Giving freed heap memory back to the system after a very large request.

glibc raises its mmap threshold after large blocks are freed, so the memory of one large request (a 16 MiB body,
its prompts and token ids) stays in the heap, and the process RSS stays high. `malloc_trim(0)` returns it.
Elsewhere (macOS, musl) this does nothing: their allocators return large blocks by themselves.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
import threading

_lock = threading.Lock()
_trim = None
if sys.platform.startswith("linux"):
    try:
        _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        _trim = None


def release_free_memory() -> bool:
    """Collect garbage and return free heap pages to the system; True where the allocator supports it."""
    if _trim is None:
        return False
    if not _lock.acquire(blocking=False):  # one trim at a time is enough
        return True
    try:
        gc.collect()
        _trim(0)
        return True
    finally:
        _lock.release()
