"""CUDA graphs per (token bucket, readout bucket), captured lazily on a key's second use (docs/gpu-path.md §6).

The first use of a bucket runs eagerly (it compiles the Triton kernels and creates the cuBLAS handle); the second
captures the same code path over the same arena buffers and replays it; later uses replay. Graphs share one
memory pool and allocate nothing of their own, so an LRU cap is all the bookkeeping needed. A capture that fails
stops capturing for the process: its forwards run eagerly, with the same bits (a graph replays the eager kernels).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

MAX_GRAPHS = 128  # above the 23 token x 5 readout buckets a graph can have: nothing is evicted while serving


class GraphCache:
    """`step(key)` says what to do with a forward at `key`: "eager", "capture" or "replay"."""

    def __init__(self, max_graphs: int = MAX_GRAPHS):
        self.max_graphs = max_graphs
        self.uses: dict[Any, int] = {}
        self.graphs: OrderedDict[Any, Any] = OrderedDict()
        self.capture_failed = ""  # why capturing stopped; "" while it goes on

    def step(self, key) -> str:
        if key in self.graphs:
            self.graphs.move_to_end(key)
            return "replay"
        if self.capture_failed:
            return "eager"
        self.uses[key] = self.uses.get(key, 0) + 1
        return "capture" if self.uses[key] >= 2 else "eager"

    def stop_capturing(self, why: str) -> None:
        """After a failed capture: the graphs captured so far still replay, every other bucket runs eagerly. A
        capture that failed once would fail again (CUDA or torch state), failing a forward at every try."""
        self.capture_failed = why

    def add(self, key, graph) -> None:
        self.graphs[key] = graph
        while len(self.graphs) > self.max_graphs:
            old, _ = self.graphs.popitem(last=False)
            self.uses.pop(old, None)

    def clear(self) -> None:
        """Forget every graph (the arena or the prefix buffers moved)."""
        self.graphs.clear()
        self.uses.clear()


class CudaCapture:
    """Captures a forward into a CUDA graph on a side stream; every graph shares one memory pool.

    The capture is thread-local: `basal serve` captures a new bucket on one lane's thread while another lane's
    thread may poll the event of a forward still in flight (`pacing.until_done`) or pin a one-off staging slot. In
    CUDA's default (global) mode such a call from any thread during a capture invalidates it, failing both
    forwards; thread-local mode forbids unsafe calls only on the capturing thread, which makes none.
    """

    MODE = "thread_local"

    def __init__(self, device):
        import torch

        self.device, self.pool, self.stream = device, torch.cuda.graph_pool_handle(), torch.cuda.Stream(device)

    def __call__(self, run: Callable[[], Any]):
        import torch

        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode=self.MODE):
                run()
        except BaseException:
            # torch.cuda.graph leaves its capture stream current when ending the capture raises: every later
            # kernel of this thread would run on a second stream, unordered with the first
            torch.cuda.set_stream(current)
            raise
        current.wait_stream(self.stream)
        return graph


class RerunGraph:
    """A stand-in graph for the CPU: `replay` runs the captured closure again. Like a CUDA graph it keeps what the
    capture saw (the closure's buffers and arguments), so a forward that gave a graph anything but the fixed
    buffers reads stale inputs here too; tests run the graph bookkeeping under the interpreter with it."""

    def __init__(self, run: Callable[[], Any]):
        self.run = run

    def replay(self) -> None:
        self.run()


def rerun_capture(run: Callable[[], Any]) -> RerunGraph:
    return RerunGraph(run)
