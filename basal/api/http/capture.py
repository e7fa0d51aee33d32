"""Request capture: a sample of the valid decision requests appended to a JSONL file in the Batch API's input
format, so a capture can be labelled, replayed (`basal replay`), calibrated on, or submitted as a batch.

Only what the client sent in the body is written — never a header, so never an API key. With `hash_state` the
state is replaced by its SHA-256 (`"sha256:…"`): the file then says which requests repeated a state without
holding the text (such lines cannot be replayed). The file rotates by size: past `max_bytes` it becomes
`FILE.1` (`FILE.1` becomes `FILE.2`, …), and only `keep` rotated files are kept.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from basal.batch.lines import ENDPOINT

log = logging.getLogger(__name__)


class Capture:
    def __init__(
        self,
        path: str | Path,
        sample: float = 1.0,
        max_bytes: int = 100 << 20,
        keep: int = 5,
        hash_state: bool = False,
        draw: Callable[[], float] = random.random,
    ):
        self.path = Path(path)
        self.sample, self.max_bytes, self.keep, self.hash_state = sample, max_bytes, keep, hash_state
        self._draw = draw
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._size = self.path.stat().st_size if self.path.exists() else 0
        self.written = self.failed = 0

    def offer(self, body: Any, request_id: str) -> None:
        """A valid request's decoded body: written (as one batch input line) if it is drawn."""
        if not isinstance(body, dict) or self._draw() >= self.sample:
            return
        if self.hash_state and "state" in body:
            state = body["state"] if isinstance(body["state"], str) else msgspec.json.encode(body["state"]).decode()
            body = {**body, "state": "sha256:" + hashlib.sha256(state.encode("utf-8", "surrogatepass")).hexdigest()}
        line = msgspec.json.encode({"custom_id": request_id, "method": "POST", "url": ENDPOINT, "body": body}) + b"\n"
        try:
            with self._lock:
                if self._size and self._size + len(line) > self.max_bytes:
                    self._rotate()
                with open(self.path, "ab") as f:
                    f.write(line)
                self._size += len(line)
                self.written += 1
        except OSError as e:  # a full disk loses capture lines, never a request
            self.failed += 1
            if self.failed == 1 or self.failed % 1000 == 0:
                log.warning("request capture to %s failed (%d lines lost so far): %s", self.path, self.failed, e)

    def _rotate(self) -> None:
        for i in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.keep > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()
        stale = self.path.with_name(f"{self.path.name}.{self.keep + 1}")
        if stale.exists():
            stale.unlink()
        self._size = 0
