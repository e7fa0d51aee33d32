"""basal's Prometheus series on `prometheus_client`: one registry per `Metrics` (docs/http-api.md §8).

The series names, labels and meanings are basal-rs's (its `metrics.rs`), so one dashboard serves both engines, and
the duration buckets are its 30 `SECONDS`, so a mixed fleet's histograms aggregate. `prometheus_client` brings the
text format with escaped label values and full-precision numbers, and the process / Python collectors. Each
`Metrics` has its own registry (tests and benchmarks build several in one process); the thin wrappers keep the
call sites short: `inc(*labels, by=)`, `set(*labels, value=)`, `observe(*labels, value=)`. Thread-safe: lanes
record from their threads, HTTP handlers from the loop.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable
from typing import Any

import prometheus_client as prom
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from basal import __version__

# basal-rs's `SECONDS` (30 buckets, 1 ms .. 10 min): the same `le` set on both engines
TIME_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
)  # fmt: skip
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
DP_BUCKETS = (0.0, 1e-6, 1e-4, 1e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # |Δp| of a shadow's answers
CONTENT_TYPE = prom.CONTENT_TYPE_LATEST  # text format 0.0.4
Sample = tuple[tuple[str, ...], float]  # label values, value

prom.disable_created_metrics()  # no `_created` samples: the series are the ones basal-rs exports


class _Series:
    """One metric; its children by label values are cached (`labels()` validates and locks on every call)."""

    kind: type = prom.Counter

    def __init__(self, registry: CollectorRegistry, name: str, help_: str, labels: tuple[str, ...] = (), **options):
        self._m = self.kind(name, help_, labels, registry=registry, **options)
        self._labelled = bool(labels)
        self._children: dict[tuple[str, ...], Any] = {}

    def _child(self, labels: tuple[str, ...]) -> Any:
        if not self._labelled:
            return self._m
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self._m.labels(*labels)
        return child


class Counter(_Series):
    kind = prom.Counter

    def inc(self, *labels: str, by: float = 1.0) -> None:
        self._child(labels).inc(by)


class Gauge(_Series):
    kind = prom.Gauge

    def inc(self, *labels: str, by: float = 1.0) -> None:
        self._child(labels).inc(by)

    def set(self, *labels: str, value: float) -> None:
        self._child(labels).set(value)


class Histogram(_Series):
    kind = prom.Histogram

    def __init__(
        self,
        registry: CollectorRegistry,
        name: str,
        help_: str,
        labels: tuple[str, ...] = (),
        buckets: tuple[float, ...] = TIME_BUCKETS,
    ):
        super().__init__(registry, name, help_, labels, buckets=buckets)

    def observe(self, *labels: str, value: float) -> None:
        self._child(labels).observe(value)


class Metrics:
    """basal's series; one instance per process (the Ray front has its own, and each replica one)."""

    def __init__(self, max_inflight: int = 1024, process: bool = True):
        self.registry = r = CollectorRegistry(auto_describe=True)
        if process:  # process_* (RSS, CPU, open fds) and python_* (GC, version), as every Python exporter has
            prom.ProcessCollector(registry=r)
            prom.PlatformCollector(registry=r)
            prom.GCCollector(registry=r)
        # the series basal-rs exports (names, labels and meanings pinned by tests/api/test_metrics.py)
        self.http_requests = Counter(
            r,
            "basal_http_requests_total",
            "HTTP requests by endpoint, model and status (499: the client hung up)",
            ("endpoint", "model", "status"),
        )
        self.http_duration = Histogram(
            r, "basal_http_request_duration_seconds", "HTTP request wall time", ("endpoint", "model", "status")
        )
        self.http_inflight = Gauge(r, "basal_http_inflight_requests", "HTTP requests being served", ("endpoint",))
        self.model_inflight = Gauge(r, "basal_model_inflight_requests", "requests waiting or running", ("model",))
        self.max_inflight = Gauge(r, "basal_max_inflight_requests", "in-flight limit before HTTP 529")
        self.input_tokens = Counter(r, "basal_input_tokens_total", "tokens of every option-order prompt", ("model",))
        self.output_tokens = Counter(r, "basal_output_tokens_total", "generated tokens (always 0)", ("model",))
        self.questions = Counter(r, "basal_questions_total", "questions answered", ("model",))
        self.queue_duration = Histogram(
            r, "basal_queue_duration_seconds", "arrival to start of its pass", ("model", "lane")
        )
        self.pass_duration = Histogram(
            r, "basal_batch_duration_seconds", "one pass on the device", ("model", "lane", "outcome")
        )
        self.pass_requests = Histogram(r, "basal_batch_requests", "requests per pass", ("model", "lane"), SIZE_BUCKETS)
        # basal's own additions
        self.build_info = Gauge(
            r, "basal_build_info", "always 1: the basal version and the Python it runs on", ("version", "python")
        )
        self.model_info = Gauge(
            r,
            "basal_model_info",
            "always 1 per served model: its backend, device, dtype and revision",
            ("model", "backend", "device", "dtype", "revision"),
        )
        self.model_load = Gauge(
            r, "basal_model_load_seconds", "seconds to load a model (weights, template prefixes, warm-up)", ("model",)
        )
        self.parse_duration = Histogram(
            r,
            "basal_request_parse_duration_seconds",
            "reading, decoding and validating a request body (before the model is involved)",
            ("endpoint",),
        )
        self.tokenization_duration = Histogram(
            r,
            "basal_tokenization_duration_seconds",
            "planning one request: its limits, tokenizing its prompts and costing its packed tokens",
            ("model",),
        )
        self.packed_tokens = Counter(
            r,
            "basal_packed_tokens_total",
            "tokens computed by forward passes (shared prefixes once)",
            ("model", "lane"),
        )
        self.prompt_tokens = Counter(
            r,
            "basal_prompt_tokens_total",
            "tokens of the option-order prompts those passes answered",
            ("model", "lane"),
        )
        self.cascade_escalations = Counter(
            r,
            "basal_cascade_escalations_total",
            "questions a cascade's step sent on to its next model, by the step's model and question type",
            ("cascade", "model", "type"),
        )
        self.cascade_step_failures = Counter(
            r,
            "basal_cascade_step_failures_total",
            "later cascade steps that could not answer (their questions kept the earlier step's answers)",
            ("cascade", "model"),
        )
        self.shadow_decisions = Counter(
            r,
            "basal_shadow_decisions_total",
            "questions a shadow model answered beside its primary, by whether the decisions agree",
            ("model", "shadow", "type", "agree"),
        )
        self.shadow_abs_dp = Histogram(
            r,
            "basal_shadow_abs_dp",
            "|p_primary - p_shadow| of the primary's decision, per question",
            ("model", "shadow", "type"),
            DP_BUCKETS,
        )
        self.shadow_dropped = Counter(
            r,
            "basal_shadow_dropped_total",
            "sampled requests not copied: the shadow's queue was full",
            ("model", "shadow"),
        )
        self.shadow_failed = Counter(
            r, "basal_shadow_failed_total", "copies the shadow model could not answer", ("model", "shadow")
        )
        # drift: the running distribution of online answers per model and question (docs/shadow.md "Drift")
        self.drift_answers = Counter(
            r, "basal_drift_answers_total", "online answers by decision label", ("model", "question", "label")
        )
        self.drift_confidence = Counter(
            r,
            "basal_drift_confidence_total",
            "summed confidence of online answers (divided by basal_drift_answers_total: the mean)",
            ("model", "question"),
        )
        self.drift_below_max_error = Counter(
            r,
            "basal_drift_below_max_error_total",
            "online answers less confident than the model's certified threshold for its smallest max_error target",
            ("model", "question"),
        )
        self.drift_set_identical = Gauge(
            r,
            "basal_drift_set_identical",
            "1: every answer of the pinned set is byte-identical to its reference run",
            ("set",),
        )
        self.drift_set_changed = Gauge(
            r, "basal_drift_set_changed", "answers of the pinned set that differ from its reference run", ("set",)
        )
        self.drift_set_runs = Counter(r, "basal_drift_set_runs_total", "runs of the pinned set", ("set",))
        # the Batch API's store (docs/batches.md "A full or read-only store"); series only where batches are on
        self.batches_store_writable = Gauge(
            r, "basal_batches_store_writable", "1: the batch store writes; 0: it refuses (paused)", ("store",)
        )
        self.batches_store_write_failures = Counter(
            r, "basal_batches_store_write_failures_total", "writes the batch store refused", ("store",)
        )
        self.batches_paused = Gauge(
            r, "basal_batches_paused", "1 while a batch's finished lines wait for the store to write", ("store",)
        )
        self.max_inflight.set(value=max_inflight)
        for endpoint in ("/v1/systemone", "/v1/basal"):
            self.http_inflight.inc(endpoint, by=0)
        self.build_info.set(__version__, platform.python_version(), value=1)

    def model_served(self, model: str, describe: dict[str, object], revision: str) -> None:
        """A served model: its info series, and its per-model series at 0 (as basal-rs creates them), so a rate
        or a dashboard panel has a series before the first request."""
        labels = (str(describe.get(k, "")) for k in ("backend", "device", "dtype"))
        self.model_info.set(model, *labels, revision, value=1)
        for counter in (self.input_tokens, self.output_tokens, self.questions):
            counter.inc(model, by=0)
        self.model_inflight.inc(model, by=0)

    def add_collector(self, collector: Collector) -> None:
        """Series computed at scrape time (device memory, the Ray replicas' engine series)."""
        self.registry.register(collector)

    def render(self) -> str:
        """The text format. Families of one name from several collectors (a Ray front's own process series and
        its replicas') are merged into one, as the format allows each name once."""
        merged: dict[str, Metric] = {}
        for family in self.registry.collect():
            if family.name in merged:
                merged[family.name].samples.extend(family.samples)
            else:
                merged[family.name] = family
        return prom.generate_latest(_Families(list(merged.values()))).decode("utf-8")


class _Families(Collector):
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


class CallbackCollector(Collector):
    """Gauge samples read at scrape time from `read()`: (label values, value) pairs."""

    def __init__(self, name: str, help_: str, labels: tuple[str, ...], read: Callable[[], Iterable[Sample]]):
        self.name, self.help, self.labels, self.read = name, help_, labels, read

    def collect(self):
        family = GaugeMetricFamily(self.name, self.help, labels=self.labels)
        for values, value in self.read():
            family.add_metric(list(values), value)
        yield family

    def describe(self):
        yield GaugeMetricFamily(self.name, self.help, labels=self.labels)


class CacheCollector(Collector):
    """A cache's counters and sizes read at scrape time: `basal_<name>_<counter>` (counters; prometheus_client adds
    `_total`) and `basal_<name>_<size>` (gauges), one sample per label values `read()` gives with its {series:
    value} map."""

    def __init__(
        self,
        name: str,
        labels: tuple[str, ...],
        counters: dict[str, str],
        sizes: dict[str, str],
        read: Callable[[], Iterable[tuple[tuple[str, ...], dict[str, float]]]],
    ):
        self.name, self.labels, self.counters, self.sizes, self.read = name, labels, counters, sizes, read

    def _families(self) -> dict[str, Metric]:
        out: dict[str, Metric] = {}
        for key, help_ in self.counters.items():
            out[key] = CounterMetricFamily(f"basal_{self.name}_{key.removesuffix('_total')}", help_, labels=self.labels)
        for key, help_ in self.sizes.items():
            out[key] = GaugeMetricFamily(f"basal_{self.name}_{key}", help_, labels=self.labels)
        return out

    def collect(self):
        families = self._families()
        for values, numbers in self.read():
            for key, family in families.items():
                family.add_metric(list(values), float(numbers.get(key, 0)))
        yield from families.values()

    def describe(self):
        yield from self._families().values()
