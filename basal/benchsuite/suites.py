"""The suites. Each runs basal and its baselines on the same weights in the same run, and reports ratios:

    single       the basal-bench method: 44 items, both orders, one request at a time, 5 warm-ups discarded
    latency      one question on states of 128 / 512 / 4096 tokens, sequential
    scoring      5 / 25 / 50 questions on one 512-token state
    throughput   4 concurrent clients sending requests of 100 questions on 512 / 1024 / 4096-token states
    concurrency  one question on a 512-token state over HTTP, 1..32 concurrent clients
    mixed        a mixed workload (short states, multi-question, long documents): HRRN vs FIFO, long lane on/off

Baselines: transformers' LlamaForCausalLM running every option-order prompt separately (upstream-1.0 style; on
CUDA on basal's device in basal's dtype, elsewhere on the CPU in f32), and basal with tree packing off (one
question per row). `quick` shrinks counts and sizes for a 2-core CPU.

Against the machine's limit: at the start of the run `Bench` measures the library's GEMM rate on the model's own
weight shapes (`limits.measure`, torch backends), and the in-process suites report each basal row's achieved
fraction of it ("of GEMM limit": useful FLOPs from the packed tokens and the model shape, per second, over that
rate).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from basal.backends.load import load_backend
from basal.benchsuite import limits
from basal.benchsuite.report import SuiteResult, pct, stats_ms
from basal.benchsuite.workloads import bench_items, questions, state_of_tokens
from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.engine.scheduler import Policy
from basal.core.model.model_dir import ModelDir
from basal.core.request.dialects import parse_systemone
from basal.core.request.plan import DecisionRequest
from basal.progress import Progress


@dataclass
class Bench:
    model: ModelDir
    backend_name: str = "auto"
    dtype: str | None = None
    quick: bool = True
    transformers: bool = True
    progress: Progress | None = None  # one step per measured run (or batch of runs) of the suite running now

    def step(self, label: str) -> AbstractContextManager[None]:
        return self.progress.step(label) if self.progress is not None else nullcontext()

    def __post_init__(self) -> None:
        self.backend = load_backend(self.model, self.backend_name, self.dtype)
        self.tree = Pipeline(self.model, self.backend)
        self.flat = Pipeline(self.model, self.backend, share_across_questions=False)
        self._hf = None
        self.limit = (
            limits.measure(self.model.config, self.backend.dtype, self.backend.device)
            if self.backend.name == "torch"
            else None
        )

    def fraction(self, engine: str, requests: list[DecisionRequest], seconds: float) -> float | str:
        """Achieved fraction of the measured GEMM rate of a basal variant that answered `requests` in `seconds`."""
        if self.limit is None or not engine.startswith("basal"):
            return "—"
        pipeline = self.flat if engine.endswith("tree off") else self.tree
        flops = sum(limits.request_flops(pipeline, r).total for r in requests)
        return self.limit.fraction(flops, seconds)

    def plan(self, body: dict) -> DecisionRequest:
        return parse_systemone({**body, "model": self.model.name}, lambda m: m)

    def timed(self, fn: Callable[[], object]) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    def basal(self, request: DecisionRequest, tree: bool = True) -> float:
        return self.timed(lambda: (self.tree if tree else self.flat).decide(request))

    @property
    def baseline_placement(self) -> tuple[str, str]:
        """(device, dtype) of the transformers baseline: where basal runs on CUDA, in its dtype, so the ratio
        compares engines rather than machines; elsewhere the CPU in f32 (transformers has no MLX path)."""
        device = str(self.backend.device)
        if device.startswith("cuda"):
            return device, self.backend.dtype
        return "cpu", "f32"

    def hf(self, request: DecisionRequest) -> float:
        """transformers, every option-order prompt run whole and alone (SDPA, logits at the last token), on
        `baseline_placement`."""
        import torch

        from basal.backends.cuda.model import TORCH_DTYPE

        device, dtype = self.baseline_placement
        if self._hf is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from transformers import LlamaForCausalLM

            self._hf = LlamaForCausalLM.from_pretrained(
                self.model.path, dtype=TORCH_DTYPE[dtype], attn_implementation="sdpa"
            ).to(device).eval()  # fmt: skip
        prompts = [p for t in self.tree.tokenize([q for q in request.questions if q.needs_model]) for p in t.prompts]
        letters = self.tree.letter_ids

        def run() -> None:
            with torch.inference_mode():
                for p in prompts:  # each prompt's letter logits read back to the host, as basal's are
                    self._hf(torch.tensor([p], device=device), logits_to_keep=1).logits[0, -1, letters].cpu()

        return self.timed(run)

    def variants(self, request_count_ok: bool = True) -> list[tuple[str, Callable[[DecisionRequest], float]]]:
        out = [("basal (tree)", lambda r: self.basal(r, True)), ("basal, tree off", lambda r: self.basal(r, False))]
        if self.transformers and request_count_ok:
            out.append(("transformers, prompt by prompt", self.hf))
        return out

    def engines(self, schedule: Policy = Policy.HRRN, long_tokens: int = 4096, tree: bool = True) -> Engines:
        metrics = Metrics()
        pipeline = self.tree if tree else self.flat
        engine = Engine(self.model.name, pipeline, Gate(), metrics, EngineSettings(8192, schedule, long_tokens))
        engines = Engines({self.model.name: engine}, self.model.name, metrics)
        engines.start()
        return engines


def _ratio_rows(rows: list[list[object]], key_col: int, value_col: int, baseline: str) -> None:
    """Append 'vs baseline' = baseline time / this time, per group of rows sharing column `key_col`."""
    base = {r[key_col]: r[value_col] for r in rows if r[1] == baseline}
    for r in rows:
        b = base.get(r[key_col])
        r.append(f"{b / r[value_col]:.2f}×" if b else "—")


def single(b: Bench) -> SuiteResult:
    items = [b.plan(x) for x in bench_items(44, seed=0)]
    rows, samples = [], {}
    for name, run in b.variants():
        with b.step(f"single: {name}, 5 warm-ups"):
            for r in items[:5]:
                run(r)  # warm-ups, discarded
        measured = []
        for i, r in enumerate(items[5:]):
            with b.step(f"single: {name}, item {i + 1}/{len(items) - 5}"):
                measured.append(run(r))
        s = stats_ms(measured)
        samples[name] = measured
        frac = b.fraction(name, items[5:], sum(measured))
        rows.append(["44 items", name, s["p50_ms"], s["p90_ms"], 1000 / s["p50_ms"], frac])
    _ratio_rows(rows, 0, 2, "transformers, prompt by prompt")
    return SuiteResult(
        "single",
        ["workload", "engine", "median ms", "p90 ms", "decisions/s", "of GEMM limit", "speed vs transformers"],
        rows,
        samples,
        notes="39 measured single-question requests after 5 discarded warm-ups.",
    )


def latency(b: Bench) -> SuiteResult:
    sizes = (128, 512, 2048) if b.quick else (128, 512, 4096)
    reps = {128: 10, 512: 8, 2048: 3, 4096: 5} if b.quick else {128: 30, 512: 30, 4096: 10}
    rows, samples = [], {}
    for tokens in sizes:
        request = b.plan(
            {"state": state_of_tokens(b.model.tokenizer, tokens, "en", tokens), "questions": questions(1, "en", 1)}
        )
        for name, run in b.variants():
            if name.startswith("basal, tree off"):
                continue  # one question: nothing to share across questions, identical to the tree
            run(request)
            measured = []
            for i in range(reps[tokens]):
                with b.step(f"latency: {name}, {tokens} tokens, run {i + 1}/{reps[tokens]}"):
                    measured.append(run(request))
            s = stats_ms(measured)
            samples[f"{name}, {tokens} tokens"] = measured
            frac = b.fraction(name, [request], s["p50_ms"] / 1000)
            rows.append([tokens, name, s["p50_ms"], s["p90_ms"], s["p99_ms"], s["max_ms"], frac])
    _ratio_rows(rows, 0, 2, "transformers, prompt by prompt")
    return SuiteResult(
        "latency",
        ["state tokens", "engine", "p50 ms", "p90 ms", "p99 ms", "max ms", "of GEMM limit", "speed vs transformers"],
        rows,
        samples,
    )


def scoring(b: Bench) -> SuiteResult:
    state = state_of_tokens(b.model.tokenizer, 512, "pl", 7)
    reps = 2 if b.quick else 5
    rows, samples = [], {}
    for n in (5, 25, 50):
        request = b.plan({"state": state, "questions": questions(n, "pl", n)})
        for name, run in b.variants(request_count_ok=not (b.quick and n == 50)):
            # the baselines take tens of seconds per request on a CPU: the quick run times them once, no warm-up
            slow = b.quick and (name.startswith("transformers") or (name.endswith("tree off") and n >= 25))
            if not slow:
                with b.step(f"scoring: {name}, {n} questions, warm-up"):
                    run(request)
            measured = []
            for i in range(1 if slow else reps):
                with b.step(f"scoring: {name}, {n} questions, run {i + 1}/{1 if slow else reps}"):
                    measured.append(run(request))
            s = stats_ms(measured)
            samples[f"{name}, {n} questions"] = measured
            rate = n / (s["p50_ms"] / 1000)
            frac = b.fraction(name, [request], s["p50_ms"] / 1000)
            rows.append([n, name, s["p50_ms"], s["p90_ms"], s["p99_ms"], s["max_ms"], rate, frac])
    _ratio_rows(rows, 0, 2, "basal, tree off")
    return SuiteResult(
        "scoring",
        [
            "questions",
            "engine",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "decisions/s",
            "of GEMM limit",
            "speed vs tree off",
        ],
        rows,
        samples,
        notes="The quick run times the baselines once (no warm-up) where they take tens of seconds, and leaves "
        "transformers out at 50 questions.",
    )


def _clients(engines: Engines, requests: list[DecisionRequest], clients: int) -> tuple[list[float], float]:
    async def client(i: int) -> list[float]:
        out = []
        for r in requests[i::clients]:
            t = time.perf_counter()
            await engines.run(r)
            out.append(time.perf_counter() - t)
        return out

    async def main():
        t0 = time.perf_counter()
        parts = await asyncio.gather(*(client(i) for i in range(clients)))
        return [x for p in parts for x in p], time.perf_counter() - t0

    return asyncio.run(main())


def throughput(b: Bench) -> SuiteResult:
    n_q = 10 if b.quick else 100
    sizes = (512, 1024, 2048) if b.quick else (512, 1024, 4096)
    rows = []
    for tokens in sizes:
        reqs = [
            b.plan(
                {
                    "state": state_of_tokens(b.model.tokenizer, tokens, "en" if i % 2 else "pl", i),
                    "questions": questions(n_q, "en" if i % 2 else "pl", i),
                }
            )
            for i in range(4)
        ]
        for name, tree in (("basal (tree)", True), ("basal, tree off", False)):
            with b.step(f"throughput: {name}, 4 clients x {n_q} questions on {tokens} tokens"):
                engines = b.engines(tree=tree)
                _, wall = _clients(engines, reqs, 4)
                engines.close()
            rows.append([tokens, name, 4 * n_q / wall, b.fraction(name, reqs, wall)])
        if b.transformers and (tokens == sizes[0] or not b.quick):
            with b.step(f"throughput: transformers, 4 requests x {n_q} questions on {tokens} tokens"):
                wall = sum(b.hf(r) for r in reqs)
            rows.append([tokens, "transformers, prompt by prompt", 4 * n_q / wall, "—"])
    base = {r[0]: r[2] for r in rows if r[1] == "basal, tree off"}
    for r in rows:
        r.append(f"{r[2] / base[r[0]]:.2f}×")
    return SuiteResult(
        "throughput",
        ["state tokens", "engine", "decisions/s", "of GEMM limit", "vs tree off"],
        rows,
        notes=f"4 concurrent clients, one request of {n_q} questions each, in-process engine; transformers runs "
        "its requests in sequence" + (", only on the smallest state in the quick run." if b.quick else "."),
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def concurrency(b: Bench) -> SuiteResult:
    import httpx

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "basal", "serve", "--model", str(b.model.path), "--addr", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with b.step("concurrency: starting basal serve"):
            for _ in range(600):
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
        body = json.dumps(
            {
                "model": b.model.name,
                "state": state_of_tokens(b.model.tokenizer, 512, "en", 3),
                "questions": questions(1, "en", 3),
            }
        ).encode()
        rows, samples, curve = [], {}, []
        per = 4 if b.quick else 16
        for clients in (1, 2, 4, 8, 16, 32):

            def client(_: int) -> list[float]:
                out = []
                with httpx.Client(base_url=url, timeout=600) as c:
                    for _ in range(per):
                        t = time.perf_counter()
                        r = c.post("/v1/systemone", content=body, headers={"content-type": "application/json"})
                        assert r.status_code == 200
                        out.append(time.perf_counter() - t)
                return out

            t0 = time.perf_counter()
            with b.step(f"concurrency: {clients} client(s) x {per} requests"), ThreadPoolExecutor(clients) as pool:
                lat = [x for part in pool.map(client, range(clients)) for x in part]
            wall = time.perf_counter() - t0
            s = stats_ms(lat)
            samples[f"{clients} clients"] = lat
            curve.append((clients, len(lat) / wall))
            rows.append([clients, s["p50_ms"], s["p90_ms"], s["p99_ms"], s["max_ms"], len(lat) / wall])
        single = rows[0][5]
        for r in rows:
            r.append(f"{r[5] / single:.2f}×")
    finally:
        server.terminate()
        server.wait(30)
    return SuiteResult(
        "concurrency",
        ["clients", "p50 ms", "p90 ms", "p99 ms", "max ms", "requests/s", "vs 1 client"],
        rows,
        samples,
        {"requests/s": curve},
        notes="One question on a 512-token state over HTTP (basal serve, httpx clients): JSON, "
        "tokenization and batching included.",
    )


def _mixed_workload(b: Bench, n: int, seed: int = 0) -> list[tuple[str, DecisionRequest]]:
    rng = random.Random(seed)
    long_sizes = (1024, 2048) if b.quick else (1024, 4096, 16000)
    out = []
    for i in range(n):
        x = rng.random()
        lang = "pl" if i % 2 else "en"
        if x < 0.6:
            kind, tokens, n_q = "short", 60, 1
        elif x < 0.85:
            kind, tokens, n_q = "short", 60, rng.choice([2, 3, 14])
        else:
            kind, tokens, n_q = "document", rng.choice(long_sizes), rng.randint(1, 5)
        out.append(
            (
                kind,
                b.plan(
                    {"state": state_of_tokens(b.model.tokenizer, tokens, lang, i), "questions": questions(n_q, lang, i)}
                ),
            )
        )
    return out


def mixed(b: Bench) -> SuiteResult:
    workload = _mixed_workload(b, 24 if b.quick else 120)
    rate = 1.0 if b.quick else 8.0  # requests/s: busy but not overloaded (2 CPU cores quick; a GPU full)
    rows, samples = [], {}
    for schedule in (Policy.HRRN, Policy.FIFO):
        for long_tokens in (4096 if not b.quick else 1024, 0):
            engines = b.engines(schedule, long_tokens)

            async def main(engines: Engines):
                lat: dict[str, list[float]] = {"short": [], "document": []}
                rng = random.Random(1)

                async def one(kind, r, delay):
                    await asyncio.sleep(delay)
                    t = time.perf_counter()
                    await engines.run(r)
                    lat[kind].append(time.perf_counter() - t)

                t0, delay, tasks = time.perf_counter(), 0.0, []
                for kind, r in workload:
                    tasks.append(asyncio.create_task(one(kind, r, delay)))
                    delay += rng.expovariate(rate)  # open (Poisson) arrivals
                await asyncio.gather(*tasks)
                return lat, time.perf_counter() - t0

            name = f"{schedule.value}, long lane {'on' if long_tokens else 'off'}"
            with b.step(f"mixed: {name}, {len(workload)} requests at {rate:g}/s"):
                lat, wall = asyncio.run(main(engines))
            engines.close()
            samples[f"{name} (short)"] = lat["short"]
            rows.append(
                [
                    name,
                    pct(lat["short"], 50) * 1000,
                    pct(lat["short"], 99) * 1000,
                    pct(lat["document"], 50) * 1000,
                    60 * len(workload) / wall,
                ]
            )
    base = rows[-1][1]
    for r in rows:
        r.append(f"{base / r[1]:.2f}×")
    return SuiteResult(
        "mixed",
        [
            "scheduler",
            "short p50 ms",
            "short p99 ms",
            "document p50 ms",
            "requests/min",
            "short p50 vs fifo without long lane",
        ],
        rows,
        samples,
        notes=f"Open Poisson arrivals ({rate:g}/s): 60% one question on a short state, 25% 2-14 questions "
        "on a short state, 15% 1-5 questions on a long document.",
    )


SUITES: dict[str, Callable[[Bench], SuiteResult]] = {
    "single": single,
    "latency": latency,
    "scoring": scoring,
    "throughput": throughput,
    "concurrency": concurrency,
    "mixed": mixed,
}


def model_shape(model: ModelDir) -> dict[str, object]:
    c = model.config
    return {
        "name": model.name,
        "layers": c.num_hidden_layers,
        "hidden": c.hidden_size,
        "intermediate": c.intermediate_size,
        "heads": c.num_attention_heads,
        "kv_heads": c.num_key_value_heads,
        "synthetic": model.synthetic,
        "path": str(Path(model.path)),
    }


__all__ = ["SUITES", "Bench", "model_shape"]
