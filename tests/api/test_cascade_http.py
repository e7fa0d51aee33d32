"""Cascades over HTTP: who answered in both dialects' headers and the native answers, `/v1/models`, the metrics,
a later step's failure, the Batch API's lines, and the configuration (file, flag, environment)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from litestar.testing import TestClient

from basal.api.app import create_app
from basal.api.decide import body_decider
from basal.api.settings import ApiSettings
from basal.core.engine.cascade import Cascade, CascadeFront, Rule, Step
from basal.core.errors import Overloaded
from basal.serve.config import ConfigError, parse_config
from basal.serve.server import with_cascades
from tests.cascade_models import QUESTIONS, STATE, two_engines

NOUL_ON = Cascade("casc", (Step("small", Rule("confidence", None, {"noul": 1.0})), Step("large", None)))


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    front = two_engines(tmp_path_factory.mktemp("models"))
    yield front
    front.close()


@pytest.fixture(scope="module")
def client(engines):
    app = create_app(CascadeFront(engines, [NOUL_ON]), ApiSettings(metrics=True))
    with TestClient(app) as c:
        yield c


def _body(model: str) -> dict:
    return {"model": model, "state": STATE, "questions": QUESTIONS}


@pytest.mark.parametrize("endpoint", ["/v1/systemone", "/v1/basal"])
def test_both_dialects_say_who_answered(client, endpoint):
    r = client.post(endpoint, json=_body("casc"))
    assert r.status_code == 200, r.text
    assert r.headers["x-basal-answered-by"] == "small=3, large=2"  # the yes/no questions urgent and angry went on
    assert "x-basal-escalation-failed" not in r.headers
    answers = r.json()["answers"]
    if endpoint == "/v1/basal":
        assert {k: a["answered_by"] for k, a in answers.items()} == {
            "urgent": "large",
            "team": "small",
            "angry": "large",
            "severity": "small",
            "topics": "small",
        }
        steps = r.json()["usage"]["steps"]
        assert [(s["model"], s["questions"], s["answered"]) for s in steps] == [("small", 5, 3), ("large", 2, 2)]
        assert r.json()["usage"]["input_tokens"] == sum(s["input_tokens"] for s in steps)
    else:  # the TypeSafe answer shape is fixed
        assert all("answered_by" not in a for a in answers.values())
    plain = client.post(endpoint, json=_body("small"))
    assert "x-basal-answered-by" not in plain.headers and "steps" not in plain.json()["usage"]


def test_models_lists_the_cascade_with_its_steps_and_rules(client):
    models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    assert list(models) == ["small", "large", "casc"]
    assert models["casc"]["cascade"] == {
        "steps": [{"model": "small", "escalate_below": {"noul": 1.0}}, {"model": "large"}]
    }
    assert "cascade" not in models["small"]


def test_metrics_count_escalations_per_step_and_type(client):
    before = _escalations(client)
    client.post("/v1/basal", json=_body("casc"))
    after = _escalations(client)
    assert after["noul"] - before.get("noul", 0) == 2 and after.get("multi", 0) == before.get("multi", 0)


def _escalations(client) -> dict[str, float]:
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("basal_cascade_escalations_total{"):
            labels, value = line.rsplit(" ", 1)
            qtype = labels.split('type="')[1].split('"')[0]
            out[qtype] = float(value)
    return out


def test_a_failed_later_step_keeps_the_first_answers_and_says_so(engines):
    class Inner:  # the wrapped front, with the large model overloaded
        def __getattr__(self, name):
            return getattr(engines, name)

        def close(self, *args, **kwargs) -> None:  # this app's shutdown leaves the module's engines running
            pass

        async def run(self, request, cancelled=lambda: False, *, has_slot=False, background=False):
            if request.model == "large":
                raise Overloaded()
            return await engines.run(request, cancelled, has_slot=has_slot, background=background)

    with TestClient(create_app(CascadeFront(Inner(), [NOUL_ON]), ApiSettings())) as c:
        r = c.post("/v1/basal", json=_body("casc"))
        small = c.post("/v1/basal", json=_body("small")).json()["answers"]
    assert r.status_code == 200
    assert r.headers["x-basal-escalation-failed"] == "large: 529 overloaded"
    assert r.headers["x-basal-answered-by"] == "small=5"
    for name, answer in r.json()["answers"].items():
        assert answer.pop("answered_by") == "small"
        assert answer == small[name]


def test_batch_lines_are_answered_by_the_cascade(engines):
    front = CascadeFront(engines, [NOUL_ON])
    decide = body_decider(front, ApiSettings())
    status, body, _ = asyncio.run(decide(msgspec.json.encode(_body("casc")), lambda: False))
    assert status == 200
    assert msgspec.json.decode(body)["answers"]["urgent"]["answered_by"] == "large"


CASCADE_YAML = {
    "cascades": [{"name": "casc", "steps": [{"model": "small", "escalate_below": 0.9}, {"model": "large"}]}]
}


def test_the_configuration_reads_cascades_and_refuses_bad_ones():
    config = parse_config(CASCADE_YAML)
    assert config.cascades[0].steps[0].escalate_below == 0.9
    bad = {
        "needs `escalate_below` or": [{"model": "small"}, {"model": "large"}],
        "not both": [{"model": "small", "escalate_below": 0.9, "escalate_above_error": 0.05}, {"model": "large"}],
        "above 0 and at most 1": [{"model": "small", "escalate_below": 1.5}, {"model": "large"}],
        "unknown question type 'yesno'": [{"model": "small", "escalate_below": {"yesno": 0.9}}, {"model": "large"}],
        "the last answers": [{"model": "small", "escalate_below": 0.9}, {"model": "large", "escalate_below": 0.5}],
    }
    for message, steps in bad.items():
        with pytest.raises(ConfigError, match=message):
            parse_config({"cascades": [{"name": "casc", "steps": steps}]})


def test_the_environment_and_the_flag_give_the_same_cascade(monkeypatch):
    from basal.cli import build_parser
    from basal.serve.flags import serve_config

    env = {
        "BASAL_CASCADES__0__NAME": "casc",
        "BASAL_CASCADES__0__STEPS__0__MODEL": "small",
        "BASAL_CASCADES__0__STEPS__0__ESCALATE_BELOW": "0.9",
        "BASAL_CASCADES__0__STEPS__1__MODEL": "large",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    from_env = parse_config({})
    for k in env:
        monkeypatch.delenv(k)
    from_flag = serve_config(build_parser().parse_args(["serve", "--cascade", "casc=small:below=0.9,large"]))
    assert from_env.cascades == from_flag.cascades == parse_config(CASCADE_YAML).cascades
    with pytest.raises(ConfigError, match="MODEL:below=P"):
        serve_config(build_parser().parse_args(["serve", "--cascade", "casc=small:under=0.9,large"]))


def test_a_target_without_a_certified_threshold_is_refused_at_start(engines):
    ok = parse_config(
        {"cascades": [{"name": "c", "steps": [{"model": "small", "escalate_above_error": 0.05}, {"model": "large"}]}]}
    )
    assert with_cascades(engines, ok).names[-1] == "c"  # the synthetic calibration certifies 0.01 and 0.05
    config = parse_config(
        {"cascades": [{"name": "c", "steps": [{"model": "small", "escalate_above_error": 0.02}, {"model": "large"}]}]}
    )
    with pytest.raises(ConfigError, match=r"no certified threshold for max_error 0\.02"):
        with_cascades(engines, config)
    unknown = parse_config(
        {"cascades": [{"name": "c", "steps": [{"model": "tiny", "escalate_below": 0.5}, {"model": "large"}]}]}
    )
    with pytest.raises(ConfigError, match="no served model 'tiny'"):
        with_cascades(engines, unknown)


def test_basal_decide_with_a_config_answers_through_the_cascade(tmp_path, capsys):
    import json

    from basal.cli import main
    from tests.cascade_models import write_models

    dirs = write_models(tmp_path)
    config = {
        "models": [{"path": str(dirs["small"])}, {"path": str(dirs["large"])}],
        "cascades": [
            {"name": "casc", "steps": [{"model": "small", "escalate_below": {"noul": 1.0}}, {"model": "large"}]}
        ],
    }
    (tmp_path / "serve.yaml").write_text(json.dumps(config))  # JSON is YAML
    (tmp_path / "request.json").write_text(json.dumps(_body("casc")))
    assert main(["decide", "--config", str(tmp_path / "serve.yaml"), str(tmp_path / "request.json")]) == 0
    out, err = capsys.readouterr()
    answers = json.loads(out.splitlines()[-1])["answers"]
    assert answers["urgent"]["answered_by"] == "large" and answers["team"]["answered_by"] == "small"
    assert "answered by: small=3, large=2" in err


def test_the_probes_answer_through_a_wrapping_front(client, engines):
    """/health/ready reads every member of the front (its `startup` steps too): through a cascade and a shadow."""
    from basal.core.engine.shadow import Shadow, ShadowFront

    ready = client.get("/health/ready")
    assert ready.status_code == 200 and ready.json()["startup"] == engines.startup
    shadowed = ShadowFront(engines, [Shadow("small", "large", sample=0.0)])
    with TestClient(create_app(CascadeFront(shadowed, [NOUL_ON]), ApiSettings())) as c:
        assert c.get("/health/ready").status_code == 200
        assert c.get("/health").json()["models"] == ["small", "large", "casc"]
