"""The two caches, measured: the state cache on an agent loop, the answer cache on exact repeats, the state cache's
memory under a flood of distinct states.

    python -m bench.state_cache_speed                    # all three (mini shapes cut to 4 layers, f32, torch CPU)
    python -m bench.state_cache_speed --parts agent --state-tokens 512   # quicker

- agent: one state of ~2,000 tokens, 10 requests one after another, each one different question on it; the median
  latency of requests 2-10 with the state cache off and on (the first request of "on" computes the state: a miss).
  Off and on run on one backend, one after the other, in the same process: read the ratio.
- repeats: one request sent again and again over HTTP (in process) with the exact-answer cache on: the server's
  time of a hit (`x-basal-total-ms`), median of 200.
- memory: 10,000 distinct states (one question each) through a state cache of 256 MiB, on the demo model's shapes
  (tiny, so that 10,000 states compute in about a minute; the budget logic does not depend on shapes): the bytes
  the cache counts, the backend's tensors, and the process's resident memory before and after.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

from basal.backends.cuda.backend import TorchBackend
from basal.benchsuite.workloads import state_of_tokens
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from basal.core.model.prompt import Item
from basal.core.model.synth import demo_model, synth_model
from basal.core.packing.passes import run_to_end
from basal.core.request.dialects import parse_basal
from bench import report

QUESTIONS = [f"Is point {i} of the complaint about the {topic}?" for i, topic in enumerate(
    ["delivery", "refund", "invoice", "price", "damage", "courier", "deadline", "payment", "address", "warranty"]
)]  # fmt: skip


def rss_mb() -> float:
    """Resident memory of this process now, MiB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def agent(model: ModelDir, state_tokens: int, requests: int) -> dict:
    backend = TorchBackend.load(model, dtype="f32")
    state = state_of_tokens(model.tokenizer, state_tokens, "en", seed=0)
    resolve = lambda _name: model.name  # noqa: E731
    plans = [
        parse_basal({"state": state, "questions": {"q": {"type": "noul", "instructions": q}}}, resolve)
        for q in QUESTIONS[:requests]
    ]
    out = {}
    for name, mb in (("off", 0), ("on", 1024)):
        pipeline = Pipeline(model, backend, state_cache_mb=mb)
        times = []
        for plan in plans:
            t0 = time.perf_counter()
            pipeline.decide(plan)
            times.append(time.perf_counter() - t0)
        out[name] = times
        if pipeline.state_cache is not None:
            out["counts"] = vars(pipeline.state_cache.counts)
            pipeline.state_cache.clear()
    off, on = statistics.median(out["off"][1:]), statistics.median(out["on"][1:])
    return {
        "state_tokens": len(model.tokenizer.encode(state)),
        "requests": requests,
        "off_ms": [t * 1000 for t in out["off"]],
        "on_ms": [t * 1000 for t in out["on"]],
        "median_2_on_ms": on * 1000,
        "median_2_off_ms": off * 1000,
        "speedup": off / on,
        "state_cache": out["counts"],
    }


def repeats(model: ModelDir, n: int) -> dict:
    from litestar.testing import TestClient

    from basal.api.app import create_app
    from basal.api.settings import ApiSettings
    from basal.core.engine.answer_cache import AnswerCache
    from tests.servers import make_engines

    engines = make_engines(model)
    settings = ApiSettings(answer_cache=AnswerCache(4096, 64 << 20, 600))
    body = {"state": "The parcel arrived three days late and damaged.", "questions": {
        "refund": {"type": "noul", "instructions": "Should the customer get a refund?"},
        "kind": {"type": "choice", "instructions": "What is it about?", "criteria": ["delivery", "billing", "other"]},
    }}  # fmt: skip
    with TestClient(create_app(engines, settings)) as client:
        miss = client.post("/v1/basal", json=body)
        hits = [client.post("/v1/basal", json=body) for _ in range(n)]
    assert all(h.headers["x-basal-cache"] == "hit" for h in hits)
    server = sorted(float(h.headers["x-basal-total-ms"]) for h in hits)
    return {
        "miss_server_ms": float(miss.headers["x-basal-total-ms"]),
        "hit_server_ms_median": statistics.median(server),
        "hit_server_ms_p99": server[int(0.99 * (len(server) - 1))],
        "hits": n,
    }


def memory(states: int, budget_mb: float) -> dict:
    model = demo_model()
    pipeline = Pipeline(model, TorchBackend.load(model, dtype="f32"), state_cache_mb=budget_mb)
    cache = pipeline.state_cache
    assert cache is not None
    words = "order late damaged refund invoice parcel courier payment address warranty".split()

    def item(i: int) -> Item:
        state = f"Ticket {i}: " + " ".join(words[(i * 7 + j) % len(words)] for j in range(40))
        return Item("q", "noul", ("Yes", "No"), ("Yes", "No"), "en", state, "Is it late?")

    run_to_end(pipeline.letter_logits(pipeline.tokenize_items([item(-1)])))  # warm
    before, peak_bytes, rss_along = rss_mb(), 0, []
    t0 = time.perf_counter()
    for i in range(states):
        run_to_end(pipeline.letter_logits(pipeline.tokenize_items([item(i)])))
        peak_bytes = max(peak_bytes, cache.bytes)
        if (i + 1) % max(1, states // 10) == 0:  # resident memory along the way: it must level off
            rss_along.append((i + 1, round(rss_mb()), round(cache.bytes / 2**20, 1)))
    seconds = time.perf_counter() - t0
    held = sum(k.nbytes + v.nbytes for key, kv in pipeline.backend.net.prefix_kv.items() if key.startswith("state-")
               for k, v in kv)  # fmt: skip
    return {
        "states": states,
        "budget_mb": budget_mb,
        "peak_counted_mb": peak_bytes / 2**20,
        "counted_mb": cache.bytes / 2**20,
        "backend_tensors_mb": held / 2**20,
        "entries": cache.entries,
        "evictions": cache.counts.evictions,
        "rss_before_mb": before,
        "rss_after_mb": rss_mb(),
        "rss_along": rss_along,  # (states so far, RSS MiB, counted MiB)
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", default=["agent", "repeats", "memory"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--state-tokens", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--states", type=int, default=10_000)
    ap.add_argument("--budget-mb", type=float, default=256)
    ap.add_argument("--out", default="bench/results/state_cache_speed.json")
    a = ap.parse_args(argv)
    result: dict = {"machine": report.machine()}
    with tempfile.TemporaryDirectory() as tmp:
        if "agent" in a.parts or "repeats" in a.parts:
            model = ModelDir.load(synth_model(Path(tmp) / "mini", "mini", layers=a.layers))
            result["model"] = report.model_info(None, a.layers)
        if "agent" in a.parts:
            r = result["agent"] = agent(model, a.state_tokens, a.requests)
            print(
                f"agent loop: state {r['state_tokens']} tokens, {r['requests']} requests, mini {a.layers} layers f32: "
                f"median of requests 2-{r['requests']} off {r['median_2_off_ms']:.1f} ms, "
                f"on {r['median_2_on_ms']:.1f} ms: {r['speedup']:.1f}x (first on: {r['on_ms'][0]:.1f} ms)"
            )
            report.write_json(a.out, result)  # a long part's numbers are kept whatever follows
        if "repeats" in a.parts:
            r = result["repeats"] = repeats(model, 200)
            print(
                f"exact repeats: a hit takes {r['hit_server_ms_median']:.3f} ms of server time (median; p99 "
                f"{r['hit_server_ms_p99']:.3f}), the miss {r['miss_server_ms']:.1f} ms"
            )
    if "memory" in a.parts:
        r = result["memory"] = memory(a.states, a.budget_mb)
        print(
            f"memory: {r['states']} states, budget {r['budget_mb']:.0f} MiB: counted peak {r['peak_counted_mb']:.1f} "
            f"MiB, backend tensors {r['backend_tensors_mb']:.1f} MiB, {r['entries']} entries, {r['evictions']} "
            f"evictions; RSS {r['rss_before_mb']:.0f} -> {r['rss_after_mb']:.0f} MiB ({r['seconds']:.0f} s)\n"
            f"  along the way (states, RSS MiB, counted MiB): {r['rss_along']}"
        )
    report.write_json(a.out, result)
    return result


if __name__ == "__main__":
    main()
