"""GpuBackend: the torch backend's path on CUDA (it also runs under the Triton interpreter on the CPU, for tests).

Per forward: lay out the tiles (numpy, in core), pack the metadata blob into a free staging slot, one H2D copy, the
forward — a CUDA graph replay for buckets seen before, eager layers otherwise — a non-blocking D2H copy of the
letter logits into the slot and an event; `run()` yields `QUEUED` (the pipeline queues the pass's next forward
behind it) and then yields while the event is pending. The GEMM of every weight shape comes from the
startup probe (gemm_table).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from tqdm import tqdm

from basal.backends.cuda.gpu import gemm_table as gt
from basal.backends.cuda.gpu.buckets import (
    LT_CHUNK,
    WARM_TOKENS,
    layout_for,
    probed_row_counts,
    warm_buckets,
)
from basal.backends.cuda.gpu.environment import apply_invariant_settings, device_stack
from basal.backends.cuda.gpu.graphs import CudaCapture, GraphCache
from basal.backends.cuda.gpu.kernel_configs import ATTENTION, FUSED_EPILOGUES, READOUT_LETTERS
from basal.backends.cuda.gpu.model import Buffers, GpuLlama
from basal.backends.cuda.gpu.pacing import paced, until_done
from basal.backends.cuda.gpu.prefix_slab import FillRows
from basal.backends.cuda.gpu.readback import DoneEvent, StagingSlots
from basal.backends.cuda.gpu.weights_direct import DeviceWeights
from basal.backends.cuda.model import TORCH_DTYPE, head_logsumexp, inference_steps
from basal.core.model.model_dir import ModelDir
from basal.core.packing.passes import QUEUED, Queued, run_to_end
from basal.core.packing.tile_layout import BlobLayout, lay_out_tiles, pack_blob
from basal.core.packing.tree import PackedForward, continuation_forward, single_prompt_forward

log = logging.getLogger(__name__)
GRAPH_MAX_TOKENS = 8192  # the arena's size: main-lane forwards up to this run as graphs, longer ones eagerly
READOUT_CAP = 1024


def keep_table(table: gt.GemmTable, path) -> bool:
    """Save the probed table for `basal doctor`. Serving does not need it, so a read-only home must not stop a
    start: a failure is a warning."""
    try:
        table.save(path)
        return True
    except OSError as e:
        log.warning("GEMM table not saved (%s): basal doctor will not show it; set BASAL_HOME", e)
        return False


@dataclass(frozen=True)
class Prepared:
    """A forward's tile layout packed into its metadata blob, on the host (`GpuBackend.prepare`)."""

    layout: BlobLayout
    blob: np.ndarray  # int32 [layout.size]
    prefix_version: int  # the template prefixes it was planned against


class GpuBackend:
    name = "torch"
    reads_hidden_states = True
    caches_states = True  # entries are row ranges of fixed prefix buffers (prefix_slab.py): graphs stay valid

    def __init__(
        self,
        model: ModelDir,
        dtype: str,
        device: torch.device,
        attention: str = "f32",
        arena_tokens: int = GRAPH_MAX_TOKENS,
        graphs: bool | None = None,
        progress: bool = True,
        weights: DeviceWeights | None = None,
        capture=None,
        fuse_epilogues: bool = True,
    ):
        """`weights`: already on the device (gpu_check.py's synthetic shapes); otherwise loaded from `model`.
        `capture`: how a graph is made (tests on the CPU: graphs.rerun_capture); CUDA graphs by default.
        `fuse_epilogues`: the `tri` GEMMs carry the residual add and SwiGLU (same bits; off: separate kernels)."""
        self.model, self.dtype, self.device = model, dtype, str(device)
        self.dev = device
        # R7 before anything creates a cuBLAS handle (the probe's first GEMM), however the backend is made
        self.settings = apply_invariant_settings() if device.type == "cuda" else {}
        self.weights = weights or DeviceWeights(model, TORCH_DTYPE[dtype], device, progress)
        self.table = self._probe_gemms(arena_tokens, fuse_epilogues)
        att = ATTENTION["f32" if dtype == "f32" else attention]
        self.net = GpuLlama(self.weights, self._gemm_for, att, lambda n, k: bool(self.table.fused(n, k)))
        self.arena_tokens = arena_tokens
        self.use_graphs = device.type == "cuda" if graphs is None else graphs
        self.arena = self.net.allocate(arena_tokens, READOUT_CAP) if self.use_graphs else None
        self.graphs = GraphCache()
        self._capture = capture or (CudaCapture(device) if self.use_graphs else None)
        self._blobs: dict[tuple[int, int], torch.Tensor] = {}
        self._reading: Counter[str] = Counter()  # cached prefixes the passes in flight read: compaction keeps them
        self.slots = StagingSlots(self._host_buffers, self._event)
        self.slots.reserve(layout_for(arena_tokens, READOUT_CAP, 2 * READOUT_CAP, self.net.tokens_per_tile).size)
        self.verify_graphs = False  # tests: replay a fresh capture and compare with the eager bits
        self.progress = progress
        self._prefix_version = 0

    @classmethod
    def load(cls, model: ModelDir, dtype: str | None = None, device: str | None = None, **options) -> GpuBackend:
        """f16 by default (accumulation in f32); bf16; f32 is the reference mode."""
        dev = torch.device(device or "cuda")
        with torch.inference_mode():
            return cls(model, dtype or "f16", dev, **options)

    def describe(self) -> dict[str, object]:
        """What decides this backend's bits and speed here (for `basal doctor`, /v1/models and exports): the
        device and versions, the GEMM the probe chose per weight shape, the attention precision, graphs."""
        env = device_stack(self.dev)
        return {
            "backend": self.name,
            "device": self.device,
            "dtype": self.dtype,
            "path": "gpu (Triton kernels, probed GEMMs)",
            **{k: env[k] for k in ("gpu", "torch", "cuda", "triton", "driver")},
            "gemm_kernels": {f"{s.n}x{s.k}": s.gemm for s in self.table.shapes},
            "fused_epilogues": {f"{s.n}x{s.k}": s.fused for s in self.table.shapes if s.fused},
            "attention": self.net.att.precision,
            "cuda_graphs": self._graphs_state(),
            "weights_load_s": round(self.weights.load_seconds, 2),
        }

    def _graphs_state(self) -> str:
        if not self.use_graphs:
            return "off"
        failed = self.graphs.capture_failed
        stopped = f"; capturing stopped after a failure ({failed})" if failed else ""
        return f"{len(self.graphs.graphs)} captured{stopped}"

    # -- GEMMs ----------------------------------------------------------------------------------------------

    def _shapes(self) -> list[tuple[int, int]]:
        lw = self.weights.layers[0]
        return [tuple(w.shape) for w in (lw.qkv, lw.o_proj, lw.gate_up, lw.down)]

    def _epilogues(self) -> dict[tuple[int, int], str]:
        """The epilogue each weight shape's `tri` GEMM would carry (kernel_configs.FUSED_EPILOGUES)."""
        lw = self.weights.layers[0]
        return {tuple(getattr(lw, name).shape): epilogue for name, epilogue in FUSED_EPILOGUES.items()}

    def _probe_gemms(self, arena_tokens: int, fuse_epilogues: bool) -> gt.GemmTable:
        started = time.perf_counter()
        gemms = gt.PREFERENCE if self.dev.type == "cuda" else ("tri",)  # the interpreter runs only Triton
        counts = probed_row_counts(max(arena_tokens, LT_CHUNK) if self.dev.type == "cuda" else arena_tokens)
        key = gt.table_key(device_stack(self.dev), self.dtype)
        epilogues = self._epilogues() if fuse_epilogues else {}
        table = gt.probe(
            self._shapes(), TORCH_DTYPE[self.dtype], self.dev, counts, key, gemms, epilogues=epilogues,
            bias=self.weights.cfg.bias,
        )  # fmt: skip
        if self.dev.type == "cuda":
            keep_table(table, gt.table_path(self.dtype))
        log.info("GEMM probe: %.1f s, %s", time.perf_counter() - started, [s.gemm for s in table.shapes])
        return table

    def _gemm_for(self, n: int, k: int):
        gemm = gt.GEMMS[self.table.gemm(n, k)]
        if gemm is not gt.lt_linear:
            return gemm

        def chunked(x, w, out, bias=None):  # the long lane: library GEMMs only ever see probed row counts
            for r0 in range(0, x.shape[0], LT_CHUNK):
                gemm(x[r0 : r0 + LT_CHUNK], w, out[r0 : r0 + LT_CHUNK], bias)
            return out

        return chunked

    # -- staging ----------------------------------------------------------------------------------------------

    def _host_buffers(self, size: int):
        pin = self.dev.type == "cuda"
        blob = torch.zeros(size, dtype=torch.int32, pin_memory=pin)
        return blob, torch.zeros(READOUT_CAP, READOUT_LETTERS, dtype=torch.float32, pin_memory=pin)

    def _event(self):
        return torch.cuda.Event(blocking=True) if self.dev.type == "cuda" else DoneEvent()

    def _layout(self, packed: PackedForward, pad_to: int = 0) -> BlobLayout:
        return layout_for(
            max(packed.n_tokens, pad_to), len(packed.readouts), len(packed.block_start), self.net.tokens_per_tile
        )

    # -- the Backend protocol -----------------------------------------------------------------------------------

    def prefix(self, key: str, tokens: Sequence[int], base: str | None = None) -> int:
        """K/V of a prefix by an eager forward over its tokens alone (R9) -> the entry's bytes: a template prefix at
        positions 0.., or (`base`) a state that continues a cached prefix, at positions len(base).. reading base's
        K/V as its cached prefix; the entry is then base's rows followed by these. Set once every layer is done."""
        tokens = list(tokens)
        n = len(tokens)
        if base is None:
            packed = single_prompt_forward(tokens)
        elif base in self.net.prefix_rows:
            packed = continuation_forward(tokens, self.net.prefix_rows[base][1], base)
        else:
            raise KeyError(f"no cached prefix {base!r} to continue")
        kv: list[tuple[torch.Tensor, torch.Tensor]] = []

        def keep(_layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
            kv.append((k[:n].clone(), v[:n].clone()))

        with torch.inference_mode():
            run_to_end(self._forward(packed, on_kv=keep, eager=True))
            return self._place([(key, base, kv)])

    def _place(self, entries: list[tuple[str, str | None, list[tuple[torch.Tensor, torch.Tensor]]]]) -> int:
        """Keep entries (key, base, per layer the K/V of the tokens after base) in the slab -> their bytes. Plans made
        before see the change through `_prefix_version` where their rows could read other bits now; graphs are
        dropped only where the buffers grew (they hold the buffers' addresses)."""
        slab = self.net.slab
        version, generation = slab.version, slab.generation
        pinned = {*self._reading, *(base for _, base, _ in entries if base is not None)}
        try:
            with torch.inference_mode():
                return sum(slab.place(key, kv, base, pinned) for key, base, kv in entries)
        finally:
            self._after_slab_change(version, generation)

    def _after_slab_change(self, version: int, generation: int) -> None:
        """Bumped after the rows changed, never before: a plan that read the old version is made again."""
        if self.net.slab.generation != generation:
            self._drop_graphs()
        if self.net.slab.version != version:
            self._prefix_version += 1  # forwards prepared before may point at rows that hold other bits now

    def _drop_graphs(self) -> None:
        """The prefix buffers moved: every graph holds their old addresses."""
        if self.dev.type == "cuda":  # replays queued before must not outlive their graphs and memory pool
            torch.cuda.synchronize(self.dev)
        self.graphs.clear()
        if isinstance(self._capture, CudaCapture):  # and a new pool: the old one still holds the cuBLAS workspace
            self._capture = CudaCapture(self.dev)  # that a capture allocated in it, which a new capture would trip on

    def drop_prefix(self, key: str) -> None:
        """Forget a cached prefix: its rows are free (and keep their bits until another entry is placed there, so
        nothing planned before changes; the graphs stay)."""
        self.net.slab.drop(key)

    def prefix_bytes(self, key: str) -> int:
        """The bytes of the entry's rows in the prefix buffers: K and V, every layer."""
        return self.net.slab.nbytes(key)

    def reserve_states(self, nbytes: int) -> int:
        """Rows for `nbytes` of state cache entries, allocated in the prefix buffers now (before `warm_up` captures
        graphs, which hold the buffers' addresses) -> the bytes the prefix buffers hold in all."""
        slab = self.net.slab
        version, generation = slab.version, slab.generation
        with torch.inference_mode():
            slab.reserve(nbytes // slab.row_bytes)
        self._after_slab_change(version, generation)
        return max(slab.capacity, 1) * slab.row_bytes

    def warm_up(self, max_tokens: int = WARM_TOKENS) -> int:
        """Capture the graphs of the common buckets now, after the template prefixes and the state cache's rows are
        set (growing the prefix buffers drops every graph), so no request pays a bucket's eager first pass and its
        capture: the p99 spike of a new bucket. Each pair runs twice over a dummy forward: eager (compiles the
        kernels), then captured and replayed.
        -> the number of graphs captured (0 without graphs: the CPU, the interpreter)."""
        if not self.use_graphs:
            return 0
        started = time.perf_counter()
        pairs = [(t, r) for t, r in warm_buckets(min(max_tokens, self.arena_tokens)) if r <= READOUT_CAP]
        for tokens, readouts in tqdm(pairs, desc="CUDA graphs", unit="graph", disable=not self.progress):
            dummy = replace(
                single_prompt_forward([0] * tokens), readouts=np.arange(tokens - readouts, tokens, dtype=np.int32)
            )
            for _ in range(2):
                run_to_end(self.run(dummy))
        log.info(
            "captured %d CUDA graphs (token buckets up to %d) in %.1f s",
            len(pairs),
            max_tokens,
            time.perf_counter() - started,
        )
        return len(pairs)

    def prepare(self, packed: PackedForward, pad_to: int = 0) -> Prepared | None:
        """The forward's host work, done before the device is taken (the pipeline calls it while packing): the
        tile layout and the metadata blob. Under the gate only a copy of the blob is left. None where a cached
        prefix it reads is not in the slab now (a state cache entry evicted or not yet computed: the state cache
        computes it before the forward runs, which is planned then)."""
        try:
            return self._plan(packed, pad_to)
        except KeyError:
            return None

    def _plan(self, packed: PackedForward, pad_to: int = 0) -> Prepared:
        version = self._prefix_version  # read first: a change while planning (another lane) makes it plan again
        table = self.net.cfg.max_position_embeddings  # the RoPE table's rows, which its kernel reads unmasked
        if packed.n_tokens and int(packed.positions.max()) >= table:
            raise ValueError(f"a token at position {int(packed.positions.max())} is past the model's {table} positions")
        layout = self._layout(packed, pad_to)
        blob = np.zeros(layout.size, dtype=np.int32)
        pack_blob(packed, lay_out_tiles(packed, self.net.prefix_rows, self.net.tokens_per_tile), layout, blob)
        return Prepared(layout, blob, version)

    def run(
        self, packed: PackedForward, prepared: Prepared | None = None, preemptible: bool = False, *, pad_to: int = 0
    ) -> Generator[Queued | None, None, np.ndarray]:
        """`pad_to`: run at the bucket of at least that many tokens (tests: a larger bucket gives the same bits).
        `prepared`: what `prepare(packed, pad_to)` returned. `preemptible` (the long lane): eager layers, paced, so
        the pass can step aside between layers; a graph replay cannot pause (the same kernels, the same bits).
        A pass with `packed.fills` runs eagerly too (a replay cannot hand rows out between layers; the same bits):
        each layer's K/V of the fills' rows are kept (`on_kv`) and placed as entries once the pass is done."""
        if not packed.fills:
            return (yield from self._forward(packed, pad_to=pad_to, prepared=prepared, eager=preemptible))
        fills = FillRows(packed.fills, self.dev)
        logits = yield from self._forward(packed, on_kv=fills, eager=True, pad_to=pad_to, prepared=prepared)
        self._place(fills.entries())  # no pause after it: a pass stopped before its end leaves no entry
        return logits

    def run_with_hidden(self, packed: PackedForward) -> Generator[Queued | None, None, tuple[np.ndarray, np.ndarray]]:
        """`run`, and the final-normed hidden states f32 [R + H, d] of the readouts, then of `packed.hidden`: the
        last layer runs at those rows too, eagerly (evidence questions only; every row is computed on its own, so
        the readouts keep their bits)."""
        states: list[np.ndarray] = []
        fills = FillRows(packed.fills, self.dev) if packed.fills else None
        logits = yield from self._forward(packed.with_hidden_as_readouts(), on_kv=fills, eager=True, states=states)
        if fills is not None:  # a diagnostics question's pass fills entries as `run` does
            self._place(fills.entries())
        return logits[: len(packed.readouts)], states[0]

    def vocab_logsumexp(self, states: np.ndarray) -> np.ndarray:
        """The whole head, a chunk at a time from the memory map (diagnostics only; nothing is kept)."""
        return head_logsumexp(self.weights.head_rows, self.weights.vocab_size, states, self.weights.device)

    def _forward(
        self,
        packed: PackedForward,
        on_kv=None,
        eager: bool = False,
        pad_to: int = 0,
        states: list | None = None,
        prepared: Prepared | None = None,
    ) -> Generator[Queued | None, None, np.ndarray]:
        """`states`: receives the final-normed rows of the readouts (f32, host) of an eager pass. The cached prefixes
        it reads count as in use until it ends: compaction moves no row they hold meanwhile."""
        self._reading.update(packed.prefix_keys)
        try:
            return (yield from self._pass(packed, on_kv, eager, pad_to, states, prepared))
        finally:
            self._reading.subtract(packed.prefix_keys)
            self._reading = +self._reading  # keys no pass reads any more leave

    def _pass(
        self, packed: PackedForward, on_kv, eager: bool, pad_to: int, states: list | None, prepared: Prepared | None
    ) -> Generator[Queued | None, None, np.ndarray]:
        if prepared is None or prepared.prefix_version != self._prefix_version:
            prepared = self._plan(packed, pad_to)
        layout = prepared.layout
        slot = self.slots.acquire(layout.size)
        try:
            key = (layout.token_bucket, layout.readout_bucket)
            long_lane = layout.token_bucket > self.arena_tokens or layout.readout_bucket > READOUT_CAP
            step = "eager" if (eager or long_lane or not self.use_graphs) else self.graphs.step(key)
            with torch.inference_mode():
                slot.blob[: layout.size].numpy()[:] = prepared.blob
                blob = self._device_blob(key, layout.size, own=step == "eager")
                blob.copy_(slot.blob[: layout.size], non_blocking=True)
                # the event covers that copy from here on: a pass closed before its readback (the long lane's,
                # between layers) must not free the slot while the copy may still read the pinned blob
                slot.event.record()
                meta = layout.views(blob)
                letters = tuple(int(x) for x in packed.letter_ids)
                letter_rows = self.weights.letter_rows(letters)  # [16, hidden], zero past the letters
            if step == "eager":  # own buffers: a pass paused between layers must not share the arena with others
                buffers = self.net.allocate(layout.token_bucket, layout.readout_bucket)
                with torch.inference_mode():
                    buffers.letters.copy_(letter_rows)
                logits = yield from self._eager(buffers, meta, on_kv)
                if states is not None:
                    with torch.inference_mode():
                        states.append(buffers.xr[: len(packed.readouts)].float().cpu().numpy())
            else:  # captured or replayed as a whole, so the arena is never shared mid-pass
                buffers = self.arena.view(layout.token_bucket, layout.readout_bucket)
                with torch.inference_mode():
                    buffers.letters.copy_(letter_rows)  # in stream order: after the last replay read them
                    logits = self._graph(step, key, buffers, meta)
            r = len(packed.readouts)
            if r > READOUT_CAP:  # a long-lane forward with more readouts than a slot holds: read back directly
                with torch.inference_mode():
                    return logits[:r, : len(letters)].cpu().numpy()
            with torch.inference_mode():
                slot.out[:r].copy_(logits[:r], non_blocking=True)
                slot.event.record()
            yield QUEUED  # the pipeline may queue its next forward behind this one now (core/packing/passes.py)
            yield from until_done(slot.event)  # the lanes pack and prepare the next forward meanwhile
            return slot.out[:r, : len(letters)].numpy().copy()
        finally:
            if not slot.event.query():  # closed early: the copies into this slot must land before it is reused
                slot.event.synchronize()
            self.slots.release(slot)

    def _device_blob(self, key: tuple[int, int], size: int, own: bool) -> torch.Tensor:
        """The metadata blob on the device. A graph reads its bucket's blob at a fixed address; an eager pass gets
        its own, since it may pause between layers while another pass at the same bucket writes that one."""
        if own:
            return torch.empty(size, dtype=torch.int32, device=self.dev)
        if key not in self._blobs:
            self._blobs[key] = torch.zeros(size, dtype=torch.int32, device=self.dev)
        return self._blobs[key]

    def _eager(self, buffers: Buffers, meta, on_kv) -> Generator[None, None, torch.Tensor]:
        """Layer by layer, pausing outside inference mode (the long lane's path), at most LAYERS_AHEAD layers queued
        on the device at a pause, so a main-lane pass waits behind no more than that (pacing.py)."""
        steps = inference_steps(self.net.forward(buffers, meta, on_kv))
        return (yield from paced(steps, self._event))

    def _graph(self, step: str, key, buffers: Buffers, meta) -> torch.Tensor:
        """Capture (the bucket's second use) and replay. Everything a graph reads lives at fixed addresses: the
        arena's rows of the bucket, the bucket's metadata blob, the letters' rows in `buffers.letters`."""

        prefix = self.net.prefix_buffers()  # a capture keeps these addresses, as it keeps the arena's

        def run_all() -> torch.Tensor:
            return run_to_end(self.net.forward(buffers, meta, prefix=prefix))

        if step == "capture":
            try:
                graph = self._capture(run_all)
            except Exception as e:  # whatever broke the capture, the forward itself can still run
                why = f"{type(e).__name__}: {e}"
                log.error("CUDA graph capture at bucket %s failed (%s); uncaptured buckets run eagerly", key, why)
                self.graphs.stop_capturing(why)
                return run_all()
            self.graphs.add(key, graph)
            if self.verify_graphs:  # debug and tests: the replay must give the eager bits
                eager = run_all().clone()
                self.graphs.graphs[key].replay()
                if not torch.equal(eager.view(torch.int32), buffers.logits.view(torch.int32)):
                    raise RuntimeError(f"CUDA graph at bucket {key} differs from the eager pass")
        self.graphs.graphs[key].replay()
        return buffers.logits
