"""`evidence: true` on / off on the same request: the added latency, as a ratio measured in the same run.

    python -m bench.lab.evidence_speed                       # mini shapes cut to 2 layers (with a seeded head), f32
    python -m bench.lab.evidence_speed --layers 1 --reps 2   # quicker

Each request is one noul question on a state of 128, 512 and 2048 tokens (and, per state, 5 questions on it with
evidence on every one). Evidence makes the last layer run at the state's tokens too (not only at the readouts),
then the pointer head scores them on the host; "on" and "off" are timed alternately, so the ratio is what to
read on a busy machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from basal.backends.cuda.backend import TorchBackend
from basal.benchsuite.workloads import state_of_tokens
from basal.core.engine.pipeline import Pipeline, Stats
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_basal
from bench import report

STATE_TOKENS = (128, 512, 2048)
QUESTIONS = (1, 5)


def request(state: str, questions: int, evidence: bool) -> dict:
    asked = {
        f"q{i}": {"type": "noul", "instructions": f"Is point {i} of the contract met?", "evidence": evidence}
        for i in range(questions)
    }
    return {"state": state, "questions": asked}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model directory with evidence_head.pt (default: synth mini)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--state-tokens", type=int, nargs="+", default=list(STATE_TOKENS))
    ap.add_argument("--questions", type=int, nargs="+", default=list(QUESTIONS))
    ap.add_argument("--reps", type=int, default=5, help="timed pairs (on, off) after one warm-up")
    ap.add_argument("--out", default="bench/results/evidence_speed.json")
    a = ap.parse_args(argv)

    tmp = None
    if a.model is None:
        tmp = tempfile.TemporaryDirectory()
        path = synth_model(Path(tmp.name) / "mini", "mini", layers=a.layers, evidence_head=True)
    else:
        path = Path(a.model)
    model = ModelDir.load(path)
    if model.evidence_head is None:
        raise SystemExit(f"{path} has no evidence_head.pt: evidence cannot be measured on it")
    pipeline = Pipeline(model, TorchBackend.load(model, dtype="f32"))
    resolve = lambda _name: model.name  # noqa: E731
    rows = []
    for tokens in tqdm(a.state_tokens, desc="states"):
        state = state_of_tokens(model.tokenizer, tokens, "en", seed=0)
        for n in a.questions:
            on, off = (
                parse_basal(request(state, n, e), resolve, serves_evidence=lambda _m: True) for e in (True, False)
            )
            pipeline.decide(on)  # warm-up
            pipeline.decide(off)
            stats_on, stats_off = Stats(), Stats()
            times: dict[str, list[float]] = {"on": [], "off": []}
            for _ in range(a.reps):
                for name, plan, stats in (("on", on, stats_on), ("off", off, stats_off)):
                    t0 = time.perf_counter()
                    pipeline.decide(plan, stats)
                    times[name].append(time.perf_counter() - t0)
            median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
            rows.append(
                {
                    "state_tokens": tokens,
                    "questions": n,
                    "packed_tokens": stats_off.packed_tokens // a.reps,
                    "on_ms": median["on"] * 1000,
                    "off_ms": median["off"] * 1000,
                    "ratio": median["on"] / median["off"],
                    "samples_s": times,
                }
            )
    result = {
        "machine": report.machine(),
        "model": report.model_info(a.model, model.config.num_hidden_layers),
        "reps": a.reps,
        "rows": rows,
    }
    report.write_json(a.out, result)
    print(
        f"\n{result['model']['preset']} shapes, {model.config.num_hidden_layers} layers, f32, torch CPU, "
        f"median of {a.reps} alternating pairs\n"
    )
    print("| state tokens | questions | packed tokens | evidence off ms | evidence on ms | on / off |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['state_tokens']} | {r['questions']} | {r['packed_tokens']} | {r['off_ms']:.1f} | "
            f"{r['on_ms']:.1f} | {r['ratio']:.2f}× |"
        )
    if tmp:
        tmp.cleanup()
    return rows


if __name__ == "__main__":
    main()
