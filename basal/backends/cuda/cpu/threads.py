"""How many threads the torch CPU forward uses, and keeping the rest of the server off its cores (issue 16).

By default the forward uses one thread per *physical* core this process may run on: a second hyper-thread adds
little to a GEMM and takes the core from the event loop. The choice is process-wide (torch has one intra-op pool)
and is set once, before the first forward; the config (`threads`) or `basal serve --threads N` overrides it.

Two things keep the HTTP side from competing with the forward. OpenMP workers sleep as soon as a parallel region
ends instead of spinning for the next one (`OMP_WAIT_POLICY=PASSIVE`, set by `basal serve` before torch loads),
so the event loop gets a core between ops; and the tokenizer encodes on the calling planning thread instead of
fanning out over every core (`TOKENIZERS_PARALLELISM=false`). Both are only defaults: an environment that sets
them keeps its values.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SERVER_ENVIRONMENT = {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}


def physical_cores() -> int:
    """Distinct (package, core) pairs among the CPUs this process may use; the CPU count where Linux's topology
    files are missing."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text(), topo.joinpath("core_id").read_text()))
        except OSError:
            cores.add(("", str(cpu)))
    return max(1, len(cores))


def prepare_server_environment() -> None:
    """Defaults that must be in place before torch and the tokenizer start their thread pools."""
    for key, value in SERVER_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


_configured: int | None = None


def configure_threads(threads: int | None = None) -> int:
    """Set the forward's thread count once: `threads`, else OMP_NUM_THREADS if set, else the physical cores.
    A later call without a number keeps the first choice."""
    global _configured
    import torch

    if threads is None and _configured is not None:
        return _configured
    if threads is None:
        with contextlib.suppress(ValueError):
            threads = int(os.environ.get("OMP_NUM_THREADS", ""))
    n = threads if threads and threads > 0 else physical_cores()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    _configured = n
    return n
