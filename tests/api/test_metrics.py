"""/metrics: the series basal-rs exports (names, kinds, labels pinned), basal's own, the Prometheus text format as
Prometheus's parser reads it, escaped label values, full-precision numbers, basal-rs's buckets, the key, and the
separate listener."""

from __future__ import annotations

import dataclasses
import json

import httpx
import pytest
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from basal.api.app import create_app
from basal.api.settings import ApiSettings
from basal.core.engine.metrics import Metrics
from tests.api.test_http import REQUEST, post
from tests.ports import free_port
from tests.servers import live_server, make_engines

# (kind, labels) of every series basal-rs exports (its metrics.rs): one dashboard serves both engines
PINNED = {
    "basal_http_requests": ("counter", {"endpoint", "model", "status"}),
    "basal_http_request_duration_seconds": ("histogram", {"endpoint", "model", "status"}),
    "basal_http_inflight_requests": ("gauge", {"endpoint"}),
    "basal_model_inflight_requests": ("gauge", {"model"}),
    "basal_max_inflight_requests": ("gauge", set()),
    "basal_input_tokens": ("counter", {"model"}),
    "basal_output_tokens": ("counter", {"model"}),
    "basal_questions": ("counter", {"model"}),
    "basal_queue_duration_seconds": ("histogram", {"model", "lane"}),
    "basal_batch_duration_seconds": ("histogram", {"model", "lane", "outcome"}),
    "basal_batch_requests": ("histogram", {"model", "lane"}),
}
# basal-rs's SECONDS, the `le` bounds of every duration histogram
RUST_SECONDS = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
]  # fmt: skip


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_every_pinned_series_parses_with_its_kind_and_labels(client):
    assert post(client, REQUEST).status_code == 200
    r = client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    found = families(r.text)
    for name, (kind, labels) in PINNED.items():
        assert name in found, name
        assert found[name].type == kind, name
        samples = found[name].samples
        assert samples, f"{name} has no samples after a request"
        assert {k for s in samples for k in s.labels} - {"le"} == labels, name
    assert "# TYPE basal_http_requests_total counter" in r.text  # the name as Prometheus stores it
    requests = {s.labels["status"]: s.value for s in found["basal_http_requests"].samples}
    assert requests["200"] >= 1
    # basal's additions, and what every Python exporter has
    (build,) = found["basal_build_info"].samples
    assert build.value == 1 and build.labels["version"]
    (info,) = found["basal_model_info"].samples
    assert info.labels["backend"] == "torch" and info.labels["device"] == "cpu" and info.labels["dtype"] == "f32"
    for name in (
        "basal_tokenization_duration_seconds",
        "basal_request_parse_duration_seconds",
        "process_resident_memory_bytes",
        "process_open_fds",
        "python_gc_collections",
        "python_info",
    ):
        assert found[name].samples, name


def test_duration_buckets_are_the_rust_engines():
    m = Metrics()
    for h in (m.http_duration, m.queue_duration, m.pass_duration):
        h.observe(*(["x"] * len(h._m._labelnames)), value=0.2)
    found = families(m.render())
    for name in ("basal_http_request_duration_seconds", "basal_queue_duration_seconds", "basal_batch_duration_seconds"):
        bounds = [float(s.labels["le"]) for s in found[name].samples if s.name.endswith("_bucket")]
        assert bounds == [*RUST_SECONDS, float("inf")], name


def test_values_keep_full_precision():
    m = Metrics()
    m.http_duration.observe("/v1/basal", "m", "200", value=0.1234567890123)
    m.input_tokens.inc("m", by=1234567891)
    found = families(m.render())
    (total,) = [s for s in found["basal_http_request_duration_seconds"].samples if s.name.endswith("_sum")]
    assert total.value == 0.1234567890123
    assert found["basal_input_tokens"].samples[0].value == 1234567891  # not 1.23457e+09


def test_a_model_name_with_quotes_and_newlines_is_escaped(demo_model):
    name = 'we"ird\nmodel\\name'
    model = dataclasses.replace(demo_model, name=name)
    with TestClient(create_app(make_engines(model), ApiSettings(metrics=True))) as c:
        assert post(c, {**REQUEST, "model": name}).status_code == 200
        text = c.get("/metrics").text
    assert 'model="we\\"ird\\nmodel\\\\name"' in text  # the text format's escapes: \" \n \\
    assert all(not line.startswith("model") for line in text.splitlines())  # no line was split by the name
    found = families(text)
    assert {s.labels["model"] for s in found["basal_questions"].samples} == {name}
    assert {s.labels["model"] for s in found["basal_model_info"].samples} == {name}


def test_keys_guard_metrics_and_schema_unless_made_public(demo_model):
    engines = make_engines(demo_model)
    with TestClient(create_app(engines, ApiSettings(api_keys=("k",), metrics=True))) as c:
        for path in ("/metrics", "/schema/openapi.json", "/schema"):
            assert c.get(path).status_code == 403, path
            assert c.get(path, headers={"authorization": "Bearer nope"}).status_code == 401, path
            assert c.get(path, headers={"authorization": "Bearer k"}).status_code == 200, path
        assert c.get("/health").status_code == 200  # probes stay open
        schema = c.get("/schema/openapi.json", headers={"authorization": "Bearer k"}).json()
        assert schema["paths"]["/metrics"]["get"]["security"] == [{"bearerAuth": []}]
    public = ApiSettings(api_keys=("k",), metrics=True, public_metrics_and_schema=True)
    with TestClient(create_app(make_engines(demo_model), public)) as c:
        assert c.get("/metrics").status_code == 200 and c.get("/schema/openapi.json").status_code == 200
        assert post(c, REQUEST).status_code == 403  # decisions still need the key


def test_a_separate_metrics_listener(engines):
    from basal.serve.server import metrics_listener

    port = free_port()
    listener = metrics_listener(engines, f"127.0.0.1:{port}")
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/metrics")
    finally:
        listener.shutdown()
        listener.server_close()
    assert r.status_code == 200 and "basal_build_info" in families(r.text)


@pytest.mark.parametrize("bad", ["127.0.0.1", "host:port"])
def test_metrics_addr_must_be_host_port(bad):
    from basal.serve.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="metrics_addr"):
        parse_config({"metrics_addr": bad})


def test_dashboard_and_alerts_use_only_series_a_live_server_exports():
    """deploy/grafana and deploy/prometheus name only series that a running demo server's /metrics has (built as
    `basal serve --metrics` builds it), so neither can drift from the code."""
    from basal.serve.config import parse_config
    from basal.serve.server import api_settings, build_engines
    from tests.deploy.dashboards import dashboard_series

    config = parse_config({"metrics": True})
    with live_server(build_engines(config), api_settings(config)) as url:
        body = json.dumps(REQUEST).encode()
        headers = {"content-type": "application/json"}
        assert httpx.post(f"{url}/v1/systemone", content=body, headers=headers).is_success
        text = httpx.get(f"{url}/metrics").text
    found = list(text_string_to_metric_families(text))
    # a family without samples (device memory on the CPU) is still exported: HELP and TYPE name it
    exported = {s.name for f in found for s in f.samples} | {f.name for f in found}
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}  # ... and their sample names
    exported |= {f.name + end for f in found for end in suffixes.get(f.type, ())}
    used = dashboard_series()
    assert len(used) >= 10, used  # the reader found the expressions
    assert sorted(used - exported) == []


def test_device_memory_of_an_mlx_model_and_none_for_torch_on_the_cpu(demo_model):
    """MLX's allocator figures (active, peak, cache) per MLX model, read at scrape time; torch on the CPU has none
    (the process's resident memory is the number there), though the families are still exported."""
    pytest.importorskip("mlx.core")
    from prometheus_client import generate_latest

    from basal.backends.mlx.backend import MLXBackend
    from basal.core.engine.engine import Engine, EngineSettings
    from basal.core.engine.engines import Engines
    from basal.core.engine.gate import Gate
    from basal.core.engine.pipeline import Pipeline
    from basal.serve.server import device_memory

    def scraped(engines: Engines) -> dict:
        for collector in device_memory(engines):
            engines.metrics.add_collector(collector)
        return families(generate_latest(engines.metrics.registry).decode())

    metrics = Metrics()
    backend = MLXBackend.load(demo_model, device="cpu")
    engine = Engine("tiny-mlx", Pipeline(demo_model, backend), Gate(100.0), metrics, EngineSettings())
    found = scraped(Engines({"tiny-mlx": engine}, "tiny-mlx", metrics, 8))
    value = {}
    for kind in ("", "_peak", "_cache"):
        (sample,) = found[f"basal_device_memory{kind}_bytes"].samples
        assert sample.labels == {"model": "tiny-mlx", "device": "cpu"}
        value[kind] = sample.value
    assert value[""] > 0 and value["_peak"] >= value[""] and value["_cache"] >= 0  # the weights are MLX arrays

    torch_only = scraped(make_engines(demo_model))
    for kind in ("", "_peak", "_cache"):
        assert torch_only[f"basal_device_memory{kind}_bytes"].samples == []
