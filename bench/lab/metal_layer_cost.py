"""Kernel launches of one MLX layer, counted from its graph (`mx.export_to_dot`) without running it: the portable
ops the Metal path used before (CPU workarounds) against the Metal-native ones (`native.py`).

    python -m bench.lab.metal_layer_cost --preset mini --tokens 128

Views (reshape, slice, transpose, broadcast) launch nothing and are not counted. Tree attention is one custom
kernel on Metal either way and is left out. On the CPU build `mx.fast.rms_norm` is built from ~9 primitive ops;
on Metal it is one kernel, so the Metal count subtracts the difference (printed).
"""

from __future__ import annotations

import argparse
import collections
import re
import tempfile
from pathlib import Path

import mlx.core as mx

from basal.backends.mlx import model as M
from basal.backends.mlx import native
from basal.backends.mlx import ops as O
from basal.core.model.synth import PRESETS
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import single_prompt_forward

VIEWS = {"Broadcast", "BroadcastAxes", "Reshape", "Slice", "Split", "Transpose", "ExpandDims", "Squeeze", "View"}


def kernels(*outputs: mx.array) -> collections.Counter:
    with tempfile.NamedTemporaryFile(suffix=".dot") as f:
        mx.export_to_dot(f.name, *outputs)
        labels = re.findall(r'label ="(\w+)"', Path(f.name).read_text())
    return collections.Counter(label for label in labels if label not in VIEWS)


def one_layer_net(cfg, native_ops: bool, dtype=mx.float16) -> M.MLXLlama:
    """An MLXLlama with one layer of zero weights of these shapes (nothing is loaded or evaluated)."""
    net = M.MLXLlama.__new__(M.MLXLlama)
    # use_metal: the layer as the Metal path builds it (no evaluation between row blocks)
    net.cfg, net.dtype, net.use_metal, net.native, net.fixed = cfg, dtype, True, native_ops, True
    hd, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    d, f = cfg.hidden_size, cfg.intermediate_size

    def z(*shape: int) -> mx.array:
        return mx.zeros(shape, dtype=dtype)

    net.layers = [
        M.Layer(z(d), z(d, (nq + 2 * nkv) * hd), None, z(nq * hd, d), None, z(d), z(d, 2 * f), None, z(f, d), None)
    ]
    net.cos, net.sin = O.rope_tables(max(4096, cfg.max_position_embeddings), hd, cfg.rope_theta)
    net.prefix_kv = {}
    mx.eval(*vars(net.layers[0]).values(), net.cos, net.sin)
    return net


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    cfg = PRESETS[a.preset].config
    batch = single_prompt_forward(list(range(3, 3 + a.tokens)))
    h = mx.zeros((a.tokens, cfg.hidden_size), dtype=mx.float16)
    w = mx.zeros((cfg.hidden_size,), dtype=mx.float16)
    mx.eval(h, w)
    norm_nodes = sum(kernels(native.rms_norm(h, w, 1e-5)).values())
    for native_ops in (False, True):
        net = one_layer_net(cfg, native_ops)
        t = net.inputs(batch)

        def no_attention(q, k, v, t, last):  # one custom kernel on Metal, counted apart
            return mx.zeros(q.shape)
            yield

        net._attention_steps = no_attention
        out, (k, v) = run_to_end(net.layer(0, h, t, last=False))
        counts = kernels(out, k, v)
        total = sum(counts.values())
        metal = total - 2 * (norm_nodes - 1) if native_ops else total
        label = "Metal-native (now)" if native_ops else "portable (before)"
        print(f"{a.preset}, {a.tokens} tokens, {label}: {metal} kernels per layer + 1 attention kernel")
        print(f"    graph nodes on this build: {dict(counts.most_common(8))}")
    print(f"(mx.fast.rms_norm: {norm_nodes} nodes on the CPU build, 1 kernel on Metal)")


if __name__ == "__main__":
    main()
