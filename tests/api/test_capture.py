"""Request capture: valid requests as Batch API input lines (never a header, so never a key), sampled, rotated by
size, states hashed on request; a capture replays."""

from __future__ import annotations

import hashlib
import json
from itertools import cycle

from litestar.testing import TestClient

from basal.api.app import create_app
from basal.api.http.capture import Capture
from basal.api.settings import ApiSettings
from basal.batch.lines import Line, check_upload
from tests.servers import make_engines

BODY = {"state": "Help! My payouts have been failing.", "questions": {"q": {"type": "noul", "instructions": "Urgent?"}}}


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_valid_requests_are_captured_as_batch_lines_without_keys(demo_model, tmp_path):
    capture = Capture(tmp_path / "cap.jsonl")
    settings = ApiSettings(api_keys=("secret-key",), capture=capture)
    with TestClient(create_app(make_engines(demo_model), settings)) as c:
        auth = {"authorization": "Bearer secret-key"}
        ok = c.post("/v1/systemone", json={**BODY, "model": "jev-latest"}, headers=auth)
        c.post("/v1/basal", json={**BODY, "model": "nope"}, headers=auth)  # refused: not captured
        c.post("/v1/basal", json=BODY)  # no key: not captured
        c.post("/v1/basal", json=BODY, headers=auth)
    text = (tmp_path / "cap.jsonl").read_text()
    assert "secret-key" not in text
    lines = _lines(tmp_path / "cap.jsonl")
    assert ok.status_code == 200
    assert [line["body"] for line in lines] == [{**BODY, "model": "jev-latest"}, BODY]
    assert lines[0]["custom_id"] == ok.headers["x-request-id"]
    assert {line["url"] for line in lines} == {"/v1/basal"}
    parsed = check_upload((tmp_path / "cap.jsonl").read_bytes(), 100, 1 << 20)
    assert all(isinstance(p, Line) for p in parsed)  # a batch input as it is


def test_sampling_rotation_and_hashed_states(tmp_path):
    line_bytes = (
        len(json.dumps({"custom_id": "r00", "method": "POST", "url": "/v1/basal", "body": BODY}, separators=(",", ":")))
        + 1
    )
    draws = cycle([0.1, 0.9])  # every other request is drawn at sample 0.5
    capture = Capture(tmp_path / "cap.jsonl", sample=0.5, max_bytes=3 * line_bytes, keep=2, draw=lambda: next(draws))
    for i in range(20):
        capture.offer(BODY, f"r{i:02d}")
    assert capture.written == 10
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["cap.jsonl", "cap.jsonl.1", "cap.jsonl.2"]  # older ones dropped past `keep`
    assert all(p.stat().st_size <= 3 * line_bytes for p in tmp_path.iterdir())
    newest = [line["custom_id"] for line in _lines(tmp_path / "cap.jsonl")]
    assert newest == ["r18"] and [x["custom_id"] for x in _lines(tmp_path / "cap.jsonl.1")] == ["r12", "r14", "r16"]
    assert [x["custom_id"] for x in _lines(tmp_path / "cap.jsonl.2")] == ["r06", "r08", "r10"]

    hashed = Capture(tmp_path / "h.jsonl", hash_state=True)
    hashed.offer(BODY, "x")
    (line,) = _lines(tmp_path / "h.jsonl")
    assert line["body"]["state"] == "sha256:" + hashlib.sha256(BODY["state"].encode()).hexdigest()
    assert BODY["state"] not in (tmp_path / "h.jsonl").read_text()


def test_a_capture_that_cannot_write_loses_lines_not_requests(demo_model, tmp_path):
    capture = Capture(tmp_path / "cap.jsonl")
    capture.path = tmp_path  # a directory: appending to it fails as a full or read-only disk would
    with TestClient(create_app(make_engines(demo_model), ApiSettings(capture=capture))) as c:
        assert c.post("/v1/basal", json=BODY).status_code == 200
    assert capture.failed == 1 and capture.written == 0
