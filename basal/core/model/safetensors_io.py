"""Safetensors without a framework: memory-mapped reading and streaming writing.

numpy has no bfloat16, so BF16 tensors are read as their raw uint16 bits; backends widen them on load.
Reading maps the file (nothing is copied until a backend converts a tensor); writing streams one tensor at a
time, so synthesizing an 11B model never holds more than one tensor in memory.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NUMPY_DTYPE = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "I64": np.int64, "I32": np.int32}
ITEM_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "I32": 4}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    start: int  # byte offsets in the data section
    end: int


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """-> (tensors, metadata, offset of the data section)."""
    with open(path, "rb") as f:
        size_bytes = f.read(8)
        if len(size_bytes) != 8:
            raise ValueError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", size_bytes)
        if n > 100_000_000:
            raise ValueError(f"{path}: not a safetensors file (header of {n} bytes)")
        header = json.loads(f.read(n))
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {
        name: TensorInfo(h["dtype"], tuple(h["shape"]), h["data_offsets"][0], h["data_offsets"][1])
        for name, h in header.items()
    }
    return tensors, metadata, 8 + n


class SafetensorsFile:
    """Lazy view of one ``.safetensors`` file: tensors are numpy views into a read-only memory map."""

    def __init__(self, path: Path):
        self.path = path
        self.tensors, self.metadata, self._data_start = read_header(path)
        self._map: np.memmap | None = None

    def tensor(self, name: str) -> tuple[str, np.ndarray]:
        """-> (safetensors dtype, array). BF16 comes back as uint16 bits."""
        info = self.tensors[name]
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._map[self._data_start + info.start : self._data_start + info.end]
        return info.dtype, raw.view(NUMPY_DTYPE[info.dtype]).reshape(info.shape)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * ITEM_SIZE[self.dtype]


def write_safetensors(
    path: Path,
    specs: list[TensorSpec],
    produce: Callable[[TensorSpec], np.ndarray],
    metadata: dict[str, str] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Write tensors in `specs` order; `produce(spec)` returns each one's data (BF16 as uint16 bits)."""
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for s in specs:
        header[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for s in specs:
            data = np.ascontiguousarray(produce(s))
            if data.shape != s.shape or data.dtype != NUMPY_DTYPE[s.dtype]:
                raise ValueError(f"{s.name}: produced {data.dtype}{data.shape}, expected {s.dtype}{s.shape}")
            f.write(data.tobytes())
            if on_bytes:
                on_bytes(s.nbytes)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounded to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)
