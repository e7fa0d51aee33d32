"""What metrics, JSON access logs and tracing cost per request: p50 and throughput at 1 and 32 clients, on vs off.

    python -m bench.observability                      # demo model; 3 rounds of every configuration, interleaved
    python -m bench.observability --rounds 5 --requests 400

Three `basal serve` children of the demo model (loopback), started once each: **off** (no metrics, no access log,
text logs), **metrics+json** (`--metrics --access-log --log-format json`, the log written to a file), and
**+tracing** (that, and `--otlp-endpoint` at a local sink that accepts every export). Rounds interleave the
configurations, so a shared machine's drift hits all of them alike; each figure is the median over rounds.
Request ids are always on (they are not a switch). Clients as in bench/http_speed.py (raw keep-alive sockets).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from basal.benchsuite.workloads import questions, state_of_tokens
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from bench.http_speed import healthy, over_http
from tests.servers import free_port


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that accepts and drops every export."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def micro(n: int = 20000) -> dict[str, float]:
    """Microseconds per request of each observation piece alone, in this process (steady under machine load, where
    the HTTP figures are not): the metric updates a decision request makes, its JSON access line, and its spans
    (the SDK with a batch processor and an exporter that drops them)."""
    import io
    import logging
    import time

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from basal.api.observe import access, access_line
    from basal.api.tracing import Tracer
    from basal.core.engine.metrics import Metrics
    from basal.logs import JsonFormatter

    m = Metrics()

    def metrics_of_one() -> None:  # what handle_decision, Engines.run, admit and the lane record per request
        m.http_inflight.inc("/v1/systemone")
        m.parse_duration.observe("/v1/systemone", value=0.0002)
        m.model_inflight.inc("demo")
        m.tokenization_duration.observe("demo", value=0.0003)
        m.queue_duration.observe("demo", "main", value=0.004)
        m.model_inflight.inc("demo", by=-1)
        m.input_tokens.inc("demo", by=120)
        m.questions.inc("demo", by=1)
        m.http_inflight.inc("/v1/systemone", by=-1)
        m.http_requests.inc("/v1/systemone", "demo", "200")
        m.http_duration.observe("/v1/systemone", "demo", "200", value=0.01)

    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(JsonFormatter())
    access.addHandler(handler)
    access.propagate = False
    access.setLevel(logging.INFO)

    def log_of_one() -> None:
        access_line("127.0.0.1:5000", "POST", "/v1/systemone", 200, 4.2, {"model": "demo", "queue_ms": 3.1})

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    tracer = Tracer(provider.get_tracer("bench"))
    scope = {"method": "POST", "path": "/v1/systemone"}
    headers = [(b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]

    def spans_of_one() -> None:
        with tracer.server_span(scope, headers) as span:
            t = time.time_ns()
            tracer.stages(t, t + 200_000, t + 9_000_000, 4.0, 4.5, {"basal.model": "demo", "basal.questions": 1})
            span.set_attribute("http.response.status_code", 200)

    out = {}
    for name, fn in (("metrics", metrics_of_one), ("json_access_line", log_of_one), ("spans", spans_of_one)):
        for _ in range(n // 10):
            fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t0) / n * 1e6
        print(f"{name}: {out[name]:.1f} us per request", flush=True)
    provider.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--micro", action="store_true", help="only the in-process cost of each piece, per request")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=240, help="requests per level and round")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--out", default="bench/results/observability.json")
    a = ap.parse_args()
    if a.micro:
        micro()
        return
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    otlp = f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"
    configs = {
        "off": [],
        "metrics+json": ["--metrics", "--access-log", "--log-format", "json"],
        "+tracing": ["--metrics", "--access-log", "--log-format", "json", "--otlp-endpoint", otlp],
    }
    samples: dict[tuple[str, int], list[dict]] = {}
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        path = synth_model(Path(tmp) / "demo", "demo")
        model = ModelDir.load(path)
        body = {"model": model.name, "state": state_of_tokens(model.tokenizer, 100, "en", 0),
                "questions": questions(1, "en", 1)}  # fmt: skip
        urls = {}
        try:
            for name, flags in configs.items():
                port = free_port()
                log = open(Path(tmp) / f"{name}.log", "wb")  # noqa: SIM115 (open while the child runs)
                cmd = [sys.executable, "-m", "basal", "serve", "--model", str(path), "--addr", f"127.0.0.1:{port}"]
                proc = subprocess.Popen([*cmd, *flags], stdout=log, stderr=log)
                procs.append(proc)
                urls[name] = healthy(proc, f"http://127.0.0.1:{port}")
                over_http(urls[name], body, 1, 20)  # warm-up
            for r in range(a.rounds):
                for clients in a.clients:
                    per_client = max(1, a.requests // clients)
                    for name in configs if r % 2 == 0 else reversed(configs):
                        samples.setdefault((name, clients), []).append(over_http(urls[name], body, clients, per_client))
            for name in configs:
                lines = (Path(tmp) / f"{name}.log").read_text().splitlines()
                print(f"{name}: {len(lines)} log lines written", flush=True)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
    sink.shutdown()
    rows = []
    for clients in a.clients:
        base = None
        for name in configs:
            runs = samples[(name, clients)]
            p50 = statistics.median(x["p50_ms"] for x in runs)
            rps = statistics.median(x["rps"] for x in runs)
            base = base or (p50, rps)
            row = {"config": name, "clients": clients, "p50_ms": p50, "rps": rps,
                   "p50_vs_off": p50 / base[0], "rps_vs_off": rps / base[1], "rounds": runs}  # fmt: skip
            rows.append(row)
            print(
                f"{clients:>2} clients {name:>13}: p50 {p50:7.2f} ms ({row['p50_vs_off']:.3f}x off), "
                f"{rps:7.1f} req/s ({row['rps_vs_off']:.3f}x off)",
                flush=True,
            )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
