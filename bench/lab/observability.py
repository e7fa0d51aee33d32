"""What metrics, JSON access logs and tracing cost per request: p50 and throughput at 1 and 32 clients, on vs off.

    python -m bench.lab.observability --rounds 5           # the goals: 32 clients, throughput vs off (2 % and 5 %)
    python -m bench.lab.observability --micro              # each piece's CPU per request, in this process

Three `basal serve` children of the demo model (loopback), started once each: **off** (no metrics, no access log,
text logs), **metrics+json** (`--metrics --access-log --log-format json`, the log written to a file), and
**+tracing** (that, and `--otlp-endpoint` at an OTLP sink; every request sampled). Rounds interleave the
configurations, so a shared machine's drift hits all of them alike; each figure is the median over rounds. (The
servers' CPU per request is no measure of the overhead: torch's worker threads spin between forwards, so it grows
with wall time.) The sink is its own process
(bench/lab/otlp_sink.py: reads each export's body, answers 200, decodes nothing) and reports its CPU per traced request:
it runs on the same cores here, where in production a collector is another machine. Request ids are always on (they
are not a switch). Clients as in bench/lab/http_speed.py (raw keep-alive sockets).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from basal.benchsuite.workloads import questions, state_of_tokens
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from bench.lab.http_speed import healthy, over_http
from bench.lab.otlp_sink import Sink
from tests.ports import free_port


def micro(n: int = 20000) -> dict[str, float]:
    """Microseconds per request of each observation piece alone, in this process (steady under machine load, where
    the HTTP figures are not): the metric updates a decision request makes, its JSON access line, its spans in the
    request path (as served: the batch processor, an exporter of the served type that drops them), the OTLP
    encoding of its spans as `ReadableSpan`s (the SDK's encoder and the direct one), and all of tracing as served:
    CPU of this process (every thread: the request path, the batch processor's thread encoding and posting) per
    request, spans flushed to the sink (its own process, not counted)."""
    import io
    import logging
    import time

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from basal.core.engine.metrics import Metrics
    from basal.observability.logs import JsonFormatter
    from basal.observability.otlp import DirectOTLPSpanExporter, SpanEncoder
    from basal.observability.request_context import access, access_line
    from basal.observability.tracing import Tracer, otlp_tracer

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

    class Drop(DirectOTLPSpanExporter):  # the served exporter's type (the request path then is the served one)
        def export(self, spans):
            return SpanExportResult.SUCCESS

    scope = {"method": "POST", "path": "/v1/systemone"}
    count = iter(range(1 << 62))

    def request_of(tracer: Tracer):
        def spans_of_one() -> None:  # as served: no traceparent from the bench's clients, a request id each
            with tracer.server_span(scope, []) as span:
                t = time.time_ns()
                attributes = {"basal.model": "demo", "basal.questions": 1, "basal.request_id": f"req_{next(count)}"}
                tracer.stages(t, t + 200_000, t + 9_000_000, 4.0, 4.5, attributes)
                span.set_attribute("http.response.status_code", 200)

        return spans_of_one

    def paced(one, flush):
        """Every 128 requests the batch processor's queue is flushed, as the server's pace lets its thread keep up
        (the queue never fills, which would drop spans and log a warning per span)."""

        def one_paced() -> None:
            one()
            if next(count) % 128 == 0:
                flush()

        return one_paced

    provider = TracerProvider()
    dropped = Drop(endpoint="http://127.0.0.1:9/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(dropped, max_queue_size=1 << 16))  # never full here
    out = {}

    def timed(name: str, fn, n: int = n, clock=time.perf_counter, per: int = 1, flush=None) -> None:
        for _ in range(n // 10):
            fn()
        if flush:
            flush()
        t0 = clock()
        for _ in range(n):
            fn()
        if flush:
            flush()
        out[name] = (clock() - t0) / n / per * 1e6
        print(f"{name}: {out[name]:.1f} us per request", flush=True)

    timed("metrics", metrics_of_one)
    timed("json_access_line", log_of_one)
    timed("spans", paced(request_of(Tracer(provider.get_tracer("bench"))), provider.force_flush))
    provider.shutdown()

    kept = InMemorySpanExporter()  # 512 requests' spans, encoded per batch as the exporter does
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(kept))
    one = request_of(Tracer(provider.get_tracer("basal")))
    for _ in range(512):
        one()
    batch, encoder = kept.get_finished_spans(), SpanEncoder()
    rounds = max(1, n // 512 // 4)
    timed("otlp_encode_sdk", lambda: encode_spans(batch).SerializePartialToString(), rounds, per=512)
    timed("otlp_encode_direct", lambda: encoder.encode(batch), rounds, per=512)

    # the served batch processor as configured (OTEL_BSP_* apply), exporting from its thread as in the server
    sink = Sink()
    try:
        for name, direct in (("tracing_cpu_sdk_encoder", False), ("tracing_cpu", True)):
            served = otlp_tracer(sink.url)
            if not direct:  # the same, with the SDK's encoder and ReadableSpans (a deep queue: it is slower)
                served.tracer.span_processor.shutdown()
                exporter = DirectOTLPSpanExporter(endpoint=sink.url)
                exporter.direct = False
                provider = TracerProvider(resource=served.tracer.resource)
                provider.add_span_processor(BatchSpanProcessor(exporter, 1 << 20, max_export_batch_size=2048))
                served = Tracer(provider.get_tracer("basal"))
            timed(name, request_of(served), n // 2, time.process_time, flush=served.tracer.span_processor.force_flush)
            served.tracer.span_processor.shutdown()
    finally:
        got = sink.stop()
    print(f"  (the sink: {got.get('posts')} posts, {got.get('bytes', 0) / 1e6:.1f} MB, {got.get('cpu_s', 0):.2f} s "
          "CPU in its own process, not in the figures above)")  # fmt: skip
    return out


GOALS = {"metrics+json": 0.98, "+tracing": 0.95}  # throughput vs off at 32 clients: under 2 % and 5 % overhead


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--micro", action="store_true", help="only the in-process cost of each piece, per request")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=480, help="requests per level and round (a second or more each)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--out", default="bench/results/observability.json")
    a = ap.parse_args()
    if a.micro:
        micro()
        return
    sink = Sink()
    configs = {
        "off": [],
        "metrics+json": ["--metrics", "--access-log", "--log-format", "json"],
        "+tracing": ["--metrics", "--access-log", "--log-format", "json", "--otlp-endpoint", sink.url],
    }
    samples: dict[tuple[str, int], list[dict]] = {}
    procs = {}
    traced = 0
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
                proc = procs[name] = subprocess.Popen([*cmd, *flags], stdout=log, stderr=log)
                urls[name] = healthy(proc, f"http://127.0.0.1:{port}")
                over_http(urls[name], body, 1, 20)  # warm-up
                traced += 20 if name == "+tracing" else 0
            for r in range(a.rounds):
                for clients in a.clients:
                    per_client = max(1, a.requests // clients)
                    for name in configs if r % 2 == 0 else reversed(configs):
                        run = over_http(urls[name], body, clients, per_client)
                        samples.setdefault((name, clients), []).append(run)
                        traced += run["requests"] if name == "+tracing" else 0
            for name in configs:
                lines = (Path(tmp) / f"{name}.log").read_text().splitlines()
                print(f"{name}: {len(lines)} log lines written", flush=True)
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(30)
            got = sink.stop()
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
    sink_us = got.get("cpu_s", 0) / max(1, traced) * 1e6
    print(
        f"OTLP sink (own process; reads each body, answers 200; in production a collector is another machine): "
        f"{got.get('posts')} posts, {sink_us:.1f} us CPU per traced request on the shared cores"
    )
    for row in rows:
        if row["clients"] == 32 and row["config"] in GOALS:
            goal = GOALS[row["config"]]
            verdict = "met" if row["rps_vs_off"] >= goal else "NOT met"
            print(f"goal {row['config']} at 32 clients: throughput >= {goal:.2f}x off: {row['rps_vs_off']:.3f}x, "
                  f"{verdict}")  # fmt: skip
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"rows": rows, "sink": got | {"us_per_traced_request": sink_us}}, indent=1))


if __name__ == "__main__":
    main()
