"""Compiled CPU kernels for tree attention's elementwise tile work (issue 16: attention without the Python tile
loop) and for SwiGLU, built from `cpu_kernels.c` on first use with the system C compiler and loaded with ctypes.

Between its two tile GEMMs, the torch code runs some forty small elementwise ops per span of key tiles (mask, max,
`det_exp_nonpositive`, the f32 recurrence stepped tile by tile in Python); the C code does each row's part in one
pass, with the same f32 operations in the same order, so the bits are the same — the tests compare both paths,
and a build with fused multiply-adds as the negative control. SwiGLU's dozen passes over the activation (det_exp,
the division, the dtype rounding, the product) become one. The GEMMs and the row sums stay torch calls (their
bits are the reference and depend on the library's blocking).

No compiler, a failed build or ``BASAL_CPU_KERNELS=0``: `load()` returns None and attention runs the torch ops
(same bits, slower); `status()` says which and why (`basal doctor` prints it). The library is cached under
``cache_dir()/native`` by a hash of the source, the flags, the compiler and the CPU (it is built for this CPU).
Threads: ctypes releases the GIL, so a span's rows are split among a small pool of Python threads, as many as
torch's intra-op threads.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch

from basal.core.home import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
# no -ffast-math, no contraction into fused multiply-adds: each f32 op rounds as torch's does. -fno-trapping-math
# only lets the compiler evaluate both sides of a select (FP exception flags, which nothing reads), so loops with
# clamps vectorise; it changes no result
FLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math", "-fPIC", "-shared", "-std=gnu11")
NATIVE_FLAGS = ("-march=native",)  # tried first; a compiler without it builds for the baseline ISA
ENV_SWITCH = "BASAL_CPU_KERNELS"

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "basal_exp_nonpositive": [_PTR, _PTR, _I64],
    "basal_exp": [_PTR, _PTR, _I64],
    "basal_swiglu": [_PTR, _PTR, _I64, _I64, _I64, _I64],
    "basal_softmax_span": [_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, *[_I64] * 11],
    "basal_recurrence_span": [_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, *[_I64] * 9],
    "basal_gather_kv": [_PTR, _PTR, _PTR, _PTR, _PTR, *[_I64] * 8],
    "basal_rope": [_PTR, _I64, _I64, _PTR, _PTR, _PTR, *[_I64] * 4],
}

_lock = threading.Lock()
_loaded: ctypes.CDLL | None = None
_status: str | None = None  # set once: the line `status()` returns
_kind = ""  # set with it: compiled, off or unavailable
_suspended = 0


def _cpu_signature() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        wanted = [line for line in lines if line.startswith(("model name", "flags", "Features"))][:2]
        return "\n".join(wanted) or platform.processor()
    except OSError:
        return platform.processor() or platform.machine()


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build(extra_flags: tuple[str, ...] = (), out_dir: Path | None = None) -> Path:
    """Compile the kernels (or find them cached) and return the library's path. `extra_flags` (tests only, e.g.
    a negative control built with fused multiply-adds) go into the cache key as well. Raises OSError or
    subprocess.CalledProcessError when there is no compiler or the build fails."""
    cc = _compiler()
    if cc is None:
        raise OSError("no C compiler (cc, gcc or clang) on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    source = SOURCE.read_bytes()
    out_dir = out_dir or cache_dir() / "native"
    cpu = _cpu_signature()
    errors = []
    for arch in (NATIVE_FLAGS, ()):
        flags = (*FLAGS, *arch, *extra_flags)
        key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), version.encode(), cpu.encode()]))
        target = out_dir / f"cpu_kernels-{key.hexdigest()[:16]}.so"
        if target.exists():
            return target
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
        os.close(fd)
        try:
            command = [cc, *flags, str(SOURCE), "-o", tmp, "-lm"]
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                os.replace(tmp, target)  # atomic: a concurrent build of the same key writes the same bytes
                return target
            errors.append(done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"])
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise OSError(f"{cc} could not build {SOURCE.name}: {errors}")


def open_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, None
    return lib


def load() -> ctypes.CDLL | None:
    """The compiled kernels, built on first call; None when unavailable, off, or `suspended()`."""
    return None if _suspended else _ensure()


def _ensure() -> ctypes.CDLL | None:
    global _loaded, _status, _kind
    if _status is not None:  # decided: every forward calls this, so no lock once it is
        return _loaded
    with _lock:
        if _status is None:
            if os.environ.get(ENV_SWITCH, "1") == "0":
                _kind, detail = "off", f"({ENV_SWITCH}=0): attention and SwiGLU run torch ops"
            else:
                try:
                    path = build()
                    _loaded = open_library(path)
                    _kind, detail = "compiled", f"({path})"
                except (OSError, subprocess.SubprocessError) as e:
                    _kind, detail = "unavailable", f"({e}); attention and SwiGLU run torch ops (same bits, slower)"
                    log.warning("compiled CPU kernels unavailable %s", detail)
            _status = f"{_kind} {detail}"
        return _loaded


@contextmanager
def suspended() -> Iterator[None]:
    """Run the torch ops instead of the compiled kernels inside the block (tests and benchmarks compare both)."""
    global _suspended
    _suspended += 1
    try:
        yield
    finally:
        _suspended -= 1


def status() -> str:
    """One line for `basal doctor`: compiled (and where), off, or unavailable and why."""
    _ensure()
    assert _status is not None
    return _status


def kind() -> str:
    """One word for /v1/models and exports: compiled, off or unavailable (same bits either way, other speed)."""
    _ensure()
    return _kind


def ptr(t: torch.Tensor) -> int:
    assert t.is_contiguous() and t.device.type == "cpu"
    return t.data_ptr()


_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _forget_pool_after_fork() -> None:
    """A forked child inherits the pool object but not its threads: work submitted there would never run."""
    global _pool, _pool_size
    _pool, _pool_size = None, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def run_rows(fn, args: tuple, rows: int, grain: int = 64) -> None:
    """Call `fn(*args, begin, end)` on [0, rows) split among torch's intra-op thread count, at least `grain` rows
    per thread: the calling thread takes the first part, pool threads the others."""
    global _pool, _pool_size
    n = max(1, min(torch.get_num_threads(), rows // grain or 1))
    if n == 1:
        fn(*args, 0, rows)
        return
    with _lock:  # the engines of several models may call at once; they share one pool
        if _pool is None or _pool_size < n:
            _pool, _pool_size = ThreadPoolExecutor(n - 1, thread_name_prefix="basal-cpu-kernels"), n
        pool = _pool
    bounds = [rows * i // n for i in range(n + 1)]
    futures = [pool.submit(fn, *args, bounds[i], bounds[i + 1]) for i in range(1, n)]
    fn(*args, bounds[0], bounds[1])
    for f in futures:
        f.result()
