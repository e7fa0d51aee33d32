"""Benchmark results: one JSON file per suite (machine, versions, model, raw samples) plus a markdown table, and
optional PNG charts (latency CDFs, throughput vs concurrency)."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from basal.versions import versions


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))] if xs else float("nan")


def stats_ms(samples_s: list[float]) -> dict[str, float]:
    return {
        "p50_ms": pct(samples_s, 50) * 1000,
        "p90_ms": pct(samples_s, 90) * 1000,
        "p99_ms": pct(samples_s, 99) * 1000,
        "max_ms": max(samples_s) * 1000 if samples_s else float("nan"),
        "n": len(samples_s),
    }


@dataclass
class SuiteResult:
    name: str
    columns: list[str]
    rows: list[list[object]]
    samples: dict[str, list[float]] = field(default_factory=dict)  # series name -> raw seconds
    curves: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # series -> (x, y) points
    notes: str = ""

    def markdown(self) -> str:
        def cell(v: object) -> str:
            return f"{v:.2f}" if isinstance(v, float) else str(v)

        lines = [
            f"### {self.name}",
            "",
            "| " + " | ".join(self.columns) + " |",
            "| " + " | ".join("---" for _ in self.columns) + " |",
        ]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in self.rows]
        if self.notes:
            lines += ["", self.notes]
        return "\n".join(lines) + "\n"


def write(
    result: SuiteResult, out: Path, context: dict[str, object], plot: bool, load: dict[str, object] | None = None
) -> list[Path]:
    """`load`: the machine's load before and after the suite (`basal.benchsuite.machine_load`), recorded as is."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "suite": result.name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "machine_load": load or {},
        "versions": versions(),
        **context,
        "columns": result.columns,
        "rows": result.rows,
        "samples_s": result.samples,
        "curves": result.curves,
    }
    files = [out / f"{result.name}.json", out / f"{result.name}.md"]
    files[0].write_text(json.dumps(payload, indent=2, default=str))
    files[1].write_text(result.markdown())
    if plot and (result.samples or result.curves):
        files.append(_plot(result, out / f"{result.name}.png"))
    return files


def _plot(result: SuiteResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    if result.curves:
        for name, points in result.curves.items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("requests/s")
    else:
        for name, xs in result.samples.items():
            xs = sorted(x * 1000 for x in xs)
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms, log scale)")
        ax.set_ylabel("fraction of requests")
    ax.set_title(f"basal bench: {result.name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
