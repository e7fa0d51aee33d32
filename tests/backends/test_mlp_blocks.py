"""The MLP in row blocks (`TreeLlama._mlp`): every row gets the bits of gate/up, SwiGLU and down over the whole
batch at once, for batches of one block, several, and a short last block, whatever the two weights' choices."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from basal.backends.cuda import ops as K
from basal.backends.cuda.backend import TorchBackend
from basal.backends.cuda.cpu.gemm_chunks import ChunkSizes
from basal.core.packing.passes import run_to_end


def _key(w: torch.Tensor, b: torch.Tensor | None) -> tuple[int, int, str, bool]:
    return (w.shape[0], w.shape[1], str(w.dtype).removeprefix("torch."), b is not None)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize(("up", "down"), [(64, 64), (32, 128), (128, 16)], ids=["same", "down-wider", "up-wider"])
def test_blocks_give_the_whole_batch_bits(demo_model, dtype, up, down):
    net = TorchBackend.load(demo_model, dtype=dtype).net
    lw = net.w.layers[0]
    table = net.chunks
    up_key, down_key = _key(lw.gate_up, lw.gate_up_bias), _key(lw.down, lw.down_bias)
    saved = dict(table.sizes)
    table.sizes[up_key] = ChunkSizes(up, tuple(s for s in (8, 16, 32, 64, 128) if s <= up), True, cols=24)
    table.sizes[down_key] = ChunkSizes(down, tuple(s for s in (8, 16, 32, 64, 128) if s <= down), True)
    x = torch.randn(700, lw.gate_up.shape[1], generator=torch.Generator().manual_seed(3)).to(lw.gate_up.dtype)
    try:
        with torch.inference_mode():
            for n in (0, 1, 5, up, 3 * max(up, down), 3 * max(up, down) + 7, 700):
                gate_up = run_to_end(K.linear_steps(x[:n], lw.gate_up, lw.gate_up_bias, table.sizes[up_key]))
                act = K.swiglu(gate_up)
                whole = run_to_end(K.linear_steps(act, lw.down, lw.down_bias, table.sizes[down_key]))
                blocked = run_to_end(net._mlp(x[:n], lw, readout=False))
                assert blocked.shape == whole.shape
                assert torch.equal(
                    blocked.view(torch.int16 if dtype == "bf16" else torch.int32),
                    whole.view(torch.int16 if dtype == "bf16" else torch.int32),
                ), n
    finally:
        table.sizes.clear()
        table.sizes.update(saved)


def test_blocks_pause_between_them(demo_model):
    """A long batch still has pause points inside the MLP (the long lane steps aside there)."""
    net = TorchBackend.load(demo_model).net
    lw = net.w.layers[0]
    choices = net.chunks.sizes
    saved = dict(choices)
    # 64-row chunks whose tail is padded to 64 (the probed sizes's tails may all be shorter than 300 % 64 rows)
    choices[_key(lw.gate_up, lw.gate_up_bias)] = replace(saved[_key(lw.gate_up, lw.gate_up_bias)], rows=64, tails=(64,))
    choices[_key(lw.down, lw.down_bias)] = replace(saved[_key(lw.down, lw.down_bias)], rows=64, tails=(64,))
    try:
        with torch.inference_mode():
            steps = net._mlp(torch.zeros(300, lw.gate_up.shape[1], dtype=lw.gate_up.dtype), lw, readout=False)
            pauses = 0
            try:
                while True:
                    next(steps)
                    pauses += 1
            except StopIteration:
                pass
        assert pauses >= 4  # five blocks of 64 rows
    finally:
        choices.clear()
        choices.update(saved)
