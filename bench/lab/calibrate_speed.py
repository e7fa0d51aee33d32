"""`basal calibrate` through the batch path against the same requests sent online one by one.

    python -m bench.lab.calibrate_speed            # 1000 requests, 5000 questions, 200 states, mini cut to 2
    python -m bench.lab.calibrate_speed --requests 100 --states 20 --preset demo     # a quick look

One labelled file: `--requests` /v1/systemone requests over `--states` states (about `--state-tokens` tokens each),
`--questions` questions per request (choice, noul and score in turn; each request words its questions its own way,
so no two requests are equal), random gold answers. Then, in this order on one machine:
1. a `basal serve` child gets every request, one after another over one keep-alive client: requests/s;
2. `basal calibrate` (a child) runs the same file: the time of its run through the batch path (the line it prints),
   and the whole command (model load included);
3. the fit and the certification alone, in this process, from the records `basal calibrate` left.
The ratio online / batch path is the number to read; the machine's load is printed with it (a shared machine is
noisy: compare ratios within one run, not across runs). Last, the ceiling: this machine's best f32 GEMM rate
(torch, the server's thread count, measured in the same run) and the GEMM work of a computed token (every layer's
projections but the last's, which computes keys and values only; readouts, attention and norms left out) give the
shortest time any batch path could take for its tokens, and so the largest ratio it could reach against the online
time just measured. Each side's tokens computed (the server's
`basal_packed_tokens_total`, the count `basal calibrate` prints) and the distinct states' tokens say how much of
the work sharing could ever remove: online, a request's questions share its state, and the state cache keeps it
for the next request on that state.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from basal.benchsuite.workloads import questions, state_of_tokens
from basal.core.model.model_dir import LlamaConfig, ModelDir
from basal.core.model.synth import synth_model
from bench.compare.online_with_batch import start
from bench.lab.http_speed import metric_total


def labelled_file(model: ModelDir, path: Path, requests: int, states: int, per: int, tokens: int) -> Path:
    rng = np.random.default_rng(0)
    texts = [state_of_tokens(model.tokenizer, tokens, "en", s) for s in range(states)]
    lines = []
    for n in range(requests):
        qs = questions(per, "en", seed=n)
        for name, q in qs.items():
            q["instructions"] = f"{q['instructions']} (case {n})"
            if q["type"] == "noul":
                q["gold"] = bool(rng.integers(2))
            else:
                options = q["criteria"]
                keys = list(options) if isinstance(options, dict) else [str(i) for i in range(len(options))]
                q["gold"] = str(rng.choice(keys))
            qs[name] = q
        lines.append(
            {"id": f"r{n}", "group": f"s{n % states}", "model": "m", "state": texts[n % states], "questions": qs}
        )
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def computed_tokens(client: httpx.Client, url: str) -> int:
    """The server's tokens computed so far (`basal_packed_tokens_total`, every model and lane)."""
    text = client.get(f"{url}/metrics").raise_for_status().text
    return int(metric_total(text, "basal_packed_tokens_total"))


def online(model_dir: Path, labelled: Path) -> tuple[float, int, int]:
    """Every request over HTTP, one after another: (seconds, requests, tokens computed)."""
    proc, url = start(str(model_dir), labelled.parent / "serve", ["--metrics"], None)
    try:
        bodies = []
        for raw in labelled.read_text().splitlines():
            body = json.loads(raw)
            body.pop("id"), body.pop("group")
            for q in body["questions"].values():
                q.pop("gold")
            body["model"] = "jev-latest"
            bodies.append(body)
        with httpx.Client(timeout=600) as client:
            warm = dict(bodies[0], state=f"(warm-up) {bodies[0]['state']}")  # a state of its own: none cached
            client.post(f"{url}/v1/systemone", json=warm).raise_for_status()
            tokens = computed_tokens(client, url)
            started = time.perf_counter()
            for body in bodies:
                client.post(f"{url}/v1/systemone", json=body).raise_for_status()
            seconds = time.perf_counter() - started
            return seconds, len(bodies), computed_tokens(client, url) - tokens
    finally:
        proc.terminate()
        proc.wait(60)


def batch(model_dir: Path, labelled: Path, out: Path) -> tuple[float, float, int]:
    """`basal calibrate` as a user runs it: (seconds of the run through the batch path, seconds of the command,
    tokens computed)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "basal", "calibrate", str(labelled), "--model", str(model_dir),
                           "-o", str(out), "--quiet"], capture_output=True, text=True, check=True)  # fmt: skip
    total = time.perf_counter() - started
    m = re.search(r"labelled answers in ([0-9.]+) s \(([0-9]+) tokens computed\)", done.stderr)
    assert m, done.stderr
    return float(m.group(1)), total, int(m.group(2))


def state_tokens(model: ModelDir, labelled: Path) -> int:
    """Tokens of the distinct states, each tokenized alone: what sharing states across requests can save at most."""
    states = {json.loads(raw)["state"] for raw in labelled.read_text().splitlines()}
    return sum(len(model.tokenizer.encode(s)) for s in states)


def fit_alone(model_dir: Path, labelled: Path, out: Path) -> float:
    from basal import __version__
    from basal.calibration.calibrate import Settings, calibration_document
    from basal.calibration.collect import observed, read_records
    from basal.calibration.labelled import read_labelled

    model = ModelDir.load(model_dir)
    data = read_labelled(labelled, "systemone", model.name)
    answers = read_records(out.with_name(out.name + ".records.jsonl"), {line.key for line in data.lines})
    obs = observed(data, answers)
    started = time.perf_counter()
    calibration_document(data, obs, model.calibration, {"name": model.name}, Settings(), __version__)
    return time.perf_counter() - started


def gemm_flops_per_token(cfg: LlamaConfig) -> int:
    """GEMM floating-point operations of one computed (non-readout) token: the full projections of every layer but
    the last, whose keys and values alone run at every token (its queries, output and MLP run at the readouts)."""
    d, hd = cfg.hidden_size, cfg.head_dim
    q, kv, f = cfg.num_attention_heads * hd, 2 * cfg.num_key_value_heads * hd, cfg.intermediate_size
    layer = d * (q + kv) + q * d + d * 2 * f + f * d  # qkv, o, gate/up, down: multiply-adds
    return 2 * ((cfg.num_hidden_layers - 1) * layer + d * kv)


def gemm_peak(cfg: LlamaConfig, rows: tuple[int, ...] = (512, 2048, 4096), reps: int = 5) -> float:
    """The best f32 GEMM rate (FLOP/s) torch reaches here on the model's widest projection (gate/up), plain calls
    with no row chunking, at the thread count a server uses (torch's default): a ceiling, not what basal runs."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    w, best = torch.randn(2 * f, d), 0.0
    for m in rows:
        x = torch.randn(m, d)
        torch.nn.functional.linear(x, w)  # warm-up
        for _ in range(reps):
            started = time.perf_counter()
            torch.nn.functional.linear(x, w)
            best = max(best, 2 * m * d * 2 * f / (time.perf_counter() - started))
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000, help="labelled requests (default 1000)")
    ap.add_argument("--states", type=int, default=200, help="states they are about (default 200)")
    ap.add_argument("--questions", type=int, default=5, help="questions per request (default 5)")
    ap.add_argument("--state-tokens", type=int, default=120, help="tokens of a state (default 120)")
    ap.add_argument("--preset", default="mini", help="synthetic preset (default mini)")
    ap.add_argument("--layers", type=int, default=2, help="layers of the preset (default 2)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = synth_model(root / "model", a.preset, a.layers, seed=0)
        model = ModelDir.load(model_dir)
        labelled = labelled_file(model, root / "labelled.jsonl", a.requests, a.states, a.questions, a.state_tokens)
        print(f"load before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {a.preset} cut to {a.layers} layers, "
              f"{a.requests} requests x {a.questions} questions over {a.states} states", flush=True)  # fmt: skip
        seconds_online, n, online_tokens = online(model_dir, labelled)
        print(f"online, one by one: {n} requests in {seconds_online:.1f} s ({n / seconds_online:.1f} requests/s), "
              f"{online_tokens} tokens computed ({online_tokens / seconds_online:.0f}/s)")  # fmt: skip
        out = root / "CALIBRATION.custom.json"
        run_s, command_s, batch_tokens = batch(model_dir, labelled, out)
        print(f"basal calibrate: run {run_s:.1f} s ({n / run_s:.1f} requests/s), whole command {command_s:.1f} s, "
              f"{batch_tokens} tokens computed ({batch_tokens / run_s:.0f}/s)")  # fmt: skip
        states = state_tokens(model, labelled)
        print(f"tokens: online computes {online_tokens / batch_tokens:.2f}x the batch path's; the distinct "
              f"states are {states} tokens, {states / batch_tokens:.1%} of the batch path's, so its questions' own "
              f"tokens (which no sharing removes) are {1 - states / batch_tokens:.1%}")  # fmt: skip
        print(f"fit and certification alone: {fit_alone(model_dir, labelled, out):.2f} s")
        print(f"batch path vs online one by one: {seconds_online / run_s:.2f}x faster (run phase), "
              f"{seconds_online / command_s:.2f}x (whole command, model load included)")  # fmt: skip
        flops, peak = gemm_flops_per_token(model.config), gemm_peak(model.config)
        floor_s = batch_tokens * flops / peak
        print(f"ceiling: {flops / 1e6:.1f} MFLOP of GEMMs a computed token, best f32 GEMM here {peak / 1e9:.0f} "
              f"GFLOP/s "
              f"({torch.get_num_threads()} threads); the batch path ran its GEMMs at "
              f"{batch_tokens * flops / run_s / peak:.0%} of that, online at "
              f"{online_tokens * flops / seconds_online / peak:.0%}; its {batch_tokens} tokens take at least "
              f"{floor_s:.1f} s at the peak, so no batch path can be more than {seconds_online / floor_s:.2f}x "
              f"faster than this online run")  # fmt: skip
        print(f"load after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
