"""OpenTelemetry spans of a decision request (the `otel` extra): off, and never imported, unless configured.

The tree under the HTTP server span (joined to an incoming `traceparent`):

    POST /v1/systemone             the whole request (basal.api.observe)
      basal.parse                  body read, decoded and validated
      basal.engine                 planning to the answer (on a Ray front: the replica's call)
        basal.queue                admission to the start of its batch
        basal.batch                the batch pass on the device (forwards and the decision math)

The engine's stages run on lane threads shared by many requests, so they are not traced live: their spans are
written after the answer from the timings the engine measured (queue and compute ms), with explicit start and end
times. The request path pays nothing for tracing beyond building these few spans, and nothing at all when off.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Any


class Tracer:
    """A thin holder of an OpenTelemetry tracer: the server span, and the request's stage spans."""

    def __init__(self, tracer: Any):
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer, self._trace = tracer, trace
        self._propagator = TraceContextTextMapPropagator()

    def server_span(self, scope: Any, headers: list[tuple[bytes, bytes]]) -> AbstractContextManager:
        carrier = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers if k.lower() == b"traceparent"}
        carrier |= {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers if k.lower() == b"tracestate"}
        parent = self._propagator.extract(carrier) if carrier else None
        method, path = scope.get("method", ""), scope.get("path", "")
        return self.tracer.start_as_current_span(
            f"{method} {path}",
            context=parent,
            kind=self._trace.SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        )

    def stages(
        self, start_ns: int, parsed_ns: int, end_ns: int, queue_ms: float, compute_ms: float, attributes: dict
    ) -> None:
        """The request's stage spans under the current (server) span, from the measured times."""
        t = self.tracer
        t.start_span("basal.parse", start_time=start_ns).end(end_time=parsed_ns)
        engine = t.start_span("basal.engine", start_time=parsed_ns, attributes=attributes)
        ctx = self._trace.set_span_in_context(engine)
        queued = min(end_ns, parsed_ns + int(queue_ms * 1e6))
        computed = min(end_ns, queued + int(compute_ms * 1e6))
        t.start_span("basal.queue", context=ctx, start_time=parsed_ns).end(end_time=queued)
        t.start_span("basal.batch", context=ctx, start_time=queued).end(end_time=computed)
        engine.end(end_time=end_ns)


def otlp_tracer(endpoint: str, service: str = "basal") -> Tracer:
    """A tracer exporting over OTLP/HTTP to `endpoint` in batches (a background thread; export never blocks)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        raise ValueError(f"tracing needs the otel extra: pip install 'basal-engine[otel]' ({e})") from e
    # the SDK reads the usual OTEL_* variables: OTEL_TRACES_SAMPLER(_ARG) to sample, OTEL_BSP_* for the batches
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return Tracer(provider.get_tracer("basal"))
