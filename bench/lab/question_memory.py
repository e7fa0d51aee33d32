"""Memory of one request of 1,024 noul questions on one 6.5 KB state (the demo model): peak RSS after tokenizing,
packing and the forward, with prompts stored as basal had them (one tokenizer call for every prompt, each prompt
its own tuple of fresh ints) and as it is now (bounded batches, shared int objects, and the prompts on one state
keeping its ids once). Each runs in a fresh interpreter so their peaks do not mix.
`--evidence`: every question asks for evidence (/v1/basal), so the forward also reads the state tokens' hidden
states and the answer runs the evidence head per question.

    python -m bench.lab.question_memory
    python -m bench.lab.question_memory --questions 256
    python -m bench.lab.question_memory --evidence
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import resource, sys, tempfile
from pathlib import Path
from basal.backends.cuda.backend import TorchBackend
from basal.core.engine.pipeline import Pipeline, Stats
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.packing.passes import run_to_end
from basal.core.request.dialects import parse_basal, parse_systemone

questions, old, evidence = int(sys.argv[1]), sys.argv[2] == "old", sys.argv[3] == "evidence"
model = ModelDir.load(synth_model(Path(tempfile.mkdtemp()) / "demo", "demo", seed=0, evidence_head=evidence))
if old:  # prompts as basal had them: every prompt at once, each its own tuple of fresh ints
    import basal.core.engine.pipeline as pipeline_module
    tk = model.tokenizer
    encode_all = lambda texts: tk._tk.encode_batch(list(texts), add_special_tokens=False)
    tk.encode_stream = lambda texts: iter([tuple(e.ids) for e in encode_all(texts)])
    pipeline_module.PromptSharer = lambda: lambda state, ids: tuple(ids)
pipe = Pipeline(model, TorchBackend.load(model))
state = "Customer wrote: the parcel arrived damaged and I want a refund. " * 100
qs = {f"q{i}": {"type": "noul", "instructions": f"Is it case {i}?"} for i in range(questions)}
if evidence:
    qs = {name: {**q, "evidence": True} for name, q in qs.items()}
raw = {"model": "m", "state": state, "questions": qs}
def parse(raw):
    if evidence:
        return parse_basal(raw, lambda m: m, serves_evidence=lambda _m: True)
    return parse_systemone(raw, lambda m: m)
pipe.decide(parse({**raw, "questions": {"q0": qs["q0"]}}))  # warm up
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out = {"warm_mb": peak()}
req = parse(raw)
rounds = pipe.first_round(req)
out["tokenized_mb"] = peak()
stats = Stats()
forwards = pipe.pack(rounds.tokenized, stats)
out["packed_mb"] = peak()
logits = run_to_end(pipe.forward(rounds.tokenized, forwards, stats))
out["forward_mb"] = peak()
pipe.advance(rounds, logits)
pipe.respond(rounds, 0.0)
out["answered_mb"] = peak()
out["prompt_tokens"], out["packed_tokens"] = stats.prompt_tokens, stats.packed_tokens
import json
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=1024)
    ap.add_argument("--evidence", action="store_true", help="every question asks for evidence (/v1/basal)")
    ap.add_argument("--out", default=None, help="default: bench/results/question_memory[_evidence].json")
    a = ap.parse_args()
    rows = {}
    for name in ("old", "new"):
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(a.questions), name, "evidence" if a.evidence else "plain"],
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        )
        rows[name] = json.loads(done.stdout.strip().splitlines()[-1])
    with_evidence = ", evidence on every question" if a.evidence else ""
    print(f"\n{a.questions} noul questions on one 6.5 KB state{with_evidence}, demo model; peak RSS (MB) per step\n")
    print("| prompts | warm | tokenized | packed | forward | answered | prompt tokens | packed tokens |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in rows.items():
        label = "before (one batch, a tuple per prompt)" if name == "old" else "after (shared per state)"
        print(
            f"| {label} | {r['warm_mb']:.0f} | {r['tokenized_mb']:.0f} | {r['packed_mb']:.0f} | {r['forward_mb']:.0f}"
            f" | {r['answered_mb']:.0f} | {r['prompt_tokens']} | {r['packed_tokens']} |"
        )
    out = Path(a.out or f"bench/results/question_memory{'_evidence' if a.evidence else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"questions": a.questions, "evidence": a.evidence, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
