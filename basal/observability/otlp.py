"""OTLP/protobuf of finished spans, written directly: the bytes of an `ExportTraceServiceRequest`.

The SDK's encoder builds a protobuf message object per span, attribute, value, status and scope, then serialises
the tree; at a few spans per request that costs as much CPU as the request's own HTTP handling, in the exporter
thread but under the same GIL. The wire format is simple (varints, fixed-width numbers, length-prefixed fields),
so this writes the same message field by field from the finished spans, with the resource and the
instrumentation scope (the same for every span) encoded once. A test decodes its bytes and the SDK encoder's
with the opentelemetry-proto classes and finds them equal, for every field the SDK sets. A request's four stage
spans come as one `StageSpans` (ids, times, attributes) from the served tracer and are written straight from it.

Field numbers are those of opentelemetry/proto/{collector/trace,trace,common,resource}/v1/*.proto.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

try:  # the exporter's size check (since 1.4x, with the `_client` that sends)
    from opentelemetry.exporter.otlp.proto.http._common import RequestPayloadTooLargeError as _TooLarge
    from opentelemetry.exporter.otlp.proto.http._common import _is_request_too_large as _too_large
except ImportError:
    _too_large = None

log = logging.getLogger(__name__)

_BYTE = [bytes((i,)) for i in range(128)]
_INT64 = (-(1 << 63), 1 << 63)
_KIND = {"INTERNAL": 1, "SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}  # SpanKind name -> Span.SpanKind
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags: the parent's is_remote is known, and it is remote
_FLAGS = {False: b"\x85\x01" + struct.pack("<I", _HAS_IS_REMOTE),  # field 16 (fixed32); tag 133 as a varint
          True: b"\x85\x01" + struct.pack("<I", _HAS_IS_REMOTE | _IS_REMOTE)}  # fmt: skip
_LINK_FLAGS = {remote: b"\x35" + flags[2:] for remote, flags in _FLAGS.items()}  # Link.flags is field 6
_CACHE_LIMIT = 4096  # encoded names and attributes kept (a span name carries the path, a request its id)
_TIMES = struct.Struct("<BQBQ").pack  # start and end: fields 7 and 8, fixed64


def varint(n: int) -> bytes:
    if n < 128:
        return _BYTE[n] if n >= 0 else varint(n + (1 << 64))  # a negative int64 is its 64-bit two's complement
    out = bytearray()
    while n > 127:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (string, bytes or message): tag, length, payload."""
    n = len(payload)
    return tag + (_BYTE[n] if n < 128 else varint(n)) + payload


def times(start: int | None, end: int | None) -> bytes:
    """A span's start and end fields (7 and 8, fixed64), each left out when unset."""
    if start and end:
        return _TIMES(0x39, start, 0x41, end)
    return (b"\x39" + struct.pack("<Q", start) if start else b"") + (b"\x41" + struct.pack("<Q", end) if end else b"")


def any_value(value: Any) -> bytes:
    """An AnyValue message's content, in the SDK encoder's order of type checks (bool before int, str and bytes
    before sequences). Raises for a type or value protobuf cannot hold (the attribute is then skipped)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return field(b"\x0a", value.encode())
    if isinstance(value, int):
        if not _INT64[0] <= value < _INT64[1]:
            raise ValueError(f"{value} is out of the int64 range")
        return b"\x18" + varint(value)
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    if isinstance(value, bytes):
        return field(b"\x3a", value)
    if isinstance(value, Sequence):
        return field(b"\x2a", b"".join([field(b"\x0a", any_value(v)) for v in value]))
    if isinstance(value, Mapping):
        return field(b"\x32", b"".join([field(b"\x0a", key_value(str(k), v)) for k, v in value.items()]))
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def key_value(key: str, value: Any) -> bytes:
    return field(b"\x0a", key.encode()) + field(b"\x12", any_value(value))


class SpanEncoder:
    """Encodes batches of finished `ReadableSpan`s (and `StageSpans`); keeps the encoded resources, scopes, names
    and plain attributes."""

    def __init__(self):
        self._held: dict[int, tuple[Any, bytes]] = {}  # id(resource or scope) -> (it, its encoded message)
        self._names: dict[tuple[str, str], bytes] = {}  # (name, kind's name) -> both fields
        self._pairs: dict[tuple, bytes] = {}  # (tag, key, type, value) -> the attribute's field

    def encode(self, spans: Sequence[Any]) -> bytes:
        """An ExportTraceServiceRequest: the spans grouped by resource, then by instrumentation scope, each group
        in the order it first appears (as the SDK's encoder groups them: by equality)."""
        groups: dict[Any, dict[Any, list[bytes]]] = {}
        seen: dict[tuple[int, int], list[bytes]] = {}  # (id(resource), id(scope)) -> its group's list
        for span in spans:
            resource, scope = span.resource, span.instrumentation_scope or None
            found = seen.get((id(resource), id(scope)))
            if found is None:  # equality (a hash each) once per distinct pair of objects in the batch
                found = seen[(id(resource), id(scope))] = groups.setdefault(resource, {}).setdefault(scope, [])
            if type(span) is StageSpans:
                found += self.stage_spans(span)
            else:
                found.append(field(b"\x12", self.span(span)))
        out = []
        for resource, scopes in groups.items():
            body = [field(b"\x0a", self._resource(resource))]
            for scope, encoded in scopes.items():
                scope_spans = [field(b"\x0a", self._scope(scope)), *encoded]
                if scope is not None and scope.schema_url:
                    scope_spans.append(field(b"\x1a", scope.schema_url.encode()))
                body.append(field(b"\x12", b"".join(scope_spans)))
            if resource.schema_url:
                body.append(field(b"\x1a", resource.schema_url.encode()))
            out.append(field(b"\x0a", b"".join(body)))
        return b"".join(out)

    def span(self, span: Any) -> bytes:
        """One Span message's content, fields in number order (as protobuf writes them). Reads the fields of the
        SDK's `ReadableSpan` itself: its properties copy the attributes, events and links into new views."""
        context, parent, attributes, events, links = (
            span._context, span._parent, span._attributes, span._events, span._links
        )  # fmt: skip
        out = [b"\x0a\x10", context.trace_id.to_bytes(16, "big"), b"\x12\x08", context.span_id.to_bytes(8, "big")]
        if context.trace_state:
            state = ",".join([f"{k}={v}" for k, v in context.trace_state.items()])
            out.append(field(b"\x1a", state.encode()))
        if parent is not None:
            out += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
        out += (self._head(span._name, span._kind.name), times(span._start_time, span._end_time))
        if attributes:
            self._attributes(out, b"\x4a", attributes)
            if dropped := getattr(attributes, "dropped", 0):
                out.append(b"\x50" + varint(dropped))
        if events:
            out += [field(b"\x5a", self._event(event)) for event in list(events)]
            if dropped := getattr(events, "dropped", 0):
                out.append(b"\x60" + varint(dropped))
        if links:
            out += [field(b"\x6a", self._link(link)) for link in list(links)]
            if dropped := getattr(links, "dropped", 0):
                out.append(b"\x70" + varint(dropped))
        status = span._status
        if status is not None:
            code, message = status.status_code.value, status.description
            if code or message:
                out.append(
                    field(
                        b"\x7a",
                        (field(b"\x12", message.encode()) if message else b"")
                        + (b"\x18" + varint(code) if code else b""),
                    )
                )
            else:
                out.append(b"\x7a\x00")
        out.append(_FLAGS[parent is not None and parent.is_remote])
        return b"".join(out)

    def stage_spans(self, stages: StageSpans) -> list[bytes]:
        """The four Span fields of `StageSpans`, as `span()` writes the `ReadableSpan`s it stands for: the same
        trace (the server span's id, flags and state), local parents, no events, links or status."""
        parent = stages.context
        trace = b"\x0a\x10" + parent.trace_id.to_bytes(16, "big")
        state = b""
        if parent.trace_state:
            state = field(b"\x1a", ",".join([f"{k}={v}" for k, v in parent.trace_state.items()]).encode())
        engine, parse, queue, compute = [b"\x12\x08" + own.to_bytes(8, "big") + state for own in stages.ids]
        server = b"\x22\x08" + parent.span_id.to_bytes(8, "big")
        under_engine = b"\x22\x08" + stages.ids[0].to_bytes(8, "big")
        start, parsed, queued, computed, end = stages.times
        attributes: list[bytes] = []
        self._attributes(attributes, b"\x4a", stages.attributes)
        tail = b"\x7a\x00" + _FLAGS[False]  # an UNSET status; a local parent
        rows = (
            (parse, server, "basal.parse", times(start, parsed), b""),
            (queue, under_engine, "basal.queue", times(parsed, queued), b""),
            (compute, under_engine, "basal.compute", times(queued, computed), b""),
            (engine, server, "basal.engine", times(parsed, end), b"".join(attributes)),
        )
        return [
            field(b"\x12", b"".join((trace, own, parent_id, self._head(name, "INTERNAL"), span_times, fields, tail)))
            for own, parent_id, name, span_times, fields in rows
        ]

    def _head(self, name: str, kind: str) -> bytes:
        """The name and kind fields, kept encoded."""
        head = self._names.get((name, kind))
        if head is None:
            head = (field(b"\x2a", name.encode()) if name else b"") + b"\x30" + _BYTE[_KIND[kind]]
            self._remember(self._names, (name, kind), head)
        return head

    def _attributes(self, out: list[bytes], tag: bytes, attributes: Mapping[str, Any] | None) -> None:
        """Each attribute as a KeyValue field; one that cannot be encoded is logged and left out (as the SDK does).
        Pairs of a key and a plain value (the model, the method, a status) repeat from span to span: kept encoded."""
        if not attributes:
            return
        pairs = self._pairs
        for key, value in getattr(attributes, "_dict", attributes).items():  # a BoundedAttributes' own dict
            kind = type(value)
            plain = kind is str or kind is int or kind is bool or kind is float
            encoded = pairs.get((tag, key, kind, value)) if plain else None
            if encoded is None:
                try:
                    encoded = field(tag, key_value(key, value))
                except Exception as error:  # one bad attribute must not lose the batch
                    log.exception("Failed to encode key %s: %s", key, error)
                    continue
                if plain:
                    self._remember(pairs, (tag, key, kind, value), encoded)
            out.append(encoded)

    @staticmethod
    def _remember(cache: dict, key: Any, encoded: bytes) -> None:
        if len(cache) >= _CACHE_LIMIT:  # bounded: request ids and paths never repeat
            cache.clear()
        cache[key] = encoded

    def _event(self, event: Any) -> bytes:
        out = [b"\x09" + struct.pack("<Q", event.timestamp)] if event.timestamp else []
        if event.name:
            out.append(field(b"\x12", event.name.encode()))
        self._attributes(out, b"\x1a", event.attributes)
        if event.dropped_attributes:
            out.append(b"\x20" + varint(event.dropped_attributes))
        return b"".join(out)

    def _link(self, link: Any) -> bytes:
        context = link.context
        out = [b"\x0a\x10", context.trace_id.to_bytes(16, "big"), b"\x12\x08", context.span_id.to_bytes(8, "big")]
        self._attributes(out, b"\x22", link.attributes)
        if link.dropped_attributes:
            out.append(b"\x28" + varint(link.dropped_attributes))
        out.append(_LINK_FLAGS[context.is_remote])
        return b"".join(out)

    def _resource(self, resource: Any) -> bytes:
        held = self._held.get(id(resource))
        if held is None or held[0] is not resource:
            out: list[bytes] = []
            self._attributes(out, b"\x0a", resource.attributes)
            held = self._hold(resource, b"".join(out))
        return held[1]

    def _scope(self, scope: Any) -> bytes:
        held = self._held.get(id(scope))
        if held is None or held[0] is not scope:
            out = []
            if scope is not None:
                out += [field(b"\x0a", scope.name.encode()) if scope.name else b""]
                out += [field(b"\x12", scope.version.encode()) if scope.version else b""]
                self._attributes(out, b"\x1a", scope.attributes)
            held = self._hold(scope, b"".join(out))
        return held[1]

    def _hold(self, it: Any, encoded: bytes) -> tuple[Any, bytes]:
        if len(self._held) >= 64:  # resources and scopes are a handful per process; never grow without bound
            self._held.clear()
        held = self._held[id(it)] = (it, encoded)  # holding `it` keeps its id from being reused by another object
        return held


class StageSpans:
    """A request's four stage spans (parse, and queue and batch under engine; `tracing.py`) as one item of the
    batch processor's queue, from the served tracer: the encoder writes them straight from these numbers, and
    `spans()` gives the `ReadableSpan`s they stand for (the same ids, times and attributes). The batch processor
    reads only `context` (the server span's: sampled or not)."""

    __slots__ = ("attributes", "context", "ids", "maker", "times")

    def __init__(self, context: Any, ids: tuple, times: tuple, attributes: dict, maker: Any):
        self.context, self.ids, self.times, self.attributes, self.maker = context, ids, times, attributes, maker

    @property
    def resource(self) -> Any:
        return self.maker._resource

    @property
    def instrumentation_scope(self) -> Any:
        return self.maker._scope

    def spans(self) -> list:
        return self.maker.stage_spans(self.context, self.ids, self.times, self.attributes)


def spans_of(items: Sequence[Any]) -> list:
    """The `ReadableSpan`s of a batch, `StageSpans` unfolded (for the SDK's encoder)."""
    return [span for item in items for span in (item.spans() if type(item) is StageSpans else (item,))]


class DirectOTLPSpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP span exporter (its transport, retries, compression, headers, size limit and own metrics)
    encoding with `SpanEncoder`. Where the installed SDK's exporter has another shape than the one this follows (a
    `_client` that sends the bytes, since 1.4x), it is the SDK's exporter unchanged."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._encoder = SpanEncoder()
        known = ("_client", "_metrics", "_max_request_size", "_shutdown")
        self.direct = _too_large is not None and all(hasattr(self, name) for name in known)

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        if not self.direct or self._shutdown:
            return super().export(spans_of(spans))
        with self._metrics.export_operation(len(spans)) as result:
            try:
                try:
                    data = self._encoder.encode(spans)
                except AttributeError:  # not the SDK's ReadableSpans, whose fields the encoder reads
                    data = encode_spans(spans_of(spans)).SerializePartialToString()
            except Exception as error:  # as the SDK: a batch that cannot be encoded fails
                log.error("Failed to encode span batch: %s", error)
                result.error = error
                return SpanExportResult.FAILURE
            if _too_large(data, self._max_request_size):
                log.warning("Dropping span batch: %d bytes exceed max_request_size", len(data))
                result.error = _TooLarge(f"{len(data)} bytes exceed max_request_size {self._max_request_size}")
                return SpanExportResult.FAILURE
            sent = self._client.export(data)
            if not sent.success:
                result.error = sent.error
                code = sent.status_code
                result.error_attrs = {"http.response.status_code": code} if code is not None else None
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS
