"""The server process's heap: freed memory given back after a very large request, and the objects of start-up kept
out of the cycle collector's way.

glibc raises its mmap threshold after large blocks are freed, so the memory of one large request (a 16 MiB body,
its prompts and token ids) stays in the heap, and the process RSS stays high. `malloc_trim(0)` returns it.
Elsewhere (macOS, musl) this does nothing: their allocators return large blocks by themselves.

Python's cycle collector walks every tracked object in its oldest generation now and then: after start-up some
200 000 of them (the modules of torch, numpy, Litestar and the rest, the models, the app), which are never garbage.
Measured on the 2-core machine (`bench/lab/host_ceiling.py`), such a collection held the GIL, and with it the event
loop and every lane, for 130-150 ms every few thousand requests. `gc.freeze()` after start-up moves them into a
permanent generation that collections skip; what requests allocate is still collected as before.
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


def freeze_startup_heap() -> int:
    """Collect once, then leave every object alive now out of future collections (call when the server is loaded,
    before it serves), and turn collections on (a start may load with them off). -> the number of objects frozen."""
    gc.collect()
    gc.freeze()
    gc.enable()
    return gc.get_freeze_count()
