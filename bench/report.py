"""What every synthetic-model benchmark records: the machine, the model it ran, and the JSON file it writes."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import torch


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__}


def model_info(model_arg: str | None, layers: int) -> dict[str, Any]:
    """`model_arg` is the --model directory, or None for the synthesized mini shapes."""
    return {"preset": "mini" if model_arg is None else str(model_arg), "layers": layers}


def write_json(out: str, result: dict[str, Any]) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2))
