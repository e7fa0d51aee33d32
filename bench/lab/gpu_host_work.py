"""The GPU path's host work per forward, on this machine's CPU (no GPU needed): tree packing, then the tile plan and
metadata blob (`GpuBackend.prepare`, done before the device is taken). The numbers say how much of a forward the
GPU would wait for without that split.

    python -m bench.lab.gpu_host_work            # mini's head layout; 1, 16 and 36 questions on 100-token states
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np

from basal.backends.cuda.gpu.buckets import layout_for
from basal.backends.cuda.gpu.kernel_configs import ATTENTION
from basal.core.packing.tile_layout import lay_out_tiles, pack_blob
from basal.core.packing.tree import split_forwards
from bench.checks.gpu_check import questions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", default="1,16,36", help="batch sizes (questions of two option orders)")
    p.add_argument("--group", type=int, default=6, help="query heads per key/value head (mini: 6)")
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    rng = random.Random(0)
    prefix = tuple(rng.randrange(32000) for _ in range(66))
    per_tile = ATTENTION["f32"].tokens_per_tile(args.group)
    print("questions  tokens  tree packing ms  tile plan + blob ms (median)")
    for n in map(int, args.questions.split(",")):
        qs = questions(n, rng, prefix, 100, 32000)
        started = time.perf_counter()
        (forward,) = split_forwards(qs, list(range(10)), {"en": prefix})
        packing = time.perf_counter() - started
        batch = forward.packed
        layout = layout_for(batch.n_tokens, len(batch.readouts), len(batch.block_start), per_tile)
        blob = np.zeros(layout.size, np.int32)
        times = []
        for _ in range(args.reps):
            started = time.perf_counter()
            pack_blob(batch, lay_out_tiles(batch, {"en": (0, len(prefix))}, per_tile), layout, blob)
            times.append(time.perf_counter() - started)
        print(f"{n:9d}  {batch.n_tokens:6d}  {packing * 1e3:15.2f}  {statistics.median(times) * 1e3:10.3f}")


if __name__ == "__main__":
    main()
