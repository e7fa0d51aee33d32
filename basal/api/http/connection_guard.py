"""uvicorn's httptools protocol with the limits it lacks: header size and count, read timeouts, a connection cap.

uvicorn 0.54 bounds none of these for httptools (its h11 protocol has only ``h11_max_incomplete_event_size``, its
keep-alive timer starts after the first response, ``limit_concurrency`` answers 503 but still accepts and
parses). Without them one connection can grow memory without bound (millions of small headers), keep the
parser busy (a 256 MiB header), or sit silent forever; enough silent ones exhaust the file descriptors.

* request line + headers over ``max_header_bytes``, or over ``max_header_count`` lines: 431, counted on the raw
  bytes *before* httptools parses them;
* the head must arrive within ``header_timeout_s`` of the connection (or of the first byte of a later request),
  the body within ``body_timeout_s`` of the head: 408 otherwise (or a plain close once a response has started);
  a streamed upload (``POST /v1/files``, up to its own size limit, stored as it arrives) instead must keep
  arriving: at most ``body_timeout_s`` between two of its reads (as nginx's ``client_body_timeout``), however long
  it takes in all, so a large file over a slow but steady link is not cut off while a stalled one is, as before
  (time the server itself is not reading, its buffer full, does not count);
* over ``max_connections`` open connections: 503 at once, before anything is read;
* protocol errors answer JSON, like the rest of the API.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from basal.core.request.limits import DEFAULT_LIMITS, Limits

HEAD_END = b"\r\n\r\n"
STREAMED = frozenset({(b"POST", b"/v1/files")})  # bodies the app stores as they arrive: an idle limit, not a total


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    limits: Limits = DEFAULT_LIMITS  # set per server by `guarded_protocol`

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._timer: asyncio.TimerHandle | None = None
        self._reading_head = True
        self._streamed = False  # the body being read is a streamed upload's
        self._head_bytes = self._head_lines = 0
        self._tail = b""
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, "Too many open connections. Retry after a short delay.", retry=True)
            return
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._reading_head and not self._count_head(data):
            return
        super().data_received(data)

    # the head: counted on raw bytes, before the parser sees them

    def _count_head(self, data: bytes) -> bool:
        """Add the head bytes of `data`; False (and a 431 sent) once the head is over a limit."""
        seen = self._tail + data
        end = seen.find(HEAD_END)
        head = data if end < 0 else data[: max(0, end + len(HEAD_END) - len(self._tail))]
        self._tail = seen[-3:]
        self._head_bytes += len(head)
        self._head_lines += head.count(b"\n")
        limits = self.limits
        if self._head_bytes > limits.max_header_bytes or self._head_lines > limits.max_header_count + 1:
            self._refuse(
                431,
                f"Request header fields too large: at most {limits.max_header_count} headers and "
                f"{limits.max_header_bytes} bytes.",
            )
            return False
        return True

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._timer is None:  # a later request on a kept-alive connection: its head has the same deadline
            self._arm(self.limits.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._streamed = (self.parser.get_method(), self.url.partition(b"?")[0]) in STREAMED
        self._arm(self.limits.body_timeout_s)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if self._streamed and body and cycle is not None and not cycle.response_started:
            self._arm(self.limits.body_timeout_s)  # an upload's bytes arrived: its idle time starts again
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self._reading_head = True
        self._streamed = False
        self._head_bytes = self._head_lines = 0
        self._tail = b""
        super().on_message_complete()

    # timeouts

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not self._reading_head and cycle.response_started:
            self.transport.close()  # answered already (e.g. 529 before the body); the body never came
            return
        if self._streamed and not self._reading_head and self.flow.read_paused:
            self._arm(self.limits.body_timeout_s)  # the app has not taken the bytes it has: the wait is the server's
            return
        if cycle is not None and not self._reading_head:
            cycle.disconnected = True  # the handler waiting for the body sees a hang-up
            cycle.message_event.set()
        what = "headers" if self._reading_head else "body"
        self._refuse(408, f"Request {what} not received in time.")

    # answers written by the protocol itself

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, msg)

    def _refuse(self, status: int, message: str, retry: bool = False) -> None:
        """Answer with a JSON error and close, without involving the app."""
        self._disarm()
        body = json.dumps({"detail": message}).encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body)]
        if retry:
            head += [b"retry-after: 1\r\n", b"retry-after-ms: 1000\r\n"]
        head += [b"connection: close\r\n\r\n", body]
        if not self.transport.is_closing():
            self.transport.write(b"".join(head))
            self.transport.close()


def guarded_protocol(limits: Limits) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for one server's limits (uvicorn takes a class as `http`)."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})
