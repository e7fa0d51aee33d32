"""Input lines and result records: what becomes an error record, what refuses a whole upload, and records built
around the answer's exact bytes."""

from __future__ import annotations

import json
import random

import pytest

from basal.batch.lines import (
    BOM,
    BadLine,
    InputFile,
    Line,
    LineAt,
    UploadCheck,
    UploadRefused,
    check_upload,
    error_record,
    parse,
    response_record,
    split,
)


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


def _whole_file_rules(data: bytes, max_lines: int, max_line_bytes: int) -> list[Line | BadLine]:
    """The rules as the file read whole states them: split, count, parse every line, then look for ids twice."""
    lines = split(data)
    if not lines:
        raise UploadRefused("the file is empty: a batch input has one JSON request per line")
    if len(lines) > max_lines:
        raise UploadRefused(f"the file has {len(lines)} lines; the limit is {max_lines} (split it into batches)")
    parsed = [parse(i, raw, max_line_bytes) for i, raw in enumerate(lines, 1)]
    seen: dict[str, int] = {}
    for p in parsed:
        if p.custom_id in seen:
            raise UploadRefused(
                f"custom_id {p.custom_id!r} is on line {seen[p.custom_id]} and again on line {p.number}: "
                "each line needs its own custom_id"
            )
        seen[p.custom_id] = p.number
    if not any(isinstance(p, Line) for p in parsed):
        raise UploadRefused(f"no line is a batch request; line 1: {parsed[0].message}")
    return parsed


def _outcome(run, *args):
    try:
        return "ok", run(*args)
    except UploadRefused as e:
        return "refused", str(e)


def _fed(check: UploadCheck) -> list[Line | BadLine]:
    check.finish()
    return [parsed for _, parsed in check.kept]


def test_a_file_fed_in_any_pieces_is_read_as_the_whole_file():
    """Pieces from 1 byte up, BOMs, CRLFs, lines cut off, lines over a tiny limit (kept by their start only): the
    same lines, error records and refusals as the whole file split at once, and every line found where it is."""
    rng = random.Random(47)
    samples = [b"", b"{", b"\r", b"[1]", b'{"custom_id":"zz"}', BOM, b"\xff"]
    for _ in range(3000):
        parts = []
        for _ in range(rng.randint(0, 5)):
            cid = rng.choice(["a", "b", "line:2", "line:3", "x" * rng.randint(1, 60)])
            state = "s" * rng.randint(0, 80)
            parts.append(line(cid, body={"state": state}) if rng.random() < 0.5 else rng.choice(samples))
        data = (BOM if rng.random() < 0.3 else b"") + b"".join(p + rng.choice([b"\n", b"\r\n"]) for p in parts)
        data = data[: rng.randint(0, len(data))] if rng.random() < 0.3 else data
        max_lines, max_line_bytes = rng.choice([1, 3, 10]), rng.choice([5, 40, 100, 1000])
        check = UploadCheck(max_lines, max_line_bytes, keep=lambda raw, parsed: (raw, parsed))
        at = 0
        while at < len(data):
            step = rng.choice([rng.randint(1, 7), rng.randint(1, 600)])
            check.feed(data[at : at + step])
            at += step
        expected = _outcome(_whole_file_rules, data, max_lines, max_line_bytes)
        assert _outcome(_fed, check) == expected, (data, max_lines, max_line_bytes)
        for raw, _ in check.kept if expected[0] == "ok" else ():
            assert not raw.complete or data[raw.offset : raw.offset + len(raw.data)] == raw.data


def test_a_line_over_the_limit_is_held_by_its_start_only():
    check = UploadCheck(10, 1000)
    check.feed(b'{"custom_id":"big","x":"' + b"y" * 5000)
    assert check.held <= 1001
    check.feed(b"y" * 1_000_000)
    assert check.held <= 1001
    check.feed(b'"}\n' + line("ok") + b"\n")
    assert check.finish() == 2


def test_an_input_file_is_indexed_and_its_lines_read_again(tmp_path):
    lines = [line("a"), b"{broken", line("b", body={"state": "t", "questions": {}}), line("c")]
    path = tmp_path / "in.jsonl"
    path.write_bytes(BOM + b"\r\n".join(lines))
    whole = check_upload(path.read_bytes(), 1 << 62, 1 << 20)
    source = InputFile(path, 1 << 20)
    path.unlink()  # deleted while its batch runs: the open file still reads
    try:
        assert [type(x) for x in source.lines] == [LineAt, BadLine, LineAt, LineAt]
        assert source.read(source.lines) == whole
        a, _, b, c = source.lines
        assert a.group == c.group != b.group
    finally:
        source.close()
