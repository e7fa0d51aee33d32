"""CUDA graphs per (token bucket, readout bucket), captured lazily on a key's second use (docs/gpu-path.md §6).

The first use of a bucket runs eagerly (it compiles the Triton kernels and creates the cuBLAS handle); the second
captures the same code path over the same arena buffers and replays it; later uses replay. Graphs share one
memory pool and allocate nothing of their own, so an LRU cap is all the bookkeeping needed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

MAX_GRAPHS = 64


class GraphCache:
    """`step(key)` says what to do with a forward at `key`: "eager", "capture" or "replay"."""

    def __init__(self, max_graphs: int = MAX_GRAPHS):
        self.max_graphs = max_graphs
        self.uses: dict[Any, int] = {}
        self.graphs: OrderedDict[Any, Any] = OrderedDict()

    def step(self, key) -> str:
        if key in self.graphs:
            self.graphs.move_to_end(key)
            return "replay"
        self.uses[key] = self.uses.get(key, 0) + 1
        return "capture" if self.uses[key] >= 2 else "eager"

    def add(self, key, graph) -> None:
        self.graphs[key] = graph
        while len(self.graphs) > self.max_graphs:
            old, _ = self.graphs.popitem(last=False)
            self.uses.pop(old, None)

    def clear(self) -> None:
        """Forget every graph (the arena or the prefix buffers moved)."""
        self.graphs.clear()
        self.uses.clear()


def capture(run: Callable[[], None], pool, stream):
    """Capture `run` (the eager forward over the arena) into a CUDA graph on `stream`, sharing `pool`."""
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        run()
    return graph
