"""Input lines and result records: what becomes an error record, what refuses a whole upload, and records built
around the answer's exact bytes."""

from __future__ import annotations

import json

import pytest

from basal.batch.lines import BadLine, Line, UploadRefused, check_upload, error_record, parse, response_record


def line(custom_id="a", **over) -> bytes:
    value = {"custom_id": custom_id, "method": "POST", "url": "/v1/basal", "body": {"state": "s", "questions": {}}}
    return json.dumps({**value, **over}).encode()


@pytest.mark.parametrize(
    ("raw", "code", "custom_id"),
    [
        (b"{not json", "invalid_json", "line:7"),
        (b"[1, 2]", "invalid_request", "line:7"),
        (line(custom_id=""), "invalid_custom_id", "line:7"),
        (line(custom_id="x" * 257), "invalid_custom_id", "line:7"),
        (line(url="/v1/systemone"), "invalid_request", "a"),
        (line(method="GET"), "invalid_request", "a"),
        (line(body=[1]), "invalid_request", "a"),
        (line(body={"stream": True}), "invalid_request", "a"),
        (line(extra=1), "invalid_request", "a"),
        (line(body={"state": "x" * 500}), "line_too_large", "a"),  # its custom_id read from the line's start
    ],
)
def test_unreadable_lines_become_error_records(raw, code, custom_id):
    parsed = parse(7, raw, 400)
    assert isinstance(parsed, BadLine) and (parsed.code, parsed.custom_id) == (code, custom_id)


def test_lines_of_one_state_share_a_group():
    a = parse(1, line("a", body={"state": "s", "questions": {"q": {}}}), 1 << 20)
    b = parse(2, line("b", body={"state": "s", "questions": {"r": {}}}), 1 << 20)
    c = parse(3, line("c", body={"state": "t", "questions": {"q": {}}}), 1 << 20)
    assert isinstance(a, Line) and isinstance(b, Line) and isinstance(c, Line)
    assert a.group == b.group != c.group


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (line("a") + b"\n" + line("a") + b"\n", "again on line 2"),
        (b"a,b,c\n1,2,3\n", "no line is a batch request"),
        (b"\n".join(line(str(i)) for i in range(4)), "limit is 3"),
    ],
)
def test_uploads_that_cannot_be_a_batch_are_refused(data, message):
    with pytest.raises(UploadRefused, match=message):
        check_upload(data, 3, 1 << 20)


def test_a_file_with_some_bad_lines_is_accepted():
    parsed = check_upload(line("a") + b"\r\n{oops\n" + line("b"), 10, 1 << 20)  # CRLF, no final LF
    assert [type(p).__name__ for p in parsed] == ["Line", "BadLine", "Line"]


def test_records_hold_the_answer_bytes_and_the_sdk_envelope():
    body = b'{"model":"m","answers":{},"usage":{"latency_ms":1.5}}'
    record = response_record("id \u2713", 200, body, "req_1")
    assert b'"body":' + body + b'},"error":null}' in record
    value = json.loads(record)
    assert value["custom_id"] == "id \u2713" and value["response"]["status_code"] == 200 and value["error"] is None
    assert value["id"].startswith("batch_req_") and value["response"]["request_id"] == "req_1"
    error = json.loads(error_record("line:3", "invalid_json", "no"))
    assert error["response"] is None and error["error"] == {"code": "invalid_json", "message": "no"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"[" * 1000 + b"]" * 1000, "line 3 is nested too deeply to be read"),
        (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "line 3 is nested too deeply to be read"),
        (b'{"custom_id":"a","n":' + b"9" * 5000 + b"}", "line 3 is not JSON: Integer value out of range"),
        (b'{"custom_id":"\xed\xa0\x80"}', "line 3 is not JSON"),  # a surrogate's bytes: not UTF-8
    ],
    ids=["arrays", "objects", "integer", "surrogate"],
)
def test_every_way_the_decoder_fails_is_a_bad_line(raw, message):
    bad = parse(3, raw, 1 << 20)
    assert isinstance(bad, BadLine) and bad.code == "invalid_json" and bad.message.startswith(message)
    assert len(bad.message) < 300


def test_a_byte_order_mark_before_the_first_line_is_skipped():
    parsed = check_upload(b"\xef\xbb\xbf" + line("a") + b"\r\n" + line("b") + b"\n", 10, 1000)
    assert [(type(p), p.custom_id) for p in parsed] == [(Line, "a"), (Line, "b")]
    inside = check_upload(line("a") + b"\n\xef\xbb\xbf" + line("b"), 10, 1000)  # only the file's start
    assert isinstance(inside[1], BadLine) and inside[1].code == "invalid_json"


def test_messages_that_quote_a_line_are_bounded():
    many = json.dumps({"custom_id": "a", **{f"key-{i}": 1 for i in range(5000)}}).encode()
    bad = parse(1, many, 1 << 20)
    assert isinstance(bad, BadLine) and bad.code == "invalid_request" and len(bad.message) < 300
