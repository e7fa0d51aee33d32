"""One export per (backend, device, dtype, batching, options), made on first use and shared by the module."""

from __future__ import annotations

from pathlib import Path

import pytest

from basal.backends.load import load_backend_class
from basal.export.api import export_records
from tests.conftest import DATA

REQUESTS = DATA / "export_requests.jsonl"  # 6 lines: 4 basal-dialect requests (one refused), 1 System One, 1 bench


def combos() -> list[tuple[str, str, str]]:
    out = [("torch", "cpu", dt) for dt in ("f32", "bf16", "f16")]
    if load_backend_class("mlx") is not None:
        out += [("mlx", "cpu", dt) for dt in ("f32", "bf16", "f16")]
    return out


class Exports:
    def __init__(self, model, root: Path):
        self.model, self.root, self.made = model, root, {}

    def get(self, backend: str, device: str, dtype: str, batching: str = "single", **options) -> Path:
        key = (backend, device, dtype, batching, tuple(sorted(options.items())))
        if key not in self.made:
            name = "-".join([backend, device, dtype, batching, *(f"{k}={v}" for k, v in sorted(options.items()))])
            out = self.root / f"{name}.jsonl"
            export_records(REQUESTS, out, self.model, backend, dtype, device, batching, backend_options=options or None)
            self.made[key] = out
        return self.made[key]


@pytest.fixture(scope="session")
def exports(demo_model, tmp_path_factory) -> Exports:
    return Exports(demo_model, tmp_path_factory.mktemp("exports"))
