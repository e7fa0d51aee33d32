"""The direct OTLP/protobuf encoding (basal/observability/otlp.py) against the SDK's encoder: both decoded with the
opentelemetry-proto classes must be equal (protobuf's `==` also tells an empty sub-message from an absent one), for
spans that use every field the SDK's encoder sets; and the served exporter sends such bytes."""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from basal.observability.otlp import DirectOTLPSpanExporter, SpanEncoder, any_value
from basal.observability.tracing import Tracer, otlp_tracer

REMOTE = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True, TraceFlags(1),
                     TraceState([("k", "v"), ("a", "b")]))  # fmt: skip


def decoded(data: bytes) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    message.ParseFromString(data)
    return message


def every_kind_of_span() -> list:
    """Two resources (one with a schema url), three scopes (one with version, attributes and schema url), a remote
    parent with a trace state, every attribute type, events, links, statuses, dropped counts, odd values."""
    exporter = InMemorySpanExporter()
    limits = SpanLimits(max_span_attributes=6, max_events=2, max_links=2, max_event_attributes=2,
                        max_link_attributes=2)  # fmt: skip

    def tracers(resource: Resource) -> TracerProvider:
        provider = TracerProvider(resource=resource, span_limits=limits)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return provider

    first = tracers(Resource.create({"service.name": "basal", "n": 3, "f": 1.5, "b": True, "l": ("a", "b")},
                                    schema_url="https://example.com/r"))  # fmt: skip
    basal, library = first.get_tracer("basal"), first.get_tracer("lib", "1.2", "https://example.com/s", {"x": 1})
    other = tracers(Resource({"service.name": "other"})).get_tracer("basal")
    parent = trace.set_span_in_context(trace.NonRecordingSpan(REMOTE))
    attributes = {"s": "x", "i": -5, "big": 2**63 - 1, "zero": 0, "empty": "", "f": 0.0, "t": (1, 2), "u": "ü€😀"}
    with basal.start_as_current_span("POST /v1/systemone", parent, SpanKind.SERVER, attributes) as server:
        server.add_event("ev", {"a": 1, "b": "x", "c": 3})  # one attribute over the limit: dropped
        server.add_event("", timestamp=5)
        server.add_event("third")  # one event over the limit
        links = [Link(REMOTE, {"l": 1}), Link(SpanContext(1, 2, False)), Link(SpanContext(3, 4, False))]
        with library.start_as_current_span("child", kind=SpanKind.CLIENT, links=links) as child:
            child.set_status(Status(StatusCode.ERROR, "boom"))
            child.set_attribute("bytes", b"\x00\x01")
        with pytest.raises(RuntimeError), basal.start_as_current_span("raises"):  # an exception event, an ERROR
            raise RuntimeError("bad")
        with other.start_as_current_span("x" * 300, kind=SpanKind.PRODUCER) as long:
            long.set_status(Status(StatusCode.OK))
            for i in range(9):
                long.set_attribute(f"k{i}", i)  # over the limit: dropped attributes
        with basal.start_as_current_span("odd values", kind=SpanKind.CONSUMER) as odd:
            odd.set_attribute("huge", 2**70)  # no int64: left out, by both
            odd.set_attribute("surrogate", "\ud800")  # no UTF-8: left out, by both
            odd.set_attribute("lowest", -(2**63))
    return list(exporter.get_finished_spans())


def test_direct_encoding_decodes_to_what_the_sdk_encodes(caplog):
    spans = every_kind_of_span()
    with caplog.at_level(logging.CRITICAL):  # both log the two attributes they leave out
        direct, sdk = SpanEncoder().encode(spans), encode_spans(spans).SerializeToString()
    found = decoded(direct)
    assert found == decoded(sdk)
    assert len(found.resource_spans) == 2 and len(found.resource_spans[0].scope_spans) == 2
    assert sum(len(s.spans) for r in found.resource_spans for s in r.scope_spans) == len(spans) == 5


def test_served_request_spans_encode_as_the_sdk_does_again_and_again():
    """The spans of served requests (server span under a client's traceparent, stage spans built finished), many
    batches through one encoder: its kept names, attributes and resource give the same bytes' meaning each time."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "basal"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = Tracer(provider.get_tracer("basal"))
    encoder = SpanEncoder()
    for batch in range(3):
        exporter.clear()
        for i in range(4):
            headers = [(b"traceparent", f"00-{REMOTE.trace_id:032x}-{REMOTE.span_id:016x}-01".encode())]
            with tracer.server_span({"method": "POST", "path": f"/v1/p{i % 2}"}, headers if i % 2 else []) as span:
                attributes = {"basal.model": "demo", "basal.questions": i, "basal.request_id": f"r{batch}-{i}"}
                tracer.stages(1_000, 2_000, 9_000, 0.003, 0.002, attributes)
                span.set_attribute("http.response.status_code", 200)
        spans = exporter.get_finished_spans()
        assert len(spans) == 20
        assert decoded(encoder.encode(spans)) == decoded(encode_spans(spans).SerializeToString())


def test_any_value_as_the_sdk_for_values_attributes_cannot_hold():
    from opentelemetry.exporter.otlp.proto.common._internal import _encode_value

    for value in ({"a": 1, "b": [1, "x", None]}, None, [], (1.5, True), -1, b"", "", False, 2**63 - 1):
        assert any_value(value) == _encode_value(value).SerializeToString(), value
    with pytest.raises(TypeError):
        any_value(object())


def test_the_exporter_sends_the_direct_bytes_and_the_sdks_for_other_spans():
    received: list[bytes] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    class PublicOnly:  # a span object with the public properties only: the SDK's encoder takes it
        def __init__(self, span):
            self._span = span

        def __getattr__(self, name: str):
            if name.startswith("_"):
                raise AttributeError(name)
            return getattr(self._span, name)

    sink = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    spans = [s for s in every_kind_of_span() if s.name != "odd values"]
    try:
        exporter = DirectOTLPSpanExporter(endpoint=f"http://127.0.0.1:{sink.server_address[1]}/v1/traces")
        assert exporter.direct  # the installed SDK's exporter has the shape the direct path follows
        assert exporter.export(spans).name == "SUCCESS"
        assert exporter.export([PublicOnly(s) for s in spans]).name == "SUCCESS"
        exporter.shutdown()
        deadline = time.monotonic() + 10
        while len(received) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        sink.shutdown()
    assert [decoded(body) for body in received] == [decoded(encode_spans(spans).SerializeToString())] * 2


def test_the_served_tracer_exports_through_the_direct_encoder():
    tracer = otlp_tracer("http://127.0.0.1:9/v1/traces").tracer
    try:
        exporter = tracer.span_processor._span_processors[0].span_exporter
        assert isinstance(exporter, DirectOTLPSpanExporter) and exporter.direct
    finally:
        tracer.span_processor.shutdown()


def test_stage_spans_go_to_the_served_exporter_as_one_item_and_encode_as_their_spans(caplog):
    """With the served pipeline (the SDK's batch processor, the direct exporter) a request's stage spans are one
    `StageSpans` item, written straight from its numbers: the same message as the SDK's encoder makes of the
    `ReadableSpan`s it stands for. A request whose attributes need the SDK's cleaning takes `ReadableSpan`s."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

    from basal.observability.otlp import StageSpans, spans_of

    batches: list[list] = []

    class Capture(DirectOTLPSpanExporter):
        def export(self, spans):
            batches.append(list(spans))
            return SpanExportResult.SUCCESS

    provider = TracerProvider(resource=Resource.create({"service.name": "basal"}))
    provider.add_span_processor(BatchSpanProcessor(Capture(endpoint="http://127.0.0.1:9/v1/traces")))
    tracer = Tracer(provider.get_tracer("basal"))
    assert tracer._direct._bundled is not None
    traceparent = f"00-{REMOTE.trace_id:032x}-{REMOTE.span_id:016x}-01".encode()
    for i, headers in enumerate(([], [(b"traceparent", traceparent), (b"tracestate", b"k=v,a=b")])):
        with tracer.server_span({"method": "POST", "path": "/v1/systemone"}, headers) as span:
            tracer.stages(1_000, 2_000, 9_000, 0.003, 0.002, {"basal.model": "demo", "basal.request_id": f"r{i}"})
            span.set_attribute("http.response.status_code", 200)
    with tracer.server_span({"method": "POST", "path": "/v1/systemone"}, []):
        tracer.stages(1_000, 2_000, 9_000, 0.003, 0.002, {"basal.model": "demo", "tags": ["a"]})  # to clean
    provider.force_flush()
    provider.shutdown()
    items = [item for batch in batches for item in batch]
    assert [type(item) is StageSpans for item in items].count(True) == 2 and len(spans_of(items)) == 15
    with caplog.at_level(logging.CRITICAL):
        assert decoded(SpanEncoder().encode(items)) == decoded(encode_spans(spans_of(items)).SerializeToString())
    spans = spans_of(items)
    by_id = {s.context.span_id: s for s in spans}
    for stage in (s for s in spans if s.name in ("basal.queue", "basal.compute")):
        assert by_id[stage.parent.span_id].name == "basal.engine"
    for s in spans:
        if s.name in ("basal.parse", "basal.engine"):
            assert by_id[s.parent.span_id].name == "POST /v1/systemone"
