"""jevbench 0.1.0's full default suite against `basal serve`: requests/s and the five batch-independence relations.

    python -m bench.checks.jevbench_suite                       # the built-in demo model, 4 requests in flight
    python -m bench.checks.jevbench_suite --model DIR --concurrency 8 --json out.json

jevbench is a peer's coherence and stability harness for System One servers (metamorphic relations; it measures
neither accuracy nor speed). Its batch-independence (BAT) relations ask the same questions alone, reordered,
duplicated, next to other questions and in batches of several sizes; basal answers each question with the same
bits however it is batched, so every BAT deviation must be exactly 0.0 (the script exits 1 otherwise). The other
relations score the model (the demo's random weights score what they score) and are reported, not judged.
requests/s is jevbench's request count over its wall time in this run, on this machine, with the server in its
own process (loopback HTTP).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BAT = ("batch_solo", "batch_order", "duplicate_question", "batch_content", "batch_size_sweep")


def run(url: str, suite: str, concurrency: int) -> dict:
    """One evaluation without a cache (every request reaches the server)."""
    import jevbench

    model = jevbench.systemone(url + "/v1/systemone", model="jev-latest")
    report = jevbench.evaluate(model, suite, concurrency=concurrency, cache=None)
    result = report.result
    deviation: dict[str, float] = {}
    tests: dict[str, int] = {}
    for o in result["outcomes"]:
        if o["relation"] in BAT:
            deviation[o["relation"]] = max(deviation.get(o["relation"], 0.0), float(o["deviation"]))
            tests[o["relation"]] = tests.get(o["relation"], 0) + 1
    return {
        "suite": suite,
        "requests": result["requests"],
        "wall_s": result["wall_seconds"],
        "requests_per_s": result["requests"] / result["wall_seconds"],
        "errors": len(result["errors"]),
        "bat": {r: {"tests": tests.get(r, 0), "max_deviation": deviation.get(r)} for r in BAT},
        "scores": report.relations,
    }


def main(argv: list[str] | None = None) -> int:
    from bench.lab.http_speed import start_server

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model directory (default: the built-in demo model)")
    ap.add_argument("--suite", default="jevbench-mini", help="jevbench suite (default: its default, jevbench-mini)")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    ap.add_argument("--json", default=None, help="also write the result here")
    a = ap.parse_args(argv)
    if a.model is None:
        from basal.core.model.synth import demo_model

        model_dir = demo_model().path
    else:
        model_dir = Path(a.model)
    proc, url = start_server(model_dir)
    try:
        result = run(url, a.suite, a.concurrency)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(
        f"jevbench {a.suite}: {result['requests']} requests in {result['wall_s']:.1f} s = "
        f"{result['requests_per_s']:.1f} requests/s at concurrency {a.concurrency}, {result['errors']} errors"
    )
    print(f"{'relation':<20} {'tests':>5}  max deviation")
    for name, row in result["bat"].items():
        print(f"{name:<20} {row['tests']:>5}  {row['max_deviation']}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    exact = all(row["tests"] > 0 and row["max_deviation"] == 0.0 for row in result["bat"].values())
    return 0 if exact and not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
