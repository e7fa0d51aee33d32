"""A small Prometheus registry (text exposition format 0.0.4): counters, gauges, histograms with labels.

Series of docs/http-api.md §8. Thread-safe: lanes record from their threads, HTTP handlers from the loop.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{v}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = ""

    def __init__(self, name: str, help_: str, labels: tuple[str, ...] = ()):
        self.name, self.help, self.labels = name, help_, labels
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.values: dict[tuple[str, ...], float] = defaultdict(float)

    def inc(self, *labels: str, by: float = 1.0) -> None:
        with self._lock:
            self.values[labels] += by

    def render(self) -> list[str]:
        with self._lock:
            return self.header() + [f"{self.name}{_labels(self.labels, k)} {v:g}" for k, v in self.values.items()]


class Gauge(Counter):
    kind = "gauge"

    def set(self, *labels: str, value: float) -> None:
        with self._lock:
            self.values[labels] = value


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_: str, labels: tuple[str, ...] = (), buckets: tuple[float, ...] = TIME_BUCKETS):
        super().__init__(name, help_, labels)
        self.buckets = buckets
        self.counts: dict[tuple[str, ...], list[int]] = {}
        self.sums: dict[tuple[str, ...], float] = defaultdict(float)

    def observe(self, *labels: str, value: float) -> None:
        with self._lock:
            counts = self.counts.setdefault(labels, [0] * (len(self.buckets) + 1))
            counts[bisect.bisect_left(self.buckets, value)] += 1
            self.sums[labels] += value

    def render(self) -> list[str]:
        lines = self.header()
        with self._lock:
            for key, counts in self.counts.items():
                total = 0
                for bound, n in zip((*self.buckets, float("inf")), counts, strict=True):
                    total += n
                    le = 'le="' + ("+Inf" if bound == float("inf") else f"{bound:g}") + '"'
                    lines.append(f"{self.name}_bucket{_labels(self.labels, key, le)} {total}")
                lines.append(f"{self.name}_sum{_labels(self.labels, key)} {self.sums[key]:g}")
                lines.append(f"{self.name}_count{_labels(self.labels, key)} {total}")
        return lines


class Metrics:
    """basal's series; one instance per process."""

    def __init__(self, max_inflight: int = 1024):
        self.http_requests = Counter(
            "basal_http_requests_total", "HTTP requests by endpoint, model and status", ("endpoint", "model", "status")
        )
        self.http_duration = Histogram(
            "basal_http_request_duration_seconds", "HTTP request wall time", ("endpoint", "model", "status")
        )
        self.http_inflight = Gauge("basal_http_inflight_requests", "HTTP requests being served", ("endpoint",))
        self.model_inflight = Gauge("basal_model_inflight_requests", "requests waiting or running", ("model",))
        self.max_inflight = Gauge("basal_max_inflight_requests", "in-flight limit before HTTP 529")
        self.input_tokens = Counter("basal_input_tokens_total", "tokens of every option-order prompt", ("model",))
        self.output_tokens = Counter("basal_output_tokens_total", "generated tokens (always 0)", ("model",))
        self.questions = Counter("basal_questions_total", "questions answered", ("model",))
        self.queue_duration = Histogram(
            "basal_queue_duration_seconds", "arrival to start of its batch", ("model", "lane")
        )
        self.batch_duration = Histogram(
            "basal_batch_duration_seconds", "one batch on the device", ("model", "lane", "outcome")
        )
        self.batch_requests = Histogram("basal_batch_requests", "requests per batch", ("model", "lane"), SIZE_BUCKETS)
        self.packed_tokens = Counter(
            "basal_packed_tokens_total", "tokens computed by forward passes (shared prefixes once)", ("model", "lane")
        )
        self.prompt_tokens = Counter(
            "basal_prompt_tokens_total", "tokens of the option-order prompts those passes answered", ("model", "lane")
        )
        self.max_inflight.set(value=max_inflight)

    def render(self) -> str:
        series = [
            self.http_requests,
            self.http_duration,
            self.http_inflight,
            self.model_inflight,
            self.max_inflight,
            self.input_tokens,
            self.output_tokens,
            self.questions,
            self.queue_duration,
            self.batch_duration,
            self.batch_requests,
            self.packed_tokens,
            self.prompt_tokens,
        ]
        return "\n".join(line for m in series for line in m.render()) + "\n"
