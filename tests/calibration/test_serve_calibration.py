"""End to end on a synthetic demo model: calibrate through the CLI, serve the custom file, /v1/models announces it,
answers follow its temperatures (recomputed here from the per-order distributions), `max_error` reads its
thresholds, and a changed file is served after a reload without dropping requests."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from basal.cli import main
from basal.core.model.model_dir import CUSTOM_CALIBRATION, ModelDir
from basal.core.model.synth import synth_model
from basal.serve.config import ModelConfig
from basal.serve.reload import reload_calibrations
from basal.serve.server import model_directory
from tests.calibration.labelled_data import write_labelled
from tests.servers import live_server, make_engines

T_STAR = 0.3  # the labels are drawn from the model's own order average calibrated at this temperature
TARGETS = "0.4,0.5,0.6,0.7"


def _relabel(labelled: Path, records: Path, seed: int) -> None:
    """Gold answers drawn from each question's p_avg (read from the first run's records) sharpened to T_STAR."""
    rng = np.random.default_rng(seed)
    answers = {}
    for raw in records.read_text().splitlines():
        rec = json.loads(raw)
        answers[rec["custom_id"]] = rec["response"]["body"]["diagnostics"]["questions"]
    from basal.calibration.labelled import read_labelled

    keyed = {line.number: line.key for line in read_labelled(labelled, "systemone", "basal-synthetic-demo").lines}
    out = []
    for number, raw in enumerate(labelled.read_text().splitlines(), 1):
        line = json.loads(raw)
        for name, q in line["questions"].items():
            avg = answers[keyed[number]][name]["readouts"][0]["average"]
            keys, p = list(avg), np.array(list(avg.values())) ** (1 / T_STAR)
            gold = keys[int(rng.choice(len(keys), p=p / p.sum()))]
            q["gold"] = {"true": True, "false": False}.get(gold, int(gold) if q["type"] == "score" else gold)
        out.append(json.dumps(line))
    labelled.write_text("\n".join(out) + "\n")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("calib")
    model = synth_model(root / "model", "demo", seed=0)
    labelled = write_labelled(root / "labelled.jsonl", 80, 16)
    records = root / "records.jsonl"
    first = root / "first.json"
    assert (
        main(
            ["calibrate", str(labelled), "--model", str(model), "-o", str(first), "--records", str(records), "--quiet"]
        )
        == 0
    )
    _relabel(labelled, records, seed=1)
    before = records.read_bytes()
    out = model / CUSTOM_CALIBRATION
    args = ["calibrate", str(labelled), "--model", str(model), "-o", str(out), "--records", str(records)]
    assert main([*args, "--targets", TARGETS, "--quiet"]) == 0
    assert records.read_bytes() == before  # the second run resumed: every request was answered already
    return model, json.loads(out.read_text())


def test_the_file_has_the_schema_and_provenance(calibrated) -> None:
    model, doc = calibrated
    assert set(doc) == {"temperature_per_prim", "thresholds", "provenance"}
    prov = doc["provenance"]
    assert prov["model"]["name"] == "basal-synthetic-demo" and prov["data"]["lines"] == 80
    assert prov["data"]["sha256"] == hashlib.sha256((model.parent / "labelled.jsonl").read_bytes()).hexdigest()
    assert prov["data"]["questions"] == {"choice": 160, "noul": 160, "score": 80}
    shipped = json.loads((model / "CALIBRATION.json").read_text())
    assert prov["model"]["calibration_sha256"] == hashlib.sha256((model / "CALIBRATION.json").read_bytes()).hexdigest()
    # the demo model's yes/no order average is exactly 1/2 (its letters carry no meaning): no fit can help
    assert prov["temperatures"]["noul"]["kept"] == "shipped"
    assert doc["temperature_per_prim"]["noul"] == shipped["temperature_per_prim"]["noul"]
    for t, info in prov["temperatures"].items():  # a fit is served exactly where cross-validation says it helps
        improves = info["cv_log_loss"]["fitted"] < info["cv_log_loss"]["shipped"]
        assert info["kept"] == ("fitted" if improves else "shipped")
        assert doc["temperature_per_prim"][t] == (info["fitted"] if improves else info["shipped"])
    assert "fitted" in {info["kept"] for info in prov["temperatures"].values()}  # something moved
    assert doc["thresholds"], prov["thresholds"]["left_out"]
    for key, entry in doc["thresholds"].items():
        assert entry["error_bound"] <= float(key) and 0 < entry["coverage"] <= 1
    assert set(doc["thresholds"]) | set(prov["thresholds"]["left_out"]) == {"0.01", "0.05", *TARGETS.split(",")}


def test_the_run_computes_no_letter_mass(calibrated) -> None:
    """`basal calibrate` reads the orders' average only: no whole-head product per forward (docs/calibration.md)."""
    model, _doc = calibrated
    orders = [
        o
        for raw in (model.parent / "records.jsonl").read_text().splitlines()
        for q in json.loads(raw)["response"]["body"]["diagnostics"]["questions"].values()
        for r in q["readouts"]
        for o in r.get("orders", [])
    ]
    assert orders and all(o["letter_mass"] is None and o["probabilities"] for o in orders)


def _post(url: str, path: str, body: dict, diagnostics: bool = True) -> dict:
    headers = {"x-basal-diagnostics": "1"} if diagnostics else {}
    r = httpx.post(url + path, json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"a": "Payments", "b": "Bugs", "c": "Sales"}},
    "level": {"type": "score", "instructions": "How urgent?", "criteria": ["none", "low", "high"]},
}


def _expected(diag: dict, temperature: float) -> dict[str, float]:
    """Independently of the server's code path: mean of the orders, then p^(1/T) normalised."""
    orders = diag["readouts"][0]["orders"]
    keys = list(orders[0]["probabilities"])
    avg = np.mean([[o["probabilities"][k] for k in keys] for o in orders], axis=0)
    p = np.maximum(avg, 1e-12) ** (1 / temperature)
    return dict(zip(keys, p / p.sum(), strict=True))


def test_served_announced_and_used(calibrated) -> None:
    model_path, doc = calibrated
    model = model_directory(ModelConfig(path=str(model_path)))
    assert model.calibration.kind == "custom"
    engines = make_engines(model)
    file_bytes = (model_path / CUSTOM_CALIBRATION).read_bytes()
    with live_server(engines) as url:
        info = httpx.get(url + "/v1/models").json()["models"][0]
        assert info["calibration"]["kind"] == "custom" and info["calibration"]["file"] == CUSTOM_CALIBRATION
        assert info["calibration"]["sha256"] == hashlib.sha256(file_bytes).hexdigest()
        assert info["calibration"]["thresholds"] == doc["thresholds"]
        assert info["calibration"]["provenance"] == doc["provenance"]
        assert info["temperature_per_prim"] == doc["temperature_per_prim"]
        assert info["certified_max_error"] == sorted(doc["thresholds"])

        body = {"model": "jev-latest", "state": "Customer 3 writes: my payout failed.", "questions": QUESTIONS}
        got = _post(url, "/v1/systemone", body)
        shipped = ModelDir.load(model_path).calibration
        for name, q in QUESTIONS.items():
            t = doc["temperature_per_prim"][q["type"]]
            assert got["diagnostics"]["questions"][name]["temperature"] == t
            expected = _expected(got["diagnostics"]["questions"][name], t)
            served = got["answers"][name]["probabilities"]
            assert served == pytest.approx(expected, rel=1e-12, abs=1e-15)
            old = _expected(got["diagnostics"]["questions"][name], shipped.temperature(q["type"]))
            if t != shipped.temperature(q["type"]):
                assert served != pytest.approx(old, rel=1e-6)  # the answer moved as the new temperature says

        # max_error: the shipped file certifies 0.01 and 0.05 only; the custom file's keys are what it reads now
        key = sorted(doc["thresholds"])[0]
        threshold = doc["thresholds"][key]["confidence"]
        for state in range(6):
            act = {
                "type": "act",
                "instructions": "Which team?",
                "criteria": QUESTIONS["team"]["criteria"],
                "costs": {"wrong": 10, "defer": 1},
                "max_error": float(key),
            }
            body = {"state": f"Customer {state} writes: my payout failed.", "questions": {"x": act}}
            answer = _post(url, "/v1/basal", body, diagnostics=False)["answers"]["x"]
            assert "max_error" not in answer  # certified: no "no certified threshold" marker
            if answer["confidence"] < threshold:
                assert answer["action"] == "defer" and "refused" in answer
            else:
                assert "refused" not in answer
        for key in ("0.01", "0.05"):
            if key not in doc["thresholds"]:
                act["max_error"] = float(key)
                answer = _post(url, "/v1/basal", body, diagnostics=False)["answers"]["x"]
                assert answer["max_error"] == "no certified threshold for this target"


def test_a_reload_serves_a_changed_file_without_dropping_requests(calibrated, tmp_path) -> None:
    model_path, doc = calibrated
    config = ModelConfig(path=str(model_path), calibration=str(tmp_path / "mine.json"))
    changed = dict(doc, temperature_per_prim=dict(doc["temperature_per_prim"], choice=2.5))
    (tmp_path / "mine.json").write_text(json.dumps(doc))
    model = model_directory(config)
    engines = make_engines(model)
    body = {"model": "jev-latest", "state": "Customer 5 writes: refund please.", "questions": QUESTIONS}
    with live_server(engines) as url:
        first = httpx.get(url + "/v1/models").json()["models"][0]["calibration"]["sha256"]
        assert first == hashlib.sha256((tmp_path / "mine.json").read_bytes()).hexdigest()
        assert reload_calibrations(engines, {model.name: config}) == {model.name: "unchanged"}
        (tmp_path / "mine.json").write_text("{not json")
        assert reload_calibrations(engines, {model.name: config})[model.name].startswith("error")
        assert httpx.get(url + "/v1/models").json()["models"][0]["calibration"]["sha256"] == first  # old one stays

        (tmp_path / "mine.json").write_text(json.dumps(changed))
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(_post, url, "/v1/systemone", body) for _ in range(24)]
            assert reload_calibrations(engines, {model.name: config}) == {model.name: "changed"}
            temps = {f.result()["diagnostics"]["questions"]["team"]["temperature"] for f in futures}  # all 200
        assert temps <= {doc["temperature_per_prim"]["choice"], 2.5}
        info = httpx.get(url + "/v1/models").json()["models"][0]
        assert info["calibration"]["sha256"] == hashlib.sha256((tmp_path / "mine.json").read_bytes()).hexdigest()
        got = _post(url, "/v1/systemone", body)
        team = got["diagnostics"]["questions"]["team"]
        assert team["temperature"] == 2.5
        assert got["answers"]["team"]["probabilities"] == pytest.approx(_expected(team, 2.5), rel=1e-12)


@pytest.mark.slow
def test_sighup_reloads_basal_serve(calibrated, tmp_path) -> None:
    """The signal wiring of `basal serve` (a process of its own): SIGHUP, and /v1/models names the new file."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.ports import free_port

    model_path, doc = calibrated
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(doc))
    port = free_port()
    env = {**os.environ, "BASAL_MODELS__0__CALIBRATION": str(mine), "BASAL_MODELS__0__PATH": str(model_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "basal", "serve", "--addr", f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def sha() -> str | None:
            try:
                r = httpx.get(url + "/v1/models", timeout=5)
            except httpx.HTTPError:
                return None
            return r.json()["models"][0]["calibration"]["sha256"] if r.status_code == 200 else None

        deadline = time.monotonic() + 120
        while sha() is None:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        assert sha() == hashlib.sha256(mine.read_bytes()).hexdigest()
        mine.write_text(json.dumps(dict(doc, temperature_per_prim=dict(doc["temperature_per_prim"], choice=3.0))))
        proc.send_signal(signal.SIGHUP)
        while sha() != hashlib.sha256(mine.read_bytes()).hexdigest():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_a_reload_that_changes_the_calibration_empties_the_answer_cache(calibrated, tmp_path) -> None:
    """Answers computed under the old calibration are never served again once it changed (`on_change`)."""
    from basal.api.settings import ApiSettings
    from basal.core.engine.answer_cache import AnswerCache

    model_path, doc = calibrated
    config = ModelConfig(path=str(model_path), calibration=str(tmp_path / "mine.json"))
    (tmp_path / "mine.json").write_text(json.dumps(doc))
    model = model_directory(config)
    engines = make_engines(model)
    cache = AnswerCache(64, 1 << 20, 600.0)
    body = {"model": "jev-latest", "state": "Customer 7 writes: refund please.", "questions": QUESTIONS}
    with live_server(engines, ApiSettings(answer_cache=cache)) as url:
        first = httpx.post(url + "/v1/systemone", json=body)
        assert httpx.post(url + "/v1/systemone", json=body).headers["x-basal-cache"] == "hit"
        assert reload_calibrations(engines, {model.name: config}, cache.clear) == {model.name: "unchanged"}
        assert len(cache) == 1  # nothing changed: the answer stays
        changed = dict(doc, temperature_per_prim=dict(doc["temperature_per_prim"], choice=2.5))
        (tmp_path / "mine.json").write_text(json.dumps(changed))
        assert reload_calibrations(engines, {model.name: config}, cache.clear) == {model.name: "changed"}
        assert len(cache) == 0 and cache.identities == {}
        again = httpx.post(url + "/v1/systemone", json=body)
        assert again.headers["x-basal-cache"] == "miss"
        assert again.json()["answers"]["team"] != first.json()["answers"]["team"]  # the new temperature's answer
