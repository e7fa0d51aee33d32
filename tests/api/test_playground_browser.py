"""/playground in a real browser: headless Chromium (tests/browser.py) against a live demo server. It builds a
noul and a choice question, sends them, and the bars and numbers it shows are checked against the server's JSON
answer to the same body; the compare view's deltas; the copied curl, TypeSafe SDK and native SDK snippets, run,
return the same answers; a 4xx shows the server's message; API keys stay in session storage; and every request
the browser made went to the server. No Chromium: these tests fail (tests/browser.py raises), never skip."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from basal.api.settings import ApiSettings
from tests.browser import Browser
from tests.servers import live_server, make_engines

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # websockets' legacy-module notice

SNIPPET_S = 60  # a snippet is one request to a loopback server; this only keeps a broken one from hanging


@pytest.fixture(scope="module")
def server(demo_model):
    with live_server(make_engines(demo_model)) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory, server):
    b = Browser(tmp_path_factory.mktemp("chromium") / "profile")
    try:
        b.goto(f"{server}/")  # the root sends a browser to the playground
        b.wait_for("document.querySelectorAll('#model option').length > 0")
        yield b
    finally:
        b.close()


def test_a_synthetic_model_is_named_as_such(browser):
    """The demo model's answers mean nothing: the page says so above everything else."""
    assert browser.evaluate("document.querySelector('#synthetic-note').hidden") is False
    assert "synthetic model" in browser.evaluate("document.querySelector('#synthetic-note').textContent")


def runs(browser: Browser) -> int:
    return browser.evaluate("document.querySelectorAll('#runs li').length")


def send(browser: Browser) -> None:
    """Click Send and wait for the new run (or the error box)."""
    before = runs(browser)
    browser.click("#send")
    browser.wait_for(
        f"document.querySelectorAll('#runs li').length > {before} || !document.querySelector('#error').hidden"
    )


def sent_body(browser: Browser, path: str) -> bytes:
    """The body of the last request the page posted to `path`, as the browser recorded it."""
    browser.evaluate("0")
    posted = [
        e["params"]["request"]
        for e in browser.events
        if e.get("method") == "Network.requestWillBeSent" and e["params"]["request"]["url"].endswith(path)
    ]
    return posted[-1]["postData"].encode()


def shown(browser: Browser) -> dict:
    """What the result panel shows: per question its headline, the bars' numbers and widths, the per-order rows."""
    return browser.evaluate(
        """(() => {
        const out = {};
        for (const box of document.querySelectorAll('#result .answer')) {
            const bars = {}, parts = {};
            for (const row of box.querySelectorAll('table.bars:not(.parts-table) tr[data-option]')) {
                const bar = row.querySelector('.bar'), fill = row.querySelector('.bar > span');
                bars[row.dataset.option] = [Number(row.querySelector('td.num').dataset.p),
                                            fill.getBoundingClientRect().width / bar.getBoundingClientRect().width];
            }
            for (const row of box.querySelectorAll('table.parts-table tr[data-option]')) {
                parts[row.dataset.option] = [...row.querySelectorAll('td.num')].map((td) => td.textContent);
            }
            const mass = [...box.querySelectorAll('table.parts-table tr.letter-mass td.num')]
                .map((td) => td.textContent);
            out[box.dataset.question] = {headline: box.querySelector('.headline').textContent, bars, parts, mass};
        }
        return out;
    })()"""
    )


def test_noul_and_choice_bars_match_the_json_answer(browser, server):
    assert browser.evaluate("location.pathname") == "/playground"
    browser.fill("#questions .question:nth-child(1) .q-instructions", "Does this convey urgency?")
    browser.fill("#questions .question:nth-child(2) .q-options", "billing: Payments\ntechnical: Bugs, outages")
    send(browser)
    body = sent_body(browser, "/v1/systemone")
    answer = httpx.post(f"{server}/v1/systemone", content=body, headers={"content-type": "application/json"}).json()
    diagnostics = httpx.post(
        f"{server}/v1/systemone",
        content=body,
        headers={"content-type": "application/json", "x-basal-diagnostics": "1"},
    ).json()["diagnostics"]["questions"]
    page = shown(browser)
    noul, choice = answer["answers"]["q1"], answer["answers"]["q2"]
    assert page["q1"]["headline"] == f"q1: noul {noul['noul']:.4f}"
    assert page["q1"]["bars"]["true"][0] == noul["noul"]
    assert page["q1"]["bars"]["true"][1] == pytest.approx(noul["noul"], abs=0.01)  # the bar's drawn share
    assert page["q2"]["headline"] == f"q2: choice {choice['choice']} · confidence {choice['confidence']:.4f}"
    assert {k: v[0] for k, v in page["q2"]["bars"].items()} == choice["probabilities"]
    assert [v[1] for v in page["q2"]["bars"].values()] == pytest.approx(
        list(choice["probabilities"].values()), abs=0.01
    )
    for name in ("q1", "q2"):  # order 1, order 2, average, calibrated: as the diagnostics say, to 4 places
        readout = diagnostics[name]["readouts"][0]
        for key, cells in page[name]["parts"].items():
            numbers = [o["probabilities"][key] for o in readout["orders"]]
            assert cells == [f"{p:.4f}" for p in [*numbers, readout["average"][key], readout["calibrated"][key]]]
        assert page[name]["mass"] == [f"{o['letter_mass']:.4f}" for o in readout["orders"]]  # per order
    usage = browser.evaluate("document.querySelector('#result dl.kv').textContent")
    assert f"usage.input_tokens{answer['usage']['input_tokens']}" in usage and "x-basal-compute-ms" in usage


def test_compare_view_shows_each_options_change(browser, server):
    send(browser)  # run A: the current phrasing
    browser.fill("#questions .question:nth-child(2) .q-instructions", "Which department owns this ticket?")
    send(browser)  # run B: another phrasing of the choice
    browser.click("#compare")
    browser.wait_for("document.querySelector('#comparison table.deltas[data-pair=\"q2|q2\"]') !== null")
    runs_json = browser.evaluate("JSON.stringify(state.runs.slice(-2).map((r) => r.request))")
    a, b = (
        httpx.post(f"{server}/v1/systemone", json=r).json()["answers"]["q2"]["probabilities"]
        for r in json.loads(runs_json)
    )
    deltas = browser.evaluate(
        """Object.fromEntries(
            [...document.querySelectorAll('#comparison table.deltas[data-pair="q2|q2"] tr[data-option]')]
            .map((tr) => [tr.dataset.option, Number(tr.querySelector('td.delta').dataset.delta)]))"""
    )
    assert deltas == {k: b[k] - a[k] for k in a} and any(deltas.values())
    labels = browser.evaluate("JSON.stringify([...document.querySelectorAll('#runs li')].map((li) => li.textContent))")
    assert json.loads(labels)[-1].endswith("systemone: changed q2.instructions")  # what differs from the run before
    sides = browser.evaluate("document.querySelectorAll('#comparison .side .answer[data-question=q2]').length")
    parts = browser.evaluate("document.querySelectorAll('#comparison .side table.parts-table').length")
    assert sides == 2 and parts >= 2  # both distributions side by side, each with its per-order parts


def _answers(text: str) -> dict:
    """The decision numbers of a printed answer (curl's JSON, the SDKs' JSON dumps)."""
    body = json.loads(text)
    fields = ("noul", "choice", "probabilities")
    return {name: {k: v for k, v in a.items() if k in fields} for name, a in body["answers"].items()}


def test_copied_requests_return_the_same_answer(browser, server):
    send(browser)
    page = json.loads(browser.evaluate("JSON.stringify(state.runs.at(-1).body)"))
    want = _answers(json.dumps(page))
    snippets = {}
    for kind in ("curl", "typesafe", "native"):
        browser.click(f"button[data-copy={kind}]")
        snippets[kind] = browser.wait_for(
            f"(s => s.dataset.kind === '{kind}' && s.textContent)(document.querySelector('#snippet'))"
        )
    curl = subprocess.run(
        ["bash", "-c", snippets["curl"]], capture_output=True, text=True, timeout=SNIPPET_S, check=True
    )
    assert _answers(curl.stdout) == want
    typesafe = subprocess.run(
        [sys.executable, "-c", snippets["typesafe"]], capture_output=True, text=True, timeout=SNIPPET_S
    )
    assert typesafe.returncode == 0, typesafe.stderr
    assert _answers(typesafe.stdout) == want
    native = subprocess.run(
        [sys.executable, "-c", snippets["native"]], capture_output=True, text=True, timeout=SNIPPET_S
    )
    assert native.returncode == 0, native.stderr
    got = _answers(native.stdout)  # the native dialect: the same probabilities (its noul answer carries both options)
    assert got["q2"] == want["q2"] and got["q1"]["noul"] == want["q1"]["noul"]


def test_a_4xx_shows_the_servers_message(browser, server):
    browser.fill("#dialect", "basal")
    browser.fill("#questions .question:nth-child(2) .q-options", "only: a single option")
    send(browser)
    body = sent_body(browser, "/v1/basal")
    r = httpx.post(f"{server}/v1/basal", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "1 options (" in r.json()["error"]  # upstream's wording, kept on the wire
    shown = browser.evaluate("document.querySelector('#error').textContent")
    assert shown == f"422: {r.json()['error'].replace('1 options', '1 option')}" and "1 option (" in shown
    browser.fill("#dialect", "systemone")
    browser.fill("#questions .question:nth-child(2) .q-options", "billing: Payments\ntechnical: Bugs, outages")


def test_a_request_pasted_in_the_native_dialect(browser, server):
    request = {
        "state": {"ticket": "Paczka dotarła uszkodzona", "amount": 129.99},
        "questions": {
            "urgency": {"type": "score", "instructions": "Jak pilne?", "criteria": ["niska", "średnia", "wysoka"]},
            "tags": {"type": "multi", "instructions": "Tematy?", "criteria": ["płatność", "dostawa"]},
        },
    }
    browser.evaluate("document.querySelector('details').open = true")
    browser.fill("#paste", json.dumps(request, ensure_ascii=False))
    browser.click("#load-paste")
    browser.fill("#dialect", "basal")
    send(browser)
    page = json.loads(browser.evaluate("JSON.stringify(state.runs.at(-1).body)"))
    want = httpx.post(f"{server}/v1/basal", json=request).json()["answers"]
    assert {k: a["probabilities"] for k, a in page["answers"].items()} == {
        k: a["probabilities"] for k, a in want.items()
    }
    assert shown(browser)["urgency"]["headline"].startswith(f"urgency: score {want['urgency']['score']:.4f}")
    browser.fill("#dialect", "systemone")


def test_api_key_kept_in_session_storage_only(browser, demo_model):
    with live_server(make_engines(demo_model), ApiSettings(api_keys=("s3cret",))) as url:
        browser.goto(f"{url}/playground")
        for key in ("", "wrong"):  # no key (403), a wrong key (401): the server's message
            browser.fill("#api-key", key)
            r = httpx.get(f"{url}/v1/models", headers={"authorization": f"Bearer {key}"} if key else {})
            want = f"models: {r.status_code}: {r.json()['detail']['message']}"
            browser.wait_for(f"document.querySelector('#model-info').textContent === {json.dumps(want)}")
        browser.fill("#api-key", "s3cret")
        browser.wait_for("document.querySelectorAll('#model option').length > 0")
        send(browser)
        assert browser.evaluate("document.querySelector('#error').hidden")
        assert browser.evaluate("sessionStorage.getItem('basal-playground-api-key')") == "s3cret"
        assert browser.evaluate("localStorage.length") == 0


def test_every_request_went_to_the_server(browser, server):
    """Runs last: every request of every test above, recorded by the browser, went to a test server."""
    urls = browser.requests
    assert any(u.endswith("/v1/systemone") for u in urls) and any(u.endswith("/playground/playground.js") for u in urls)
    others = [u for u in urls if not u.startswith("http://127.0.0.1:")]
    assert others == []
