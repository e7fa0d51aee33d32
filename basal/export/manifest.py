"""The manifest of an export: how, where and with what it was made, so that two exports can be told apart.

Everything but ``date`` depends only on the command, the machine and the files, so that the same command twice
writes the same manifest apart from its date, and a resumed export can check that it continues the same run.
Model hashes use upstream's key names (``safetensors_sha256``, ``tokenizer_json_sha256``, ...) beside a hash of
every file, so that a basal export and an upstream export of the same model can be recognised as such.
"""

from __future__ import annotations

import datetime
import hashlib
import platform
from pathlib import Path
from typing import Any

from basal.core.model.model_dir import ModelDir
from basal.export.format import FORMAT
from basal.versions import versions

UPSTREAM_KEYS = {  # file -> upstream manifest key
    "model.safetensors": "safetensors_sha256",
    "tokenizer.json": "tokenizer_json_sha256",
    "config.json": "config_json_sha256",
    "CALIBRATION.json": "calibration_json_sha256",
}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def model_section(model: ModelDir) -> dict[str, Any]:
    """Name, path and the SHA-256 of every file of the model directory (weights included: a few seconds per GB)."""
    files = {p.name: sha256_of(p) for p in sorted(model.path.iterdir()) if p.is_file() and not p.name.startswith(".")}
    section: dict[str, Any] = {
        "name": model.name,
        "version": model.version,
        "synthetic": model.synthetic,
        "path": str(model.path),
    }
    section |= {key: files[name] for name, key in UPSTREAM_KEYS.items() if name in files}
    section["files"] = files
    return section


def build_manifest(
    model: ModelDir,
    backend: dict[str, Any],
    batching: str,
    inputs: dict[str, Any],
    device_name: str,
) -> dict[str, Any]:
    """`backend`: name, device, dtype (and options); `inputs`: path, sha256 and count of the request file."""
    return {
        "format": FORMAT,
        "tool": "basal export",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S +0000"),
        "inputs": inputs,
        "model": model_section(model),
        "calibration": {"temperatures": dict(sorted(model.calibration.temperatures.items()))},
        "backend": {**backend, "device_name": device_name},
        "batching": batching,
        "platform": {"machine": platform.machine(), "os": platform.platform(), "system": platform.system()},
        "versions": versions(),
        "host_math": "softmax, order average and calibration in float64 from the float32 letter logits",
    }


def without_date(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in manifest.items() if k != "date"}
