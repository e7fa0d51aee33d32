"""Two batches in flight (core/packing/passes.py), measured on a simulated asynchronous device — no GPU needed.

The device computes each queued forward for max(a floor, a time per packed token), in stream order, and its readback is
ready when that time has passed. Everything on the host is real: the engine's lane, admission, tree packing, the
decision math and the answers. A closed loop of `--clients` clients sends single-question requests. Two runs on
the same device: the backend yields QUEUED (the lane packs and queues the next batch while the device computes),
and it does not (the lane waits for every readback under the gate, as before). The ratio of the two is the host
gap between batches that the overlap removes. This machine's host is not a GPU server's: the gap is its own.

    python -m bench.lab.lane_overlap     # floors of 1 and 5 ms, 0, 7.5 or 45 us per token, 2 and 8 clients
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import numpy as np

from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.model.synth import demo_model
from basal.core.packing.passes import QUEUED
from basal.core.request.dialects import parse_systemone

POLL_S = 50e-6  # as the GPU path's readback polls (pacing.until_done)


class SimulatedDevice:
    """A backend whose forwards take max(`floor_s`, `token_s` per packed token) each, on one in-order stream (the
    logits are zeros)."""

    name, device, dtype = "simulated", "simulated", "f16"
    reads_hidden_states = False

    def __init__(self, model, floor_s: float, token_s: float, overlap: bool):
        self.model, self.floor_s, self.token_s, self.overlap = model, floor_s, token_s, overlap
        self.busy_until = 0.0  # when the stream's last queued forward ends
        self.busy_s = 0.0

    def prefix(self, key, tokens) -> None:
        pass

    def prepare(self, batch) -> None:
        return None

    def run_with_hidden(self, batch):
        raise RuntimeError("the simulated device reads no hidden states")

    def describe(self) -> dict[str, object]:
        return {"backend": self.name, "device": self.device, "dtype": self.dtype}

    def warm_up(self) -> int:
        return 0

    def run(self, batch, prepared=None, preemptible=False):
        seconds = max(self.floor_s, self.token_s * batch.n_tokens)  # a roofline: weights read once, or compute
        done_at = max(time.perf_counter(), self.busy_until) + seconds
        self.busy_until = done_at
        self.busy_s += seconds
        yield QUEUED if self.overlap else None
        while time.perf_counter() < done_at:
            yield
            time.sleep(POLL_S)
        return np.zeros((len(batch.readouts), len(batch.letter_ids)), dtype=np.float32)


def request(i: int):
    body = {
        "model": "basal-synthetic-demo",
        "state": f"Order {i}: " + " ".join(random.Random(i).choice(["late", "damaged", "refund"]) for _ in range(60)),
        "questions": {"r": {"type": "noul", "instructions": "Should we refund?"}},
    }
    return parse_systemone(body, lambda m: m)


async def closed_loop(engines: Engines, clients: int, total: int) -> float:
    """Seconds for `total` requests from `clients` clients that each send the next one when answered."""
    sent = 0

    async def client():
        nonlocal sent
        while sent < total:
            sent += 1
            await engines.run(request(sent))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - started


async def open_loop(engines: Engines, rate: float, total: int, seed: int = 0) -> list[float]:
    """Latencies (ms) of `total` requests arriving at random (Poisson) at `rate` per second."""
    rng, latencies = random.Random(seed), []

    async def one(i: int) -> None:
        sent = time.perf_counter()
        await engines.run(request(i))
        latencies.append((time.perf_counter() - sent) * 1000)

    tasks = []
    for i in range(total):
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    return sorted(latencies)


def started_engines(model, device) -> tuple[Engines, Engine]:
    metrics = Metrics(1024)
    engine = Engine(model.name, Pipeline(model, device), Gate(), metrics, EngineSettings())
    engines = Engines({model.name: engine}, model.name, metrics, 1024)
    engines.start()
    return engines, engine


def latency(model, floor_ms: float, token_us: float, overlap: bool, rate: float, total: int) -> dict:
    engines, _ = started_engines(model, SimulatedDevice(model, floor_ms / 1000, token_us / 1e6, overlap))
    try:
        asyncio.run(open_loop(engines, rate, 20, seed=1))  # warm-up
        ms = asyncio.run(open_loop(engines, rate, total))
        return {"p50": statistics.median(ms), "p99": ms[min(len(ms) - 1, int(0.99 * len(ms)))]}
    finally:
        engines.close()


def measure(model, floor_ms: float, token_us: float, overlap: bool, clients: int, total: int) -> dict:
    device = SimulatedDevice(model, floor_ms / 1000, token_us / 1e6, overlap)
    engines, engine = started_engines(model, device)
    try:
        asyncio.run(closed_loop(engines, clients, 2 * clients))  # warm-up
        device.busy_s, forwards = 0.0, engine.batches
        seconds = asyncio.run(closed_loop(engines, clients, total))
        return {
            "per_s": total / seconds,
            "device_busy": device.busy_s / seconds,
            "requests_per_batch": total / max(1, engine.batches - forwards),
        }
    finally:
        engines.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--floor-ms", default="1,5", help="least device time of a forward (weights read once)")
    p.add_argument("--token-us", default="0,7.5,45", help="device time per packed token (H200: ~7.5 mini, ~45 max)")
    p.add_argument("--clients", default="2,8")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3, help="alternating runs of each; the median is shown")
    p.add_argument("--rates", default="50,100,250", help="open loop: requests per second arriving at random")
    p.add_argument("--open-shapes", default="1:7.5,5:45", help="open loop: floor_ms:us_per_token pairs")
    args = p.parse_args(argv)
    model = demo_model()
    print("open loop    floor ms  us/token   rate/s   p50 ms one at a time / two in flight   p99 ms one / two")
    for shape in args.open_shapes.split(","):
        floor_ms, token_us = map(float, shape.split(":"))
        for rate in map(float, args.rates.split(",")):
            one, two = (latency(model, floor_ms, token_us, o, rate, args.requests) for o in (False, True))
            print(
                f"{'':12} {floor_ms:8.1f} {token_us:9.1f} {rate:8.0f} {one['p50']:24.2f} / {two['p50']:.2f}"
                f" {one['p99']:19.2f} / {two['p99']:.2f}"
            )
    print()
    print(
        "floor ms  us/token  clients   requests/s one at a time   two in flight   ratio   device busy (one / two)"
        "   requests/batch"
    )
    for floor_ms in map(float, args.floor_ms.split(",")):
        for token_us in map(float, args.token_us.split(",")):
            for clients in map(int, args.clients.split(",")):
                runs: dict[bool, list[dict]] = {False: [], True: []}
                for _ in range(args.rounds):
                    for overlap in (False, True):
                        runs[overlap].append(measure(model, floor_ms, token_us, overlap, clients, args.requests))
                one, two = (sorted(runs[o], key=lambda r: r["per_s"])[args.rounds // 2] for o in (False, True))
                print(
                    f"{floor_ms:8.1f} {token_us:9.1f} {clients:8d} {one['per_s']:26.0f} {two['per_s']:15.0f}"
                    f" {two['per_s'] / one['per_s']:7.2f}x   {one['device_busy']:10.0%} / {two['device_busy']:.0%}"
                    f"   {one['requests_per_batch']:12.1f} / {two['requests_per_batch']:.1f}"
                )


if __name__ == "__main__":
    main()
