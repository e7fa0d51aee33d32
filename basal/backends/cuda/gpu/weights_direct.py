"""Checkpoint weights straight to the device in the compute dtype (safetensors -> torch, no f32 numpy copy), with
a progress bar and the load time recorded; q/k/v and gate/up fused. Any device: the CPU path may adopt it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from safetensors import safe_open
from tqdm import tqdm

from basal.backends.cuda.gpu.kernel_configs import READOUT_LETTERS
from basal.core.model.checkpoint_names import EMBED, FINAL_NORM, LM_HEAD, fused_layer
from basal.core.model.model_dir import LlamaConfig, ModelDir
from basal.core.model.safetensors_io import bf16_bits_to_f32


@dataclass
class DeviceLayer:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(H + 2 KVH) D, hidden]: q, k, v rows fused
    o_proj: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2F, hidden]: gate rows, then up rows
    down: torch.Tensor
    # basal-1.0 checkpoints: the biases, fused like their weights (basal-1.5: None)
    qkv_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None


def fit(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor` in `dtype`, refusing a conversion that overflows: bf16 and f32 reach past f16's ±65504, and an inf
    weight would turn every logit it touches into NaN, silently."""
    out = tensor.to(dtype)
    if dtype == torch.float16 and tensor.dtype != dtype and not bool(torch.isfinite(out).all()):
        finite_before = bool(torch.isfinite(tensor).all())
        raise ValueError(
            f"weight {name} has values past f16's range (±65504) in this {tensor.dtype} checkpoint"
            + ("" if finite_before else " (it holds inf or NaN already)")
            + ": serve it with --dtype bf16 (or dtype: bf16 in the config)"
        )
    return out


class DeviceWeights:
    """All tensors the GPU model reads, on `device` in `dtype`; `load_seconds` says how long loading took."""

    def __init__(self, model: ModelDir, dtype: torch.dtype, device: torch.device, progress: bool = True):
        started = time.perf_counter()
        self.cfg: LlamaConfig = model.config
        self.dtype, self.device = dtype, device
        self._index = model.open_weights()
        files = {name: f.path for name, (f, _) in self._index.items()}
        handles = {p: safe_open(str(p), framework="pt", device=str(device)) for p in set(files.values())}
        bar = tqdm(total=len(files) - 1, desc="weights -> " + str(device), unit="tensor", disable=not progress)

        def get(name: str) -> torch.Tensor:
            bar.update()
            return fit(name, handles[files[name]].get_tensor(self._index[name][1]), dtype)

        self.embed = get(EMBED)
        self.layers = [
            DeviceLayer(**fused_layer(i, get, torch.cat, self.cfg.bias)) for i in range(self.cfg.num_hidden_layers)
        ]
        self.norm = get(FINAL_NORM)
        bar.close()
        self._letters: dict[tuple[int, ...], torch.Tensor] = {}
        self._lm_head: torch.Tensor | None = None  # synthetic weights only; a checkpoint's head stays on disk
        self.load_seconds = time.perf_counter() - started

    @classmethod
    def random(cls, cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, seed: int = 0) -> DeviceWeights:
        """Distinct random weights of `cfg`'s shapes, made on the device (no checkpoint on disk):
        bench/checks/gpu_check.py
        on the model shapes, the interpreter tests on toy ones. Norm weights are 1, projections ~ 1/sqrt(k),
        biases (where `cfg.bias`) ~ 0.1."""
        g = torch.Generator(device=device).manual_seed(seed)

        def rand(*shape: int, scale: float | None = None) -> torch.Tensor:
            return (torch.randn(shape, generator=g, device=device) * (scale or shape[-1] ** -0.5)).to(dtype)

        def ones() -> torch.Tensor:
            return torch.ones(cfg.hidden_size, device=device, dtype=dtype)

        hid, d, h, kvh = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        w = cls.__new__(cls)
        w.cfg, w.dtype, w.device, w._letters, w.load_seconds = cfg, dtype, device, {}, 0.0
        w.embed = rand(cfg.vocab_size, hid, scale=1.0)
        f = cfg.intermediate_size

        def layer() -> DeviceLayer:
            qkv, o, gate_up, down = rand((h + 2 * kvh) * d, hid), rand(hid, h * d), rand(2 * f, hid), rand(hid, f)
            lw = DeviceLayer(ones(), qkv, o, ones(), gate_up, down)
            if cfg.bias:
                for name in ("qkv", "o_proj", "gate_up", "down"):
                    rows = getattr(lw, name).shape[0]
                    setattr(lw, name.removesuffix("_proj") + "_bias", rand(rows, scale=0.1))
            return lw

        w.layers = [layer() for _ in range(cfg.num_hidden_layers)]
        w.norm = ones()
        w._lm_head = rand(cfg.vocab_size, hid)
        return w

    @property
    def vocab_size(self) -> int:
        if self._lm_head is not None:
            return int(self._lm_head.shape[0])
        f, key = self._index[LM_HEAD]
        return int(f.tensor(key)[1].shape[0])

    def head_rows(self, start: int, stop: int) -> torch.Tensor:
        """lm_head rows start..stop-1 as the compute dtype holds them, f32 on the device (as `letter_rows`)."""
        if self._lm_head is not None:
            return self._lm_head[start:stop].float()
        f, key = self._index[LM_HEAD]
        kind, array = f.tensor(key)
        rows = np.asarray(array[start:stop])
        rows = bf16_bits_to_f32(rows) if kind == "BF16" else rows.astype(np.float32)
        return torch.from_numpy(rows).to(self.dtype).float().to(self.device)

    def letter_rows(self, letter_ids: tuple[int, ...]) -> torch.Tensor:
        """[16, hidden] f32: the LM-head rows of the letters as the compute dtype holds them, zero past the letters.
        Only these rows are read (from the memory map), never the whole head."""
        if letter_ids not in self._letters:
            if len(letter_ids) > READOUT_LETTERS:
                raise ValueError(f"{len(letter_ids)} letters > {READOUT_LETTERS} readout columns")
            head = torch.zeros(READOUT_LETTERS, self.cfg.hidden_size, device=self.device)
            if self._lm_head is not None:
                head[: len(letter_ids)] = self._lm_head[list(letter_ids)].float()
            else:
                f, key = self._index[LM_HEAD]
                kind, array = f.tensor(key)
                rows = np.asarray(array[list(letter_ids)])
                rows = bf16_bits_to_f32(rows) if kind == "BF16" else rows.astype(np.float32)
                host = torch.from_numpy(rows).to(self.dtype).float()  # the compute dtype's rounding, on the host
                if self.device.type == "cuda":  # pinned, so the copy does not wait for the forward in flight
                    host = host.pin_memory()
                head[: len(letter_ids)].copy_(host, non_blocking=True)
            self._letters[letter_ids] = head
        return self._letters[letter_ids]
