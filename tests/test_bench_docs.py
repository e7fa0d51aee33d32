"""The Makefile, docs/operations.md (the `make` targets), bench/README and docs/benchmarks.md describe `make bench`
alike: its model and its run time."""

from __future__ import annotations

import re
from pathlib import Path

from basal.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_make_bench_is_described_alike_everywhere():
    bench = build_parser().parse_args(["bench"])
    shape = f"mini shapes cut to {bench.layers} layers"
    assert bench.preset == "mini"
    names = ("Makefile", "docs/operations.md", "bench/README.md", "docs/benchmarks.md")
    texts = {name: (ROOT / name).read_text() for name in names}
    for name, text in texts.items():
        assert shape in text, f"{name} does not say {shape!r}"
    minutes, seconds = re.search(r"The whole run took (\d+) min (\d+) s", texts["bench/README.md"]).groups()
    targets = texts["docs/operations.md"].splitlines()  # the table of `make` targets
    make_bench_row = next(line for line in targets if line.startswith("| `make bench`"))
    assert f"{minutes} min {seconds} s" in make_bench_row
    assert f"about {minutes} min" in texts["Makefile"] and f"~{minutes} min" in texts["bench/README.md"]
    assert f"about {minutes} min on 2 cores" in texts["docs/benchmarks.md"]
