"""OpenTelemetry (the otel extra): the span tree of a decision request under the client's `traceparent`, seen by an
in-memory exporter; and nothing of OpenTelemetry is imported when tracing is not configured."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from litestar.testing import TestClient

from basal.api.app import create_app
from basal.api.settings import ApiSettings
from basal.observability.tracing import Tracer
from tests.api.test_http import REQUEST, post
from tests.servers import make_engines

pytest.importorskip("opentelemetry.sdk")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def test_the_span_tree_joins_the_incoming_trace(demo_model):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = ApiSettings(tracer=Tracer(provider.get_tracer("basal")))
    with TestClient(create_app(make_engines(demo_model), settings)) as c:
        r = post(c, REQUEST, traceparent=f"00-{TRACE_ID}-{PARENT_ID}-01", **{"x-request-id": "traced-1"})
    assert r.status_code == 200
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"POST /v1/systemone", "basal.parse", "basal.engine", "basal.queue", "basal.compute"}
    assert {f"{s.context.trace_id:032x}" for s in spans.values()} == {TRACE_ID}
    server = spans["POST /v1/systemone"]
    assert f"{server.parent.span_id:016x}" == PARENT_ID and server.parent.is_remote
    assert server.attributes["http.response.status_code"] == 200
    parent_of = {name: s.parent.span_id for name, s in spans.items()}
    assert parent_of["basal.parse"] == parent_of["basal.engine"] == server.context.span_id
    assert parent_of["basal.queue"] == parent_of["basal.compute"] == spans["basal.engine"].context.span_id
    engine = spans["basal.engine"]
    assert engine.attributes["basal.request_id"] == "traced-1" and engine.attributes["basal.questions"] == 3
    for child in ("basal.queue", "basal.compute"):  # inside their parent, in order
        assert engine.start_time <= spans[child].start_time <= spans[child].end_time <= engine.end_time
    assert spans["basal.queue"].end_time <= spans["basal.compute"].start_time
    assert server.start_time <= spans["basal.parse"].start_time and engine.end_time <= server.end_time


def test_spans_are_exported_over_otlp_to_the_configured_endpoint(demo_model, monkeypatch):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from basal.observability.tracing import otlp_tracer

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # ms between batch exports
    received: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append((self.path, self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    sink = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    try:
        tracer = otlp_tracer(f"http://127.0.0.1:{sink.server_address[1]}/v1/traces")
        with TestClient(create_app(make_engines(demo_model), ApiSettings(tracer=tracer))) as c:
            assert post(c, REQUEST, traceparent=f"00-{TRACE_ID}-{PARENT_ID}-01").status_code == 200
        deadline = time.monotonic() + 30
        while not any(bytes.fromhex(TRACE_ID) in body for _, body in received):
            assert time.monotonic() < deadline, received
            time.sleep(0.05)
    finally:
        sink.shutdown()
    assert {path for path, _ in received} == {"/v1/traces"}


def test_without_tracing_opentelemetry_is_never_imported():
    code = (
        "import sys, basal.api.app, basal.serve.server, basal.cli\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _stage_spans(direct: bool, sampler=None, limits=None, extra=None) -> list:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(**{k: v for k, v in (("sampler", sampler), ("span_limits", limits)) if v is not None})
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = Tracer(provider.get_tracer("basal"))
    assert tracer._direct is not None  # the SDK tracer takes the fast path
    if not direct:
        tracer._direct = None  # the SDK's live spans, the general path
    headers = [(b"traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01".encode())]
    with tracer.server_span({"method": "POST", "path": "/v1/systemone"}, headers):
        tracer.stages(1_000, 2_000, 9_000, 0.003, 0.002, {"basal.model": "demo", "basal.questions": 2, **(extra or {})})
    return exporter.get_finished_spans()


@pytest.mark.parametrize("case", ["plain", "limited", "cleaned"])
def test_stage_spans_built_finished_export_what_live_spans_do(case):
    from opentelemetry.sdk.trace import SpanLimits

    # a span's own value length limit differs from the general one: a live span's initial attributes take it
    limited = case == "limited"
    limits = SpanLimits(max_span_attribute_length=3, max_attribute_length=10) if limited else None
    extra = {"tags": ["a", "b"], "none": None, "": 1} if case == "cleaned" else None  # a tuple; kept; dropped

    def view(spans: list) -> list:
        ids = {s.context.span_id: s.name for s in spans}
        return sorted(
            (
                s.name,
                ids.get(s.parent.span_id, "remote") if s.parent else None,
                s.context.trace_id,
                s.context.trace_flags,
                s.kind,
                s.start_time if s.name != "POST /v1/systemone" else 0,
                s.end_time if s.name != "POST /v1/systemone" else 0,
                dict(s.attributes),
                s.resource.attributes == spans[0].resource.attributes,
                s.instrumentation_scope,
                s.status.status_code,
                s.dropped_attributes,
                tuple(s.events),
                tuple(s.links),
            )
            for s in spans
        )

    direct, live = _stage_spans(True, limits=limits, extra=extra), _stage_spans(False, limits=limits, extra=extra)
    assert len(direct) == 5 and view(direct) == view(live)
    engine = next(s for s in direct if s.name == "basal.engine")
    expected = {"basal.model": "dem" if limited else "demo", "basal.questions": 2}
    assert dict(engine.attributes) == expected | ({"tags": ("a", "b"), "none": None} if extra else {})


def test_stage_spans_follow_the_server_spans_sampling():
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    assert _stage_spans(direct=True, sampler=ALWAYS_OFF) == ()
    assert _stage_spans(direct=False, sampler=ALWAYS_OFF) == ()


def test_the_otlp_resource_hashes_once_and_exports_the_same():
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext

    from basal.observability import tracing

    def spans(resource: Resource) -> list:
        return [ReadableSpan(f"s{i}", SpanContext(7, i + 1, False), resource=resource) for i in range(3)]

    plain = Resource.create({"service.name": "basal"})
    frozen = tracing._frozen(plain)
    assert frozen == plain and hash(frozen) == hash(plain) and dict(frozen.attributes) == dict(plain.attributes)
    calls = []
    original = Resource.__hash__
    try:
        Resource.__hash__ = lambda self: calls.append(1) or original(self)
        encoded = encode_spans(spans(tracing._frozen(plain))).SerializeToString()  # its hash not yet computed
    finally:
        Resource.__hash__ = original
    assert len(calls) == 1  # once for all the spans, not once per span
    assert encoded == encode_spans(spans(plain)).SerializeToString()
    served = tracing.otlp_tracer("http://127.0.0.1:9/v1/traces").tracer
    served.span_processor.shutdown()
    assert type(served.resource).__name__ == "FrozenResource"


def test_the_served_tracer_exports_in_large_batches_unless_the_operator_sets_them(monkeypatch):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from basal.observability import tracing

    def batches() -> tuple[int, int]:
        served = tracing.otlp_tracer("http://127.0.0.1:9/v1/traces").tracer.span_processor
        try:
            found = served._span_processors[0]._batch_processor
            return found._max_export_batch_size, found._max_queue_size
        finally:
            served.shutdown()

    assert batches() == (tracing.EXPORT_BATCH["max_export_batch_size"], tracing.EXPORT_BATCH["max_queue_size"])
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "1000")  # the SDK's settings then (its default batch: 512)
    assert batches() == (512, 1000)


@pytest.mark.parametrize("case", ["plain", "root", "exception", "cleaned", "status_and_event", "ended_twice"])
def test_the_direct_server_span_exports_what_the_sdks_does(case):
    """The server span written finished (or turned into the SDK's live span for what it does not do itself) against
    the SDK's `start_as_current_span`: same spans, parents, flags, attributes, events, status."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Status, StatusCode

    def run(direct: bool) -> list:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = Tracer(provider.get_tracer("basal"))
        assert tracer._direct.servers
        tracer._direct.servers = direct
        headers = [] if case == "root" else [(b"traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01".encode())]
        try:
            with tracer.server_span({"method": "POST", "path": "/v1/systemone"}, headers) as span:
                assert trace.get_current_span() is span
                tracer.stages(1_000, 2_000, 9_000, 0.003, 0.002, {"basal.model": "demo"})
                span.set_attribute("http.response.status_code", 200)
                span.set_attributes({"basal.x": 1, "url.path": "/v1/again"})
                span.set_attribute("http.response.status_code", 201)  # set again: the last value, last in order
                if case == "exception":
                    raise RuntimeError("bad")
                if case == "cleaned":
                    span.set_attribute("tags", ["a", "b"])  # the SDK cleans it into a tuple
                if case == "status_and_event":
                    span.add_event("seen", {"n": 1})
                    span.set_status(Status(StatusCode.ERROR, "no"))
                if case == "ended_twice":
                    span.end()
        except RuntimeError:
            pass
        if direct and case in ("plain", "root", "ended_twice"):
            assert span.found is None  # written finished: the SDK's live span was never needed
        return list(exporter.get_finished_spans())

    def view(spans: list) -> list:
        ids = {s.context.span_id: s.name for s in spans}
        return sorted(
            (
                s.name,
                ids.get(s.parent.span_id, f"{s.parent.span_id:016x}") if s.parent else None,
                s.parent.is_remote if s.parent else None,
                s.context.trace_flags,
                s.kind,
                list(dict(s.attributes).items()),
                s.status.status_code,
                s.status.description,
                [(e.name, {k: v for k, v in e.attributes.items() if k != "exception.stacktrace"}) for e in s.events],
                s.instrumentation_scope,
                s.start_time <= s.end_time,
            )
            for s in spans
        )

    direct, live = run(direct=True), run(direct=False)
    assert len(direct) == 5 and view(direct) == view(live)
    server = next(s for s in direct if s.kind == trace.SpanKind.SERVER)
    assert server.attributes["http.response.status_code"] == 201
    assert (f"{server.context.trace_id:032x}" == TRACE_ID) == (case != "root")
    if case == "exception":
        assert server.status.description == "RuntimeError: bad" and server.events[0].name == "exception"


def test_the_server_span_is_the_sdks_with_processors_that_watch_spans_start():
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    class Watcher(SpanProcessor):
        def on_start(self, span, parent_context=None) -> None:
            span.set_attribute("seen", True)

    provider = TracerProvider()
    provider.add_span_processor(Watcher())
    assert not Tracer(provider.get_tracer("basal"))._direct.servers
