"""`basal replay`'s path against the same captured requests sent one by one: lines per second on one model.

    python -m bench.lab.replay_speed                       # 10,000 lines (1,000 states x 10 questions), demo model
    python -m bench.lab.replay_speed --lines 2000 --model DIR

The replay runs a capture through the batch path (`basal.replay.run.run`: the lines of one state together, many
in flight, one prefix tree); "one by one" awaits each request before sending the next, as a script posting its
captured traffic to a server would. Both on the same engines, in one process, in turn; answers compared bitwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import msgspec

from basal.api.decide import body_decider
from basal.api.settings import ApiSettings
from basal.replay.run import read_capture, run
from basal.serve.config import DEMO_PATH, ModelConfig, ServeConfig
from basal.serve.server import build_engines
from bench import report

WORDS = "parcel refund invoice login outage upgrade contract warranty delivery damage".split()


def capture(path: Path, lines: int, per_state: int) -> None:
    """A capture of `lines` requests, `per_state` questions' requests on each state."""
    out = []
    for i in range(lines):
        s, q = divmod(i, per_state)
        state = f"Ticket {s}: " + " ".join(WORDS[(s + k) % len(WORDS)] for k in range(40))
        question = {"type": "noul", "instructions": f"Is this about {WORDS[q % len(WORDS)]} ({q})?"}
        body = {"state": state, "questions": {"q": question}}
        out.append(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/basal", "body": body}))
    path.write_text("\n".join(out) + "\n")


def _answers(body: bytes) -> bytes:
    """A response's answers, re-encoded as they came (key order kept): the bytes a replay compares."""
    return msgspec.json.encode(msgspec.json.decode(body)["answers"])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--per-state", type=int, default=10)
    ap.add_argument("--model", default=DEMO_PATH)
    ap.add_argument("--out", default="bench/results/replay_speed.json")
    a = ap.parse_args(argv)

    tmp = tempfile.TemporaryDirectory()
    path = Path(tmp.name) / "capture.jsonl"
    capture(path, a.lines, a.per_state)
    captured = read_capture(path)
    engines = build_engines(ServeConfig(models=[ModelConfig(path=a.model)]))
    engines.start()
    decide = body_decider(engines, ApiSettings())

    async def one_by_one() -> dict[str, bytes]:
        out = {}
        for line in captured.lines:
            _, body, _ = await decide(line.body, lambda: False)
            out[line.custom_id] = body
        return out

    t0 = time.perf_counter()
    replayed = asyncio.run(run(captured, decide))
    replay_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sequential = asyncio.run(one_by_one())
    sequential_s = time.perf_counter() - t0
    engines.close()
    same = sum(_answers(replayed[k].body) == _answers(v) for k, v in sequential.items())  # `latency_ms` differs
    result = {
        "machine": report.machine(),
        "lines": a.lines,
        "per_state": a.per_state,
        "model": a.model,
        "replay_s": replay_s,
        "one_by_one_s": sequential_s,
        "speedup": sequential_s / replay_s,
        "identical_answers": f"{same}/{len(sequential)}",
    }
    report.write_json(a.out, result)
    print(
        f"\n{a.lines} lines ({a.per_state} per state), model {a.model}: replay's batch path {replay_s:.1f} s "
        f"({a.lines / replay_s:.0f} lines/s), one by one {sequential_s:.1f} s ({a.lines / sequential_s:.0f} lines/s): "
        f"{sequential_s / replay_s:.2f}×; answers bitwise equal: {same}/{len(sequential)}"
    )
    tmp.cleanup()
    return result


if __name__ == "__main__":
    main()
