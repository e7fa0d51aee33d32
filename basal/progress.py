"""Progress over long work (loading models, doctor's checks, benchmark suites) on standard error.

On a terminal a tqdm bar that names the step running now; anywhere else (a log file, systemd, CI) one plain line
per step — at most one every `min_interval_s` — so a log says what the process was doing when it went quiet.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


class Progress:
    def __init__(
        self,
        desc: str,
        total: int | None = None,
        *,
        tty: bool | None = None,
        stream: TextIO | None = None,
        emit: Callable[[str], None] | None = None,
        min_interval_s: float = 0.0,
        enabled: bool = True,
    ) -> None:
        self.desc, self.total, self.count = desc, total, 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty() if tty is None else tty
        self.emit = emit or (lambda line: print(line, file=self.stream, flush=True))
        self.min_interval_s, self._last_line = min_interval_s, float("-inf")
        self._bar = None
        if enabled and self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, file=self.stream, leave=False, dynamic_ncols=True)
            self._stop = threading.Event()
            threading.Thread(target=self._tick, name="basal-progress", daemon=True).start()

    def _tick(self) -> None:
        """Redraw once a second, so the elapsed time moves during a long step (a model's weights)."""
        while not self._stop.wait(1.0):
            bar = self._bar
            if bar is not None:
                bar.refresh()

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        """One step: named while it runs (the bar's text, or a line), counted when it ends."""
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=True)
        elif self.enabled and time.monotonic() - self._last_line >= self.min_interval_s:
            self._last_line = time.monotonic()
            where = f"{self.count + 1}/{self.total}" if self.total else f"{self.count + 1}"
            self.emit(f"{self.desc} [{where}] {label}")
        yield
        self.count += 1
        if self._bar is not None:
            self._bar.update(1)

    def write(self, line: str) -> None:
        """A result or warning, shown even when progress is not: above the bar, or as a line of its own."""
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            self.emit(line)

    def close(self) -> None:
        if self._bar is not None:
            self._stop.set()
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
