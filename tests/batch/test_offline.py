"""`basal run-batch`: the server's records without a server, resumable (an interrupted OUTPUT, its last line torn,
is completed with every custom_id once and its earlier records untouched), and answers equal to online."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from basal.api.decide import body_decider
from basal.api.settings import ApiSettings
from basal.batch.offline import recorded_ids, run_file
from basal.cli import main
from tests.servers import make_engines

LATENCY = re.compile(rb'"latency_ms":[0-9.eE+-]+')


def write_input(path, n_states=6, per_state=5, extra=b""):
    lines = [
        json.dumps({"custom_id": f"s{s}-q{q}", "method": "POST", "url": "/v1/basal",
                    "body": {"state": f"Ticket {s}: refund late.",
                             "questions": {f"q{q}": {"type": "noul", "instructions": f"Money {q}?"}}}})
        for s in range(n_states) for q in range(per_state)
    ]  # fmt: skip
    path.write_bytes("\n".join(lines).encode() + b"\n" + extra)


@pytest.fixture(scope="module")
def engines(demo_model):
    engines = make_engines(demo_model)
    engines.start()
    yield engines
    engines.close()


def run(engines, source, output):
    return asyncio.run(run_file(source, output, body_decider(engines, ApiSettings()), 1 << 20))


def test_an_interrupted_run_resumes_without_repeating_or_touching_records(engines, tmp_path):
    source, whole, cut = tmp_path / "in.jsonl", tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    write_input(source, extra=b"{broken\n")
    summary = run(engines, source, whole)
    assert (summary.ran, summary.failed, summary.skipped) == (31, 1, 0)
    records = whole.read_bytes().splitlines(keepends=True)
    cut.write_bytes(b"".join(records[:12]) + records[12][:40])  # killed while writing line 13
    again = run(engines, source, cut)
    assert (again.ran, again.skipped) == (19, 12)
    resumed = cut.read_bytes().splitlines(keepends=True)
    assert resumed[:12] == records[:12]  # untouched
    ids = [json.loads(r)["custom_id"] for r in resumed]
    assert len(ids) == len(set(ids)) == 31
    assert run(engines, source, cut).ran == 0  # nothing left
    by_id = {json.loads(r)["custom_id"]: LATENCY.sub(b"", r.split(b'"body":', 1)[-1]) for r in records}
    for r in resumed:  # the same answers (request ids and timing aside)
        assert LATENCY.sub(b"", r.split(b'"body":', 1)[-1]) == by_id[json.loads(r)["custom_id"]]


def test_an_output_that_is_not_records_is_refused(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"hello\n")
    with pytest.raises(ValueError, match="not a batch record"):
        recorded_ids(out)


def test_the_command(demo_dir, tmp_path, capsys):
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, 2, 2)
    assert main(["run-batch", str(source), "-o", str(output), "--model", str(demo_dir)]) == 0
    assert "4 line(s)" in capsys.readouterr().err
    assert len(recorded_ids(output)) == 4
    assert main(["run-batch", str(tmp_path / "missing.jsonl"), "-o", str(output)]) == 2
    (tmp_path / "bad.jsonl").write_bytes(b"")
    assert main(["run-batch", str(tmp_path / "bad.jsonl"), "-o", str(output)]) == 2
    assert "empty" in capsys.readouterr().err


def test_the_command_loads_no_http_layer(demo_dir, tmp_path):
    """`basal run-batch` decides without the HTTP server: no Litestar, no uvicorn, no route module is imported."""
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, 1, 2)
    code = (
        "import sys\nfrom basal.cli import main\n"
        f"assert main(['run-batch', {str(source)!r}, '-o', {str(output)!r}, '--model', {str(demo_dir)!r}]) == 0\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('litestar', 'uvicorn') "
        "or m.startswith('basal.api.routes') or m == 'basal.api.app')\n"
        "assert not loaded, loaded[:8]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(recorded_ids(output)) == 2


def test_nothing_left_to_do_loads_nothing(tmp_path):
    """A finished OUTPUT: the command answers from the two files, without importing torch or building engines."""
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(source, 1, 2)
    records = [{"id": f"batch_req_{i}", "custom_id": f"s0-q{i}", "response": None, "error": None} for i in range(2)]
    output.write_text("".join(json.dumps(r) + "\n" for r in records))  # what a finished run left
    argv = ["run-batch", str(source), "-o", str(output), "--model", str(tmp_path / "no-model")]
    check = (
        f"import sys; from basal.cli import main; code = main({argv!r}); "
        "assert code == 0, code; assert 'torch' not in sys.modules and 'basal.serve.server' not in sys.modules"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "nothing left to do: all 2 line(s) already in" in run.stderr


def test_the_input_is_read_a_chunk_at_a_time(tmp_path):
    """A 25 MB input (6,000 lines of 4 KB) runs, and resumes, in memory bounded by the lines in flight and an
    index entry per line, not by the file's bytes. Derived bound: the 1 MiB block read while indexing (and its
    lines' slices, as much again), the window's 256 lines and two 128-line chunks read ahead, each line held as
    its raw bytes and its body (512 x 4 KB x 2 = 4 MiB), and ~400 B per line for the index and the duplicate-id
    check (2.4 MB): under 10 MB. Reading the file whole, as before, peaked at ~120 MB here."""
    import tracemalloc

    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    with open(source, "w") as f:
        for i in range(6000):
            body = {
                "state": f"Ticket {i % 50}: " + "x" * 4000,
                "questions": {"q": {"type": "noul", "instructions": "?"}},
            }
            f.write(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/basal", "body": body}) + "\n")
    assert source.stat().st_size > 24e6

    async def decide(body, cancelled):
        return 200, b'{"answers":{}}', "req"

    def peak(output: Path) -> tuple[int, object]:
        tracemalloc.start()
        try:
            summary = asyncio.run(run_file(source, output, decide, 1 << 20))
            return tracemalloc.get_traced_memory()[1], summary
        finally:
            tracemalloc.stop()

    used, summary = peak(output)
    assert (summary.ran, summary.skipped) == (6000, 0)
    assert used < 10e6, f"peak {used / 1e6:.1f} MB"
    records = output.read_bytes().splitlines(keepends=True)
    output.write_bytes(b"".join(records[:2500]))  # interrupted: the rest is read again to find what is left
    used, summary = peak(output)
    assert (summary.ran, summary.skipped) == (3500, 2500)
    assert used < 10e6, f"peak {used / 1e6:.1f} MB"
    assert sorted(json.loads(r)["custom_id"] for r in output.read_bytes().splitlines()) == sorted(
        f"c{i}" for i in range(6000)
    )
