"""Log lines: a timestamp on every one, the request's id on every line logged while it is served, text or JSON.

The request context lives in context variables set for the task that serves one request (by
`request_context.RequestContext` around every HTTP request, and by a batch line's decision); `asyncio.to_thread`
and the planning pool copy it, so lines logged there carry it too. A formatter reads it, so no call site passes the
id along. `--log-format json` writes one object per line (time, level, logger, message, request_id, and the
request's model, status and durations where the line has them).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any, Literal

import msgspec

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("basal_request_id", default=None)
# what the handler learnt about its request (model, queue_ms, compute_ms), for the access line written after it
REQUEST_FIELDS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("basal_fields", default=None)
FIELDS = ("model", "status", "method", "path", "client", "duration_ms", "queue_ms", "compute_ms")  # `extra=` keys
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

LogFormat = Literal["text", "json"]


_second: tuple[int, str] = (-1, "")  # the last second formatted: lines come many per second


def _utc(record: logging.LogRecord) -> str:
    global _second
    whole = int(record.created)
    last, text = _second  # one read: another thread may replace it, never half of it
    if whole != last:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second = (whole, text)
    return f"{text}.{int(record.msecs):03d}Z"


_encode = msgspec.json.Encoder(enc_hook=str).encode  # str() for what JSON has no type for, as `default=str`


class TextFormatter(logging.Formatter):
    """`2026-12-03T12:40:00.123Z INFO basal: message [req_…]`: UTC with milliseconds, the request id at the end."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _utc(record)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", None) or REQUEST_ID.get()
        return f"{line} [{rid}]" if rid else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line; a traceback goes into `exc_info` as text, so the line stays one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _utc(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or REQUEST_ID.get()
        if rid:
            out["request_id"] = rid
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        try:
            return _encode(out).decode("utf-8")
        except (TypeError, ValueError, OverflowError):  # what msgspec refuses (an int over 64 bits): the slow way
            return json.dumps(out, ensure_ascii=False, default=str)


def formatter(kind: LogFormat) -> logging.Formatter:
    return JsonFormatter() if kind == "json" else TextFormatter()


def configure(kind: LogFormat = "text", level: int = logging.INFO, stream=None) -> None:
    """The process's one handler on the root logger (uvicorn's loggers propagate to it: `log_config=None`)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(kind))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
