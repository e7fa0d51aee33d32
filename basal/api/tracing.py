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
        self._direct = _DirectSpans.of(tracer)

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
        queued = min(end_ns, parsed_ns + int(queue_ms * 1e6))
        computed = min(end_ns, queued + int(compute_ms * 1e6))
        if self._direct is not None:
            self._direct.stages(
                self._trace.get_current_span(), start_ns, parsed_ns, queued, computed, end_ns, attributes
            )
            return
        t = self.tracer
        t.start_span("basal.parse", start_time=start_ns).end(end_time=parsed_ns)
        engine = t.start_span("basal.engine", start_time=parsed_ns, attributes=attributes)
        ctx = self._trace.set_span_in_context(engine)
        t.start_span("basal.queue", context=ctx, start_time=parsed_ns).end(end_time=queued)
        t.start_span("basal.batch", context=ctx, start_time=queued).end(end_time=computed)
        engine.end(end_time=end_ns)


_PLAIN = (int, float, bool)  # exact types (a subclass could clean differently)


class _DirectSpans:
    """The stage spans built finished and handed straight to the SDK's span processors.

    They are already over when they are written, so the SDK's live-span machinery (a sampler call, a lock, event and
    link lists, start and end hooks per span) is pure cost: this builds the same exported spans (names, ids, parents,
    times, attributes, resource, scope) as `ReadableSpan`s at a fraction of it. They follow the server span's
    sampling decision, as the SDK's default parent-based sampler would: none when it is not recording. Used only with
    the SDK's own tracer, which exposes what is needed; any other tracer takes the general path.
    """

    def __init__(self, tracer: Any):
        from opentelemetry.attributes import BoundedAttributes
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext

        self._readable, self._context = ReadableSpan, SpanContext
        self._processor, self._resource = tracer.span_processor, tracer.resource
        self._ids, self._scope, self._info = (
            tracer.id_generator,
            tracer._instrumentation_scope,
            tracer.instrumentation_info,
        )
        limits = tracer._span_limits  # the same limits (and value checks) as a live span's initial attributes
        self._bounded = lambda found: BoundedAttributes(
            limits.max_span_attributes, found, immutable=True, max_value_len=limits.max_span_attribute_length
        )
        self._most, self._longest = limits.max_span_attributes, limits.max_span_attribute_length
        self._no_attributes = self._bounded(None)  # immutable, so the spans without attributes share one

    def _attributes(self, found: dict) -> Any:
        """The span's attributes as the limits leave them. Plain strings, numbers and booleans within the limits
        (the engine's: model, questions, request id, replica) are what the SDK's cleaning would keep unchanged, so a
        copy of them is the same attributes, without its per-value type checks (a third of these spans' cost)."""
        if self._most is not None and len(found) > self._most:
            return self._bounded(found)
        for key, value in found.items():
            if type(key) is not str or not key:
                return self._bounded(found)
            if type(value) is str:
                if self._longest is not None and len(value) > self._longest:
                    return self._bounded(found)
            elif type(value) not in _PLAIN:
                return self._bounded(found)
        return dict(found)

    @classmethod
    def of(cls, tracer: Any) -> _DirectSpans | None:
        try:
            from opentelemetry.sdk.trace import Tracer as SdkTracer
        except ImportError:
            return None
        needed = (
            "span_processor",
            "resource",
            "id_generator",
            "instrumentation_info",
            "_instrumentation_scope",
            "_span_limits",
        )
        if type(tracer) is not SdkTracer or not all(hasattr(tracer, name) for name in needed):
            return None
        return cls(tracer)

    def stages(self, server: Any, start: int, parsed: int, queued: int, computed: int, end: int, attributes: dict):
        if not server.is_recording():
            return
        parent = server.get_span_context()
        trace_id, flags, state = parent.trace_id, parent.trace_flags, parent.trace_state
        ids, context = self._ids, self._context

        def span(name: str, parent: Any, start_time: int, end_time: int, attributes: dict | None = None) -> Any:
            own = context(trace_id, ids.generate_span_id(), is_remote=False, trace_flags=flags, trace_state=state)
            return self._readable(
                name,
                context=own,
                parent=parent,
                resource=self._resource,
                attributes=self._attributes(attributes) if attributes else self._no_attributes,
                start_time=start_time,
                end_time=end_time,
                instrumentation_info=self._info,
                instrumentation_scope=self._scope,
            )

        engine = span("basal.engine", parent, parsed, end, attributes)
        for finished in (
            span("basal.parse", parent, start, parsed),
            span("basal.queue", engine.context, parsed, queued),
            span("basal.batch", engine.context, queued, computed),
            engine,
        ):
            self._processor.on_end(finished)


# Each export is one HTTP POST (about 1 ms of the exporter thread's CPU, under the GIL the requests need). 2048
# spans per export (about 400 requests) instead of the SDK's 512 took tracing's CPU per request from ~110 to ~90 us
# in `python -m bench.observability --micro` (tracing_cpu, three alternations on a loaded machine). The queue holds
# four exports, so a slow collector does not make the server drop spans at once. An export is about 250 kB, far
# under a collector's request limit. Either OTEL_BSP_ variable set: the SDK's settings, from the environment.
EXPORT_BATCH = {"max_export_batch_size": 2048, "max_queue_size": 8192}


def otlp_tracer(endpoint: str, service: str = "basal") -> Tracer:
    """A tracer exporting over OTLP/HTTP to `endpoint` in batches (a background thread; export never blocks)."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from basal.api.otlp import DirectOTLPSpanExporter
    except ImportError as e:
        raise ValueError(f"tracing needs the otel extra: pip install 'basal-engine[otel]' ({e})") from e
    # the SDK reads the usual OTEL_* variables: OTEL_TRACES_SAMPLER(_ARG) to sample, OTEL_BSP_* for the batches
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})
    provider = TracerProvider(resource=_frozen(resource))
    operator_set = any(f"OTEL_BSP_{key.upper()}" in os.environ for key in EXPORT_BATCH)
    batches = {} if operator_set else EXPORT_BATCH
    provider.add_span_processor(BatchSpanProcessor(DirectOTLPSpanExporter(endpoint=endpoint), **batches))
    return Tracer(provider.get_tracer("basal"))


def _frozen(resource: Any) -> Any:
    """The same resource with its hash computed once. The OTLP encoder groups every exported span by its resource,
    and `Resource.__hash__` serialises all its attributes to JSON each time; a resource never changes (its attributes
    are immutable), so one hash serves them all."""
    kind = type(resource)

    class FrozenResource(kind):
        def __hash__(self) -> int:
            found = self.__dict__.get("_hash")
            if found is None:
                found = self.__dict__["_hash"] = kind.__hash__(self)
            return found

    return FrozenResource(resource.attributes, resource.schema_url)
