"""The pinned-set check: run twice on the same model it reports every answer identical; after the calibration file
is swapped (and reloaded, as SIGHUP does) it reports the answers that changed, counted independently here. Its
reference is kept in a file: a server started again on the same weights reports identical, on a changed weight file
the answers that changed; a deleted reference accepts the change, a corrupt one is replaced, an unwritable
directory keeps it in memory."""

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
    config = parse_config(
        {"metrics": True, "drift_set": str(pinned_file), "drift_interval_s": 3600, "drift_reference_dir": str(tmp_path)}
    )
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


def _serve_once(config) -> tuple[float | None, float | None, float | None]:
    """Start a server with `config` (its pinned set runs at start), wait for the first run, stop it: its gauges."""
    import time

    from litestar.testing import TestClient

    from basal.api.app import create_app
    from basal.serve.server import api_settings, build_engines, pinned_set

    engines = build_engines(config)
    try:
        settings = api_settings(config)
        starts, stops = pinned_set(engines, config, settings)
        with TestClient(create_app(engines, settings, on_startup=starts, on_shutdown=stops)):
            for _ in range(400):
                if _gauges(engines.metrics, "pinned.jsonl")[2]:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("the pinned set did not run at start")
        return _gauges(engines.metrics, "pinned.jsonl")
    finally:
        engines.close()


def _independent_answers(model_path, pinned_file) -> dict:
    """Each line of the set decided one by one by a fresh engine on `model_path`, `usage` dropped."""
    from basal.replay.pinned import answer_bytes

    engines = make_engines(model_directory(ModelConfig(path=str(model_path))))
    engines.start()
    try:
        decide = body_decider(engines, ApiSettings())
        out = {}
        for custom_id, body in read_set(pinned_file):
            status, answer, _ = asyncio.run(decide(body, lambda: False))
            out[custom_id] = (status, answer_bytes(answer))
        return out
    finally:
        engines.close()


def _perturb_one_weight(model_path) -> None:
    """One element of the final norm's weight doubled, in place in model.safetensors (its metadata kept)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    weights = model_path / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(weights))
    norm = tensors["model.norm.weight"].clone()
    norm[0] = norm[0] * 2
    tensors["model.norm.weight"] = norm
    save_file(tensors, str(weights), metadata=metadata)


def test_the_reference_outlives_a_restart_and_catches_a_changed_weight_file(tmp_path, caplog):
    from basal.serve.config import parse_config

    model_path = synth_model(tmp_path / "model", "demo", seed=0)
    pinned_file = tmp_path / "pinned.jsonl"
    _write_set(pinned_file)
    references = tmp_path / "references"
    config = parse_config(
        {
            "metrics": True,
            "models": [{"path": str(model_path)}],
            "drift_set": str(pinned_file),
            "drift_reference_dir": str(references),
        }
    )
    assert _serve_once(config) == (1.0, 0.0, 1.0)  # the first start takes the reference
    (kept,) = references.iterdir()
    assert kept.name.startswith("pinned.") and kept.name.endswith(".reference.json")
    assert _serve_once(config) == (1.0, 0.0, 1.0)  # the same weights after a restart: identical
    assert list(references.iterdir()) == [kept]

    before = _independent_answers(model_path, pinned_file)
    _perturb_one_weight(model_path)
    after = _independent_answers(model_path, pinned_file)
    expected = sum(before[k] != after[k] for k in before)
    assert expected > 0
    with caplog.at_level("WARNING", logger="basal"):
        assert _serve_once(config) == (0.0, float(expected), 1.0)  # the changed weights after a restart
    assert any("differ from its reference" in r.getMessage() for r in caplog.records)
    assert _serve_once(config) == (0.0, float(expected), 1.0)  # still changed: the reference was kept

    kept.unlink()  # accepting the change: the next run is the new reference
    assert _serve_once(config) == (1.0, 0.0, 1.0)
    assert _serve_once(config) == (1.0, 0.0, 1.0)


def _pinned(tmp_path, references):
    model = model_directory(ModelConfig(path=str(synth_model(tmp_path / "model", "demo", seed=0))))
    engines = make_engines(model)
    engines.start()
    pinned_file = tmp_path / "pinned.jsonl"
    _write_set(pinned_file, 2)
    return engines, PinnedSet(pinned_file, body_decider(engines, ApiSettings()), engines.metrics, references)


def test_a_deleted_reference_accepts_the_change_without_a_restart(tmp_path):
    references = tmp_path / "references"
    engines, pinned = _pinned(tmp_path, references)
    try:
        assert asyncio.run(pinned.check()) == 0
        (kept,) = references.iterdir()
        doc = json.loads(kept.read_text())
        doc["answers"]["r0"][1] = doc["answers"]["r0"][1].replace('"model"', '"modelx"')  # one answer unlike now
        kept.write_text(json.dumps(doc))
        assert asyncio.run(pinned.check()) == 1  # read from the file on every run
        kept.unlink()
        assert asyncio.run(pinned.check()) == 0
        assert kept.exists()  # written again, from this run
    finally:
        engines.close()


@pytest.mark.parametrize(
    "content", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"format": 1, "key": "other", "answers": {}}', b"[" * 100_000]
)
def test_a_corrupt_reference_is_logged_and_replaced(tmp_path, caplog, content):
    references = tmp_path / "references"
    engines, pinned = _pinned(tmp_path, references)
    try:
        assert asyncio.run(pinned.check()) == 0
        (kept,) = references.iterdir()
        good = kept.read_bytes()
        kept.write_bytes(content)
        with caplog.at_level("ERROR", logger="basal"):
            assert asyncio.run(pinned.check()) == 0  # no crash: this run is the new reference
        assert any(str(kept) in r.getMessage() and "new" in r.getMessage() for r in caplog.records), caplog.text
        assert json.loads(kept.read_bytes())["answers"] == json.loads(good)["answers"]
    finally:
        engines.close()


def test_a_reference_that_cannot_be_written_is_kept_in_memory(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the directory would be")
    engines, pinned = _pinned(tmp_path, blocked / "references")
    try:
        with caplog.at_level("ERROR", logger="basal"):
            assert asyncio.run(pinned.check()) == 0
        assert any("cannot be kept" in r.getMessage() for r in caplog.records), caplog.text
        reference = dict(pinned.reference)
        assert asyncio.run(pinned.check()) == 0
        pinned.reference["r1"] = (200, b"{}")  # the memory is what the next run compares with
        assert asyncio.run(pinned.check()) == 1
        assert pinned.reference["r0"] == reference["r0"]
    finally:
        engines.close()


def test_the_key_is_the_set_and_the_models_it_asks_not_the_answers(tmp_path):
    from basal.core.request.model_names import model_resolver
    from basal.replay.pinned import asked_models

    lines = [("a", b'{"model": "m1"}'), ("b", b"{}"), ("c", b'{"model": "gone"}'), ("d", b'{"model": "m1"}')]
    assert asked_models(lines, model_resolver(["m1", "m2"], "m2")) == ["gone (not served)", "m1", "m2"]
    assert asked_models(lines, model_resolver(["m1", "m2"], "m1")) == ["gone (not served)", "m1"]

    async def failing(body, cancelled):  # a model that now fails every line: the same key, every answer changed
        return 500, b'{"error": "broken"}', "rid"

    references = tmp_path / "references"
    engines, pinned = _pinned(tmp_path, references)
    try:
        assert asyncio.run(pinned.check()) == 0
    finally:
        engines.close()
    broken = PinnedSet(tmp_path / "pinned.jsonl", failing, engines.metrics, references)
    assert broken.key == pinned.key
    assert asyncio.run(broken.check()) == len(pinned.lines)
