"""OpenTelemetry spans of a decision request (the `otel` extra): off, and never imported, unless configured.

The tree under the HTTP server span (joined to an incoming `traceparent`):

    POST /v1/systemone             the whole request (basal.observability.request_context)
      basal.parse                  body read, decoded and validated
      basal.engine                 planning to the answer (on a Ray front: the replica's call)
        basal.queue                admission to the start of its pass
        basal.compute              the pass on the device (forwards and the decision math)

The engine's stages run on lane threads shared by many requests, so they are not traced live: their spans are
written after the answer from the timings the engine measured (queue and compute ms), with explicit start and end
times. The request path pays nothing for tracing beyond building these few spans, and nothing at all when off.

With the SDK's own tracer the spans skip the SDK's live-span machinery: the stage spans are built finished, and
the server span is started as the SDK starts one (sampling, ids, flags) but written finished at its end, unless
something asks for more than attributes (then the SDK's live span takes over). Tests compare every exported field
with the SDK's own path. The served exporter (basal.observability.otlp) writes the OTLP bytes directly.
"""

from __future__ import annotations

import os
import time
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
        name, attributes = f"{method} {path}", {"http.request.method": method, "url.path": path}
        if self._direct is not None and self._direct.servers:
            return self._direct.server(name, parent, attributes)
        return self.tracer.start_as_current_span(
            name, context=parent, kind=self._trace.SpanKind.SERVER, attributes=attributes
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
        t.start_span("basal.compute", context=ctx, start_time=queued).end(end_time=computed)
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
        self.tracer, self.limits = tracer, limits
        self.servers = _servers_direct(tracer)
        self._server_span = _server_span_class() if self.servers else None
        self._bundled, self._bundle = _bundling(tracer)

    def _attributes(self, found: dict) -> Any:
        """The span's attributes as the limits leave them: a copy where `plain` finds them plain, else the SDK's
        bounded and cleaned map."""
        return dict(found) if self.plain(found) else self._bounded(found)

    def plain(self, found: dict) -> bool:
        """Plain strings, numbers and booleans within the limits (the engine's: model, questions, request id; the
        server span's method, path, status) are what the SDK's cleaning keeps unchanged, so a copy of them is the
        same attributes without its per-value type checks (a third of the stage spans' cost)."""
        if self._most is not None and len(found) > self._most:
            return False
        for key, value in found.items():
            if type(key) is not str or not key:
                return False
            if type(value) is str:
                if self._longest is not None and len(value) > self._longest:
                    return False
            elif type(value) not in _PLAIN:
                return False
        return True

    def server(self, name: str, context: Any, attributes: dict) -> AbstractContextManager:
        """The server span as the SDK's `start_as_current_span` starts it (same sampling call, ids, flags and
        trace state, tracer metrics), without the live span's machinery: see `_ServerSpan`."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanContext, TraceFlags

        tracer, ids = self.tracer, self._ids
        if not tracer._is_enabled():
            return tracer.start_as_current_span(
                name, context=context, kind=trace.SpanKind.SERVER, attributes=attributes
            )
        parent = trace.get_current_span(context).get_span_context()
        if parent is None or not parent.is_valid:
            parent, trace_id, random = None, ids.generate_trace_id(), ids.is_trace_id_random()
        else:
            trace_id, random = parent.trace_id, parent.trace_flags.random_trace_id
        sampled = tracer.sampler.should_sample(context, trace_id, name, trace.SpanKind.SERVER, attributes, ())
        flags = TraceFlags.SAMPLED if sampled.decision.is_sampled() else TraceFlags.DEFAULT
        flags = TraceFlags(flags | TraceFlags.RANDOM_TRACE_ID if random else flags)
        own = SpanContext(trace_id, ids.generate_span_id(), is_remote=False, trace_flags=flags,
                          trace_state=sampled.trace_state)  # fmt: skip
        record_end = tracer._tracer_metrics.start_span(parent, sampled.decision)
        if not sampled.decision.is_recording():
            return trace.use_span(trace.NonRecordingSpan(own), end_on_exit=True)
        return self._server_span(self, name, own, parent, dict(sampled.attributes or {}), context, record_end)

    def finish(self, span: Any, attributes: dict, end: int) -> None:
        """The server span (`_server_span_class`), ended with plain attributes: written finished, as the stages."""
        self._processor.on_end(
            self._readable(
                span.name,
                context=span.context,
                parent=span.parent,
                resource=self._resource,
                attributes=attributes,
                kind=span.kind,
                start_time=span.start,
                end_time=end,
                instrumentation_info=self._info,
                instrumentation_scope=self._scope,
            )
        )

    def live(self, span: Any) -> Any:
        """The SDK's own live span for `span` (same context, start and attributes so far), for what the direct one
        does not do itself: events, links, status, exceptions, a new name, attributes the SDK must clean."""
        from opentelemetry.sdk.trace import Span

        class StartedLate(Span):  # the SDK's `Span` is made only through subclasses (its tracer's `_Span`)
            pass

        tracer = self.tracer
        found = StartedLate(
            name=span.name,
            context=span.context,
            parent=span.parent,
            sampler=tracer.sampler,
            resource=self._resource,
            attributes=span.initial,
            span_processor=self._processor,
            kind=span.kind,
            instrumentation_info=self._info,
            limits=self.limits,
            instrumentation_scope=self._scope,
            record_end_metrics=span.record_end,
        )
        found.start(start_time=span.start, parent_context=span.start_context)
        for key, value in span.later.items():
            found.set_attribute(key, value)
        return found

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
        parent, generate = server.get_span_context(), self._ids.generate_span_id
        ids = (generate(), generate(), generate(), generate())  # engine, parse, queue, compute
        times = (start, parsed, queued, computed, end)
        if self._bundled is not None and self.plain(attributes):
            self._bundled.on_end(self._bundle(parent, ids, times, dict(attributes), self))
            return
        for finished in self.stage_spans(parent, ids, times, attributes):
            self._processor.on_end(finished)

    def stage_spans(self, parent: Any, ids: tuple, times: tuple, attributes: dict) -> list:
        """The four stage spans as `ReadableSpan`s, in the order they are handed over (the engine span last)."""
        trace_id, flags, state = parent.trace_id, parent.trace_flags, parent.trace_state
        start, parsed, queued, computed, end = times
        context = self._context

        def span(name: str, own: int, parent: Any, start_time: int, end_time: int, attributes: dict | None = None):
            return self._readable(
                name,
                context=context(trace_id, own, is_remote=False, trace_flags=flags, trace_state=state),
                parent=parent,
                resource=self._resource,
                attributes=self._attributes(attributes) if attributes else self._no_attributes,
                start_time=start_time,
                end_time=end_time,
                instrumentation_info=self._info,
                instrumentation_scope=self._scope,
            )

        engine = span("basal.engine", ids[0], parent, parsed, end, attributes)
        return [
            span("basal.parse", ids[1], parent, start, parsed),
            span("basal.queue", ids[2], engine.context, parsed, queued),
            span("basal.compute", ids[3], engine.context, queued, computed),
            engine,
        ]


def _servers_direct(tracer: Any) -> bool:
    """Whether the server span can be direct: the SDK pieces `_DirectSpans.server` repeats are those it knows (1.4x),
    and the span processors are the SDK's batch or simple ones, which do nothing when a span starts or is ending
    (a span built finished calls neither hook)."""
    from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.trace import TraceFlags

    processors = getattr(tracer.span_processor, "_span_processors", None)
    return (
        type(tracer.span_processor) is SynchronousMultiSpanProcessor
        and processors is not None
        and all(type(p) in (BatchSpanProcessor, SimpleSpanProcessor) for p in processors)
        and all(hasattr(tracer, name) for name in ("_is_enabled", "_tracer_metrics", "sampler"))
        and hasattr(tracer.id_generator, "is_trace_id_random")
        and hasattr(TraceFlags, "RANDOM_TRACE_ID")
    )


def _bundling(tracer: Any) -> tuple[Any, Any]:
    """(the batch processor, `StageSpans`) where the stage spans can go to the exporter as one item: the tracer's
    only span processor is the SDK's batch one, exporting through basal's direct OTLP encoder, which writes them
    straight from their numbers; (None, None) otherwise (any other processor or exporter gets `ReadableSpan`s)."""
    from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    try:
        from basal.observability.otlp import DirectOTLPSpanExporter, StageSpans
    except ImportError:  # no OTLP exporter installed
        return None, None
    processors = getattr(tracer.span_processor, "_span_processors", ())
    if type(tracer.span_processor) is not SynchronousMultiSpanProcessor or len(processors) != 1:
        return None, None
    (only,) = processors
    exporter = getattr(only, "span_exporter", None)
    if type(only) is not BatchSpanProcessor or not isinstance(exporter, DirectOTLPSpanExporter) or not exporter.direct:
        return None, None
    return only, StageSpans


def _server_span_class() -> type:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    class ServerSpan(trace.Span):
        """The HTTP server span, current while the request runs. What a request does to it (a status code attribute,
        the end) is kept here and written finished by `_DirectSpans.finish`; anything else (an exception, an event,
        a status, an attribute value the SDK must clean) turns it into the SDK's live span (`_DirectSpans.live`),
        which then gets every call, so the export is the SDK's in every case."""

        kind = trace.SpanKind.SERVER

        def __init__(self, direct, name, context, parent, initial, start_context, record_end):
            self.direct, self.name, self.context, self.parent = direct, name, context, parent
            self.initial, self.later, self.start_context, self.record_end = initial, {}, start_context, record_end
            self.start, self.ended, self.found, self.token = time.time_ns(), False, None, None

        def _live(self) -> Any:
            if self.found is None:
                self.found = self.direct.live(self)
            return self.found

        def get_span_context(self):
            return self.context

        def is_recording(self) -> bool:
            return self.found.is_recording() if self.found is not None else not self.ended

        def set_attribute(self, key: str, value: Any) -> None:
            if self.found is not None:
                self.found.set_attribute(key, value)
            elif not self.ended:
                self.later.pop(key, None)  # a key set again moves to the end, as in the SDK's attributes
                self.later[key] = value

        def set_attributes(self, attributes) -> None:
            for key, value in attributes.items():
                self.set_attribute(key, value)

        def add_event(self, name, attributes=None, timestamp=None) -> None:
            self._live().add_event(name, attributes, timestamp)

        def add_link(self, context, attributes=None) -> None:
            self._live().add_link(context, attributes)

        def update_name(self, name: str) -> None:
            self._live().update_name(name)

        def set_status(self, status, description=None) -> None:
            self._live().set_status(status, description)

        def record_exception(self, exception, attributes=None, timestamp=None, escaped=False) -> None:
            self._live().record_exception(exception, attributes, timestamp, escaped)

        def end(self, end_time: int | None = None) -> None:
            if self.found is None and not self.ended:
                attributes = dict(self.initial)
                for key, value in self.later.items():
                    attributes.pop(key, None)
                    attributes[key] = value
                if self.direct.plain(attributes):
                    self.ended = True
                    self.record_end()
                    self.direct.finish(self, attributes, end_time if end_time is not None else time.time_ns())
                    return
            if self.found is not None or not self.ended:
                self._live().end(end_time)

        def __enter__(self) -> ServerSpan:
            self.token = otel_context.attach(trace.set_span_in_context(self))
            return self

        def __exit__(self, kind, exc, tb) -> bool:
            """As the SDK's `use_span`: an `Exception` (not a BaseException such as a cancellation) is recorded as an
            event and an ERROR status; the span ends either way."""
            otel_context.detach(self.token)
            try:
                if isinstance(exc, Exception) and self.is_recording():
                    self.record_exception(exc)
                    self.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            finally:
                self.end()
            return False

    return ServerSpan


# Each export is one HTTP POST (about 1 ms of the exporter thread's CPU, under the GIL the requests need). 2048
# queue items per export instead of the SDK's 512 took tracing's CPU per request from ~110 to ~90 us in
# `python -m bench.lab.observability --micro` (tracing_cpu, three alternations on a loaded machine). A served request is
# two items (its server span; its stage spans as one `StageSpans`), so an export carries ~1000 requests, ~600 kB,
# far under a collector's request limit; the queue holds four exports, so a slow collector does not make the
# server drop spans at once. Either OTEL_BSP_ variable set: the SDK's settings, from the environment.
EXPORT_BATCH = {"max_export_batch_size": 2048, "max_queue_size": 8192}


def otlp_tracer(endpoint: str, service: str = "basal") -> Tracer:
    """A tracer exporting over OTLP/HTTP to `endpoint` in batches (a background thread; export never blocks)."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from basal.observability.otlp import DirectOTLPSpanExporter
    except ImportError as e:
        raise ValueError(f"tracing needs the otel extra: pip install 'basal-bitwise[otel]' ({e})") from e
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
