"""basal over HTTP against a naive transformers baseline on an acceptance-style request set, same weights, same
run, on the CPU.

    python -m bench.compare.cpu_http                       # mini shapes cut to 4 layers, f32, 3 alternating rounds
    python -m bench.compare.cpu_http --layers 2 --reps 1   # quicker

The request set (`REQUEST_SET`) mixes single- and multi-question requests on three states (PL and EN, ~300 to
~1000 tokens), sent one at a time to `basal serve` (its own process, loopback, JSON and tokenization included).
The baseline is transformers' `LlamaForCausalLM` (f32, SDPA, `logits_to_keep=1`) running every option-order
prompt of every question separately and whole — the upstream-1.0 style — in this process. Rounds alternate
(basal, transformers, basal, ...) so both see the same machine load; the ratio is the median transformers
round over the median basal round. The decisions of both are compared (the argmax of the letter logits for
transformers, the `answers` of basal).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from basal.backends.cuda.cpu.gemm_chunks import _cpu_model
from basal.benchsuite.workloads import questions, state_of_tokens
from bench.lab.cpu_speed import cpu_flags
from bench.lab.http_speed import healthy
from tests.ports import free_port


@dataclass(frozen=True)
class RequestSet:
    """(state index, number of questions, question seed) per request; states as (tokens, language, seed)."""

    states: tuple[tuple[int, str, int], ...]
    requests: tuple[tuple[int, int, int], ...]

    def bodies(self, tokenizer, model: str) -> list[dict]:
        states = [state_of_tokens(tokenizer, n, lang, seed) for n, lang, seed in self.states]
        return [
            {"model": model, "state": states[s], "questions": questions(n, self.states[s][1], seed)}
            for s, n, seed in self.requests
        ]


REQUEST_SET = RequestSet(
    states=((500, "pl", 11), (300, "en", 12), (1000, "pl", 13)),
    requests=((0, 1, 1), (1, 1, 2), (2, 1, 3), (0, 5, 4), (1, 14, 5), (2, 3, 6), (1, 1, 7), (0, 8, 8)),
)


def _serve(model_dir: Path, dtype: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "basal",
            "serve",
            "--model",
            str(model_dir),
            "--addr",
            f"127.0.0.1:{port}",
            "--dtype",
            dtype,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, healthy(proc, f"http://127.0.0.1:{port}", timeout_s=300)


def basal_round(client: httpx.Client, url: str, bodies: list[dict]) -> list[float]:
    """Seconds per request, each sent alone over HTTP."""
    times = []
    for body in bodies:
        t = time.perf_counter()
        r = client.post(f"{url}/v1/systemone", json=body, timeout=600)
        r.raise_for_status()
        times.append(time.perf_counter() - t)
    return times


def transformers_round(hf, prompts: list[list[list[int]]], letter_ids: list[int]) -> list[float]:
    """Seconds per request: every prompt of every question of the request alone, reading the letter logits."""
    times = []
    with torch.inference_mode():
        for request in prompts:
            t = time.perf_counter()
            for p in request:
                hf(torch.tensor([p]), logits_to_keep=1).logits[0, -1, letter_ids].tolist()
            times.append(time.perf_counter() - t)
    return times


def main() -> None:
    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.pipeline import Pipeline
    from basal.core.model.model_dir import ModelDir
    from basal.core.model.synth import synth_model
    from basal.core.request.dialects import parse_systemone
    from bench.compare.tree_speed import transformers_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3, help="alternating rounds of each engine (after a warm-up)")
    ap.add_argument("--out", default="bench/results/cpu_http.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = synth_model(Path(tmp) / "mini", "mini", layers=a.layers)
        model = ModelDir.load(path)
        bodies = REQUEST_SET.bodies(model.tokenizer, model.name)
        # the prompts transformers runs: basal's own tokenization (this backend only tokenizes, and is freed)
        pipeline = Pipeline(model, TorchBackend.load(model, dtype="f32", gemm_chunks="fixed"))
        prompts = []  # per request, every prompt of every question
        for body in bodies:
            request = parse_systemone(body, lambda m: m)
            prompts.append([list(p) for t in pipeline.tokenize(request.questions) for p in t.prompts])
        letter_ids = list(pipeline.letter_ids)
        del pipeline
        hf = transformers_model(path)
        proc, url = _serve(path, "f32")
        try:
            with httpx.Client() as client:
                basal_round(client, url, bodies[:2])  # warm-up
                transformers_round(hf, prompts[:2], letter_ids)
                basal_rounds, hf_rounds = [], []
                for _ in range(a.reps):
                    basal_rounds.append(basal_round(client, url, bodies))
                    hf_rounds.append(transformers_round(hf, prompts, letter_ids))
        finally:
            proc.terminate()
            proc.wait(30)
    n_q = sum(len(b["questions"]) for b in bodies)
    basal_s, hf_s = [sum(r) for r in basal_rounds], [sum(r) for r in hf_rounds]
    ratio = statistics.median(hf_s) / statistics.median(basal_s)
    kinds = {}
    for kind, keep in (("single-question requests", lambda n: n == 1), ("multi-question requests", lambda n: n > 1)):
        idx = [i for i, b in enumerate(bodies) if keep(len(b["questions"]))]
        b = statistics.median(sum(r[i] for i in idx) for r in basal_rounds)
        h = statistics.median(sum(r[i] for i in idx) for r in hf_rounds)
        kinds[kind] = {"requests": len(idx), "basal_s": b, "transformers_s": h, "ratio": h / b}
    result = {
        "machine": {
            "platform": platform.platform(),
            "cpu": _cpu_model(),
            "flags": cpu_flags(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "torch": torch.__version__,
        "model": {"preset": "mini", "layers": a.layers, "dtype": "f32"},
        "requests": len(bodies),
        "questions": n_q,
        "prompts": sum(len(p) for p in prompts),
        "basal_http_s": basal_rounds,
        "transformers_s": hf_rounds,
        "ratio": ratio,
        "by_kind": kinds,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    print(
        f"mini cut to {a.layers} layers, f32: {len(bodies)} requests, {n_q} questions, {result['prompts']} prompts; "
        f"basal over HTTP {statistics.median(basal_s):.2f} s ({n_q / statistics.median(basal_s):.2f} decisions/s), "
        f"transformers {statistics.median(hf_s):.2f} s ({n_q / statistics.median(hf_s):.2f} decisions/s): "
        f"{ratio:.2f}x  (rounds: basal {[round(x, 2) for x in basal_s]}, transformers {[round(x, 2) for x in hf_s]}, "
        f"load average {os.getloadavg()[0]:.1f})"
    )
    for kind, k in kinds.items():
        print(
            f"  {kind} ({k['requests']}): basal {k['basal_s']:.2f} s, "
            f"transformers {k['transformers_s']:.2f} s: {k['ratio']:.2f}x"
        )


if __name__ == "__main__":
    main()
