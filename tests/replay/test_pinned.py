"""The pinned-set check: run twice on the same model it reports every answer identical; after the calibration file
is swapped (and reloaded, as SIGHUP does) it reports the answers that changed, counted independently here."""

from __future__ import annotations

import asyncio
import json

import pytest

from basal.api.decide import body_decider
from basal.api.settings import ApiSettings
from basal.core.model.synth import synth_model
from basal.replay.pinned import PinnedSet, read_set
from basal.serve.config import ModelConfig
from basal.serve.reload import reload_calibrations
from basal.serve.server import model_directory
from tests.servers import make_engines

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Does this convey urgency?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Pay", "technical": "Bugs"}},
}


def _write_set(path, n: int = 4) -> None:
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/basal",
            "body": {"state": f"Ticket {i}: the payouts failed {i} times.", "questions": QUESTIONS},
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _gauges(metrics, name: str) -> tuple[float | None, float | None, float | None]:
    get = metrics.registry.get_sample_value
    labels = {"set": name}
    return (
        get("basal_drift_set_identical", labels),
        get("basal_drift_set_changed", labels),
        get("basal_drift_set_runs_total", labels),
    )


def test_the_check_is_identical_until_the_calibration_changes(tmp_path):
    model_path = synth_model(tmp_path / "model", "demo", seed=0)
    doc = json.loads((model_path / "CALIBRATION.json").read_text())
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(doc))
    config = ModelConfig(path=str(model_path), calibration=str(mine))
    model = model_directory(config)
    engines = make_engines(model)
    engines.start()
    pinned_file = tmp_path / "pinned.jsonl"
    _write_set(pinned_file)
    decide = body_decider(engines, ApiSettings())
    pinned = PinnedSet(pinned_file, decide, engines.metrics)
    try:
        assert asyncio.run(pinned.check()) == 0  # the first run is the reference
        assert _gauges(engines.metrics, "pinned.jsonl") == (1.0, 0.0, 1.0)
        assert asyncio.run(pinned.check()) == 0
        assert _gauges(engines.metrics, "pinned.jsonl") == (1.0, 0.0, 2.0)
        reference = dict(pinned.reference)

        # the noul temperature changes: every answer's noul (each line asks one) changes its bytes
        doc["temperature_per_prim"] = dict(doc["temperature_per_prim"], noul=doc["temperature_per_prim"]["noul"] * 2)
        mine.write_text(json.dumps(doc))
        assert reload_calibrations(engines, {model.name: config}) == {model.name: "changed"}
        answers = {}
        for custom_id, body in read_set(pinned_file):  # independently: each line decided again, one by one
            status, out, _ = asyncio.run(decide(body, lambda: False))
            answers[custom_id] = (status, out)
        expected = sum(answers[k] != v for k, v in reference.items())
        assert expected == len(reference)  # every line changed
        assert asyncio.run(pinned.check()) == expected
        assert _gauges(engines.metrics, "pinned.jsonl") == (0.0, float(expected), 3.0)
        assert pinned.reference == reference  # the first run stays the reference
    finally:
        engines.close()


def test_a_bad_set_file_is_refused_with_its_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/basal", "body": {}}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        read_set(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        read_set(empty)
    with pytest.raises(ValueError, match=r"missing\.jsonl"):
        read_set(tmp_path / "missing.jsonl")


def test_a_server_with_drift_set_runs_it_at_start_and_refuses_a_bad_file(tmp_path):
    import time

    from litestar.testing import TestClient

    from basal.api.app import create_app
    from basal.serve.config import ConfigError, parse_config
    from basal.serve.server import api_settings, build_engines, pinned_set

    pinned_file = tmp_path / "pinned.jsonl"
    _write_set(pinned_file, 2)
    config = parse_config({"metrics": True, "drift_set": str(pinned_file), "drift_interval_s": 3600})
    engines = build_engines(config)
    settings = api_settings(config)
    starts, stops = pinned_set(engines, config, settings)
    with TestClient(create_app(engines, settings, on_startup=starts, on_shutdown=stops)) as client:
        for _ in range(200):
            if 'basal_drift_set_identical{set="pinned.jsonl"} 1.0' in client.get("/metrics").text:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the pinned set did not run at start")
    missing = parse_config({"drift_set": str(tmp_path / "missing.jsonl")})
    with pytest.raises(ConfigError, match="drift_set"):
        pinned_set(engines, missing, settings)
