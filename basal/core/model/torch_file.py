"""Reading and writing PyTorch `torch.save` files of plain tensors, without torch and without running pickled code.

A `torch.save` file is a zip archive: ``<root>/data.pkl`` (a pickle that names tensors by storage key) and one raw
little-endian file per storage (``<root>/data/<key>``). Unpickling an untrusted file can run any code it names, so
the reader allows exactly the few names a tensor dictionary needs (`torch._utils._rebuild_tensor_v2`, the storage
types, `collections.OrderedDict`) and builds numpy arrays itself; anything else is refused by name. The writer emits
the same layout with hand-written pickle opcodes, so `torch.load(..., weights_only=True)` reads it as well.
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from basal.core.model.safetensors_io import bf16_bits_to_f32

_STORAGE_DTYPES = {
    "FloatStorage": np.dtype("<f4"),
    "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": np.dtype("<u2"),  # raw bits; widened to f32 on load
    "DoubleStorage": np.dtype("<f8"),
}


class TorchFileError(ValueError):
    """A file that is not a plain tensor dictionary (or not a torch.save file at all)."""


class _StorageType:
    def __init__(self, name: str):
        self.name, self.dtype = name, _STORAGE_DTYPES[name]


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple, stride: tuple, *_unused: Any) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2 for a contiguous tensor: a view of its storage, copied out."""
    n = int(np.prod(size)) if size else 1
    expected = tuple(int(np.prod(size[i + 1 :])) for i in range(len(size)))
    if tuple(stride) != expected and n > 1:
        raise TorchFileError(f"a tensor with strides {stride} for shape {size} (only contiguous tensors are read)")
    flat = storage[offset : offset + n]
    if flat.dtype == np.dtype("<u2"):
        flat = bf16_bits_to_f32(flat)
    return np.array(flat, copy=True).reshape(size)


class _SafeUnpickler(pickle.Unpickler):
    ALLOWED: ClassVar[dict[tuple[str, str], Any]] = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("collections", "OrderedDict"): dict,
    }

    def __init__(self, data: bytes, archive: zipfile.ZipFile, root: str):
        super().__init__(io.BytesIO(data))
        self.archive, self.root = archive, root

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if (module, name) in self.ALLOWED:
            return self.ALLOWED[(module, name)]
        raise TorchFileError(f"refusing to load {module}.{name}: the file may only hold tensors and plain values")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise TorchFileError(f"unknown persistent reference {pid!r}")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType):
            raise TorchFileError("a storage without a known element type")
        raw = self.archive.read(f"{self.root}/data/{key}")
        array = np.frombuffer(raw, dtype=storage_type.dtype)
        if len(array) < numel:
            raise TorchFileError(f"storage {key} holds {len(array)} elements, {numel} expected")
        return array


def load_tensors(path: str | Path) -> Any:
    """The object a `torch.save` file holds, tensors as numpy arrays (f32 for bf16), never executing its code."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise TorchFileError(f"{path}: not a torch.save archive ({e})") from e
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise TorchFileError(f"{path}: expected one data.pkl in the archive, found {len(pickles)}")
        root = pickles[0][: -len("/data.pkl")]
        try:
            return _SafeUnpickler(archive.read(pickles[0]), archive, root).load()
        except TorchFileError as e:
            raise TorchFileError(f"{path}: {e}") from e
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as e:
            raise TorchFileError(f"{path}: unreadable ({e})") from e


# ---------------------------------------------------------------------------------------------------------------
# Writing (pickle protocol 2, the opcodes torch.save itself emits for a dict of tensors)


def _string(s: str) -> bytes:
    data = s.encode("utf-8")
    return b"X" + struct.pack("<I", len(data)) + data


def _int(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)


def _tuple(items: tuple[int, ...]) -> bytes:
    return b"(" + b"".join(_int(i) for i in items) + b"t"


def _tensor(key: str, array: np.ndarray) -> bytes:
    shape = tuple(int(s) for s in array.shape)
    stride = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
    storage = b"(" + _string("storage") + b"ctorch\nFloatStorage\n" + _string(key) + _string("cpu")
    storage += _int(int(array.size)) + b"tQ"
    return (
        b"ctorch._utils\n_rebuild_tensor_v2\n("
        + storage
        + _int(0)
        + _tuple(shape)
        + _tuple(stride)
        + b"\x89ccollections\nOrderedDict\n)Rt"
        + b"R"
    )


def save_tensors(path: str | Path, obj: Mapping[str, Any], root: str = "archive") -> None:
    """Write `obj` — a dict of str keys to ints, strings or dicts of float32 arrays — as `torch.save` would.

    Deterministic: the same object gives the same bytes (fixed zip timestamps, storages in key order)."""
    storages: list[np.ndarray] = []

    def value(v: Any) -> bytes:
        if isinstance(v, bool) or not isinstance(v, int | str | Mapping | np.ndarray):
            raise TypeError(f"cannot write a {type(v).__name__}")
        if isinstance(v, int):
            return _int(v)
        if isinstance(v, str):
            return _string(v)
        if isinstance(v, np.ndarray):
            storages.append(np.ascontiguousarray(v, dtype="<f4"))
            return _tensor(str(len(storages) - 1), storages[-1])
        return b"}(" + b"".join(_string(str(k)) + value(x) for k, x in v.items()) + b"u"

    data = b"\x80\x02" + value(obj) + b"."
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:

        def put(name: str, payload: bytes) -> None:
            z.writestr(zipfile.ZipInfo(f"{root}/{name}", date_time=(1980, 1, 1, 0, 0, 0)), payload)

        put("data.pkl", data)
        put("byteorder", b"little")
        for i, array in enumerate(storages):
            put(f"data/{i}", array.tobytes())
        put("version", b"3\n")
