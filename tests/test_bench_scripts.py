"""The benchmark scripts users are told to run still run (on the smallest settings)."""

from __future__ import annotations

import pytest

from bench.checks import mac_check


@pytest.mark.parametrize("bias", [False, True], ids=["basal-1.5", "basal-1.0 biases"])
def test_mac_check_smoke_on_cpu(tmp_path, capsys, bias):
    """The Mac check on the CPU: every judged check passes, and its negative control was caught (chunking off
    changed the bits), so the same checks can fail; also on a model in the basal-1.0 layout (`--bias`)."""
    import json

    report, requests, exports = tmp_path / "mac.json", tmp_path / "requests.jsonl", tmp_path / "exports"
    requests.write_text(mac_check.DEFAULT_REQUESTS.read_text().splitlines()[0] + "\n")  # one request: quick
    argv = ["--device", "cpu", "--preset", "demo", "--dtypes", "f32", "--quick", "--runs", "2", "--long-words", "120"]
    argv += ["--json", str(report), "--requests", str(requests), "--exports", str(exports)]
    argv += ["--bias", "--no-serve"] if bias else []  # serve over HTTP once: it starts a server
    assert mac_check.main(argv) == 0
    data = json.loads(report.read_text())
    judged = {c["name"]: c["ok"] for c in data["checks"] if c["ok"] is not None}
    assert len(judged) >= 10 and all(judged.values()), judged
    assert judged["negative control (f32)"] and "differ" in capsys.readouterr().out
    assert {"basal", "plain MLX"} <= set(data["speed"][0]["rows"]) and data["environment"]["packages"]["mlx"]
    assert judged["f32 export vs CPU f32 export"] and len(list(exports.glob("*.jsonl"))) == 2
    assert ("basal serve over HTTP" in judged) != bias and judged.get("basal serve over HTTP", True)


def test_mac_check_report_isolates_failures():
    report = mac_check.Report({})
    report.run("raises", lambda: 1 / 0)
    report.run("fails", lambda: (False, "bad"))
    report.run("passes", lambda: (True, "good"))
    report.run("measured", lambda: (None, "info"))
    assert [c.name for c in report.failed] == ["raises", "fails"] and "ZeroDivisionError" in report.checks[0].detail


def test_bench_suite_writes_json_markdown_and_a_plot(demo_model, tmp_path):
    import json

    from basal.benchsuite.report import write
    from basal.benchsuite.suites import SUITES, Bench, model_shape
    from basal.progress import Progress

    lines: list[str] = []
    bench = Bench(demo_model, transformers=False, progress=Progress("bench scoring", tty=False, emit=lines.append))
    result = SUITES["scoring"](bench)
    assert lines[0] == "bench scoring [1] scoring: basal (tree), 5 questions, warm-up"  # progress inside the suite
    assert lines[-1] == "bench scoring [14] scoring: basal, tree off, 50 questions, run 1/1"  # 3 + 3, 3 + 1, 3 + 1
    files = write(result, tmp_path, {"model": model_shape(demo_model)}, plot=True)
    assert [f.suffix for f in files] == [".json", ".md", ".png"] and all(f.stat().st_size > 0 for f in files)
    data = json.loads(files[0].read_text())
    assert data["model"]["name"] == demo_model.name and data["versions"]["torch"].startswith("2.13")
    engines = {row[1] for row in data["rows"]}
    assert engines == {"basal (tree)", "basal, tree off"}
    assert len(data["samples_s"]) == 6 and "speed vs tree off" in files[1].read_text()


@pytest.mark.slow
def test_multi_speed_smoke(demo_dir, tmp_path):
    from bench.lab import multi_speed

    rows = multi_speed.main(
        [
            "--model",
            str(demo_dir),
            "--labels",
            "3",
            "--reps",
            "1",
            "--state-tokens",
            "64",
            "--out",
            str(tmp_path / "m.json"),
        ]
    )
    (row,) = rows
    assert row["labels"] == 3 and row["packed_tokens"] < row["prompt_tokens"]  # the state is computed once
    assert row["packed_tokens"] < row["separate_packed_tokens"]


@pytest.mark.slow
def test_evidence_speed_smoke(demo_dir, tmp_path):
    from bench.lab import evidence_speed

    args = ["--model", str(demo_dir), "--state-tokens", "64", "--questions", "1", "--reps", "1"]
    (row,) = evidence_speed.main([*args, "--out", str(tmp_path / "e.json")])
    assert row["state_tokens"] == 64 and row["on_ms"] > 0 and row["off_ms"] > 0


def test_cpu_speed_pairs_each_forward_with_the_rates_around_it():
    """100 GFLOP in 1 s between rates of 80 and 120 GFLOP/s: 100 / mean(80, 120) = 1.0, not 100 / 80 or / 120."""
    from bench.lab import cpu_speed

    assert cpu_speed.paired_fraction(100e9, 1.0, 80.0, 120.0) == 1.0
    assert cpu_speed.paired_fraction(100e9, 2.0, 100.0, 100.0) == 0.5
    assert cpu_speed._paired([0.7, 0.9, 0.8]) == "0.80 (0.70–0.90)" and cpu_speed._paired(None) == "—"


def test_gemm_columns_smoke(demo_model):
    """bench.lab.gemm_columns on the demo model: a rate per shape, the three plan sets swapped in and back, the same
    bits under each."""
    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.pipeline import Pipeline
    from basal.core.request.dialects import parse_systemone
    from bench.lab import gemm_columns

    assert set(gemm_columns.fresh_vs_reused(demo_model.config, 1030, 1)) == {"fresh", "reused"}
    rates = gemm_columns.shape_rates(demo_model.config, 16, 1)
    assert set(rates) == {"qkv", "o", "gate_up", "down"} and all(r[0] > 0 for r in rates.values())
    backend = TorchBackend.load(demo_model)
    pipeline = Pipeline(demo_model, backend)
    body = {"model": "m", "state": "The door is open.", "questions": {"q": {"type": "noul", "instructions": "Open?"}}}
    ab = gemm_columns.forward_ab(pipeline, backend, parse_systemone(body, lambda m: m), 1)
    assert ab["same_bits"] and set(ab["seconds"]) == {"one call", "probed", "512 columns"}
    plans = backend.net.chunks.sizes  # the probed chunk sizes are back in place
    assert {f"{k[0]}x{k[1]}": p.cols for k, p in plans.items()} == ab["probed_cols"]


def test_cpu_speed_plot_from_saved_results(tmp_path):
    """`bench.lab.cpu_speed --replot`: fractions recomputed against the median measured rate, then drawn."""
    from bench.lab import cpu_speed

    row = {"workload": "25 questions, one ~700-token state", "gflop": 100.0, "before_s": [2.0], "after_s": [1.0]}
    model = {"layers": 2, "gemm_limit": {"combined_gflops": 999.0}, "gemm_rates_measured": [50.0, 100.0, 200.0]}
    model = cpu_speed.refresh_fractions({**model, "rows": [row]})
    assert model["rows"][0]["fraction_before"] == 0.5 and model["rows"][0]["fraction_after"] == 1.0
    out = cpu_speed.plot_fractions([model], "torch-ops", tmp_path / "f.png")
    assert out.read_bytes().startswith(b"\x89PNG")


def test_basal_bench_records_how_it_computed(demo_dir, tmp_path):
    """`basal bench` writes, with every suite's results, the backend's compute facts (threads, GEMM chunks,
    compiled CPU kernels) next to the GEMM limit it measured."""
    import json

    from basal.backends.cuda.cpu import cpu_kernels
    from basal.cli import main

    argv = ["bench", "single", "--model", str(demo_dir), "--no-transformers", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    data = json.loads((tmp_path / "single.json").read_text())
    assert data["compute"]["cpu_kernels"] == cpu_kernels.kind() and data["compute"]["threads"] >= 1
    assert data["gemm_limit"]["combined_gflops"] > 0 and data["compute"]["gemm_chunks"]
    assert data["transformers_baseline"] is None  # --no-transformers


def test_lane_overlap_bench_smoke(demo_model, capsys):
    """bench/lab/lane_overlap.py runs both ways on its simulated device and prints a row per setting."""
    from bench.lab import lane_overlap

    argv = ["--floor-ms", "1", "--token-us", "7.5", "--clients", "2", "--requests", "20", "--rounds", "1"]
    argv += ["--rates", "100", "--open-shapes", "1:7.5"]
    lane_overlap.main(argv)
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip() and line.split()[0][0].isdigit()]
    assert len(rows) == 2 and all(float(x.rstrip("x")) > 0 for x in rows[1][3:6]), out


def test_sm90_usage_prints_every_case_of_a_kernel(capsys):
    pytest.importorskip("triton")
    from bench.lab import sm90_usage

    assert sm90_usage.main(["--kernel", "swiglu"]) == 0
    out = capsys.readouterr()
    assert out.out.count("\nswiglu ") == 3 and "3 cases, 0 with problems" in out.err  # F of mini, 4.5B, max


def test_the_transformers_baseline_runs_where_basal_runs(demo_model):
    """On CUDA the baseline takes basal's device and dtype (a CPU f32 baseline would compare machines, not
    engines); elsewhere the CPU in f32, which this machine runs."""
    from types import SimpleNamespace

    import torch

    from basal.benchsuite.suites import Bench
    from basal.benchsuite.workloads import bench_items

    def placed(device: str, dtype: str) -> tuple[str, str]:
        bench = Bench.__new__(Bench)
        bench.backend = SimpleNamespace(device=device, dtype=dtype)
        return bench.baseline_placement

    assert placed("cuda:0", "f16") == ("cuda:0", "f16") and placed("cuda", "bf16") == ("cuda", "bf16")
    assert placed("cpu", "bf16") == ("cpu", "f32") and placed("gpu", "f16") == ("cpu", "f32")  # MLX's "gpu"
    bench = Bench(demo_model)
    assert bench.hf(bench.plan(bench_items(1, seed=0)[0])) > 0
    weight = next(bench._hf.parameters())
    assert (weight.device.type, weight.dtype) == ("cpu", torch.float32)


def test_host_ceiling_bench_serves_over_http_and_reports_a_row_per_request_and_level(capsys):
    """Real server children over the simulated device (basal serve's and the baseline without its gc freeze), both
    requests, HTTP against the in-process engine."""
    import gc

    from bench.lab import host_ceiling

    try:
        host_ceiling.main(["--requests", "4", "--clients", "1", "2", "--gc-baseline"])
    finally:
        gc.unfreeze()  # the bench freezes its own start-up heap; this test process goes on
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| README") or line.startswith("| one yes/no")]
    assert len(rows) == 8 and sum("| without gc.freeze |" in row for row in rows) == 4
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[3]) > 0 and float(cells[7]) > 0  # HTTP and in-process requests/s
        assert 0 < float(cells[5].split("/")[0]) <= float(cells[4].split("/")[0])  # the server's own p50 <= client's
        assert cells[6] == "-" or float(cells[6]) >= 0  # server CPU per request (Linux; clock ticks: 0 for a few)


@pytest.mark.slow  # 61 s at a load average of 15 on 2 cores (torch.profiler's start is most of it)
def test_cpu_profile_shares_cover_the_forward_and_restore_the_ops(demo_model):
    """The profile's categories are timed inside the forward (GEMM, attention and elementwise all seen), their
    shares and the rest add up to the whole, and the clocked ops are put back afterwards."""
    from basal.backends.cuda import ops as K
    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.pipeline import Pipeline
    from basal.core.request.dialects import parse_systemone
    from bench.compare.cpu_http import REQUEST_SET
    from bench.lab import cpu_profile

    before = {name: getattr(K, name) for name in cpu_profile.WRAPPED}
    pipeline = Pipeline(demo_model, TorchBackend.load(demo_model, dtype="f32"))
    body = REQUEST_SET.bodies(demo_model.tokenizer, "m")[0] | {"state": "Paczka dotarła uszkodzona."}
    row = cpu_profile.profile(pipeline, [parse_systemone(body, lambda m: m)], reps=1)
    assert all(row["shares"][k] > 0 for k in ("GEMM", "attention", "elementwise"))
    assert sum(row["shares"].values()) == pytest.approx(1.0)
    assert {name: getattr(K, name) for name in cpu_profile.WRAPPED} == before
    sizes = [len(b["questions"]) for b in REQUEST_SET.bodies(demo_model.tokenizer, "m")]
    assert 1 in sizes and max(sizes) > 1  # single- and multi-question requests


def test_llama_cpp_gguf_has_llamas_names_and_rope_layout(demo_dir, tmp_path):
    """The GGUF conversion for the llama.cpp baseline: llama.cpp's tensor names, f16 matrices with f32 norms, and
    q rows permuted from rotate-half to llama.cpp's interleaved RoPE (the permutation's inverse gives them back)."""
    gguf = pytest.importorskip("gguf")
    import numpy as np
    from safetensors.torch import load_file

    from bench.compare.llama_cpp import _permute, to_gguf

    out = to_gguf(demo_dir, tmp_path / "demo.gguf", "f16")
    tensors = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    assert {"token_embd.weight", "output.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight"} <= set(tensors)
    assert tensors["blk.0.attn_q.weight"].tensor_type.name == "F16"
    assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"
    q = load_file(demo_dir / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"].float().numpy()
    heads = 4
    stored = np.asarray(tensors["blk.0.attn_q.weight"].data, dtype=np.float32).reshape(q.shape)
    assert np.array_equal(stored, _permute(q, heads).astype(np.float16).astype(np.float32))
    back = stored.reshape(heads, q.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(q.shape)
    assert np.array_equal(back, q.astype(np.float16).astype(np.float32))


def test_start_times_finds_the_request_and_judges_each_target():
    """The bench reads the repository's example request (a wrong root once made it fail at its first line) and
    judges each command against its own target."""
    from bench.lab import start_times

    assert start_times.REQUEST.is_file()
    result = {
        "over_import_torch_s": {"decide": 0.49, "serve (ready)": 1.6, "run-batch (nothing left)": -1.0},
        "median_s": {"run-batch (nothing left)": 0.9},
    }
    assert [(name, ok) for name, ok, _ in start_times.verdicts(result)] == [
        ("decide", True),
        ("serve", False),
        ("run-batch", True),
    ]


def test_online_with_batch_bench_measures_both_ways_beside_a_running_batch(tmp_path, capsys):
    """A `basal serve` child, a few online requests alone and beside a small batch: every part of the table."""
    from bench.compare import online_with_batch

    args = "--requests 3 --lines 400 --warm-lines 10 --alone-s 0.2".split()
    result = online_with_batch.main([*args, "--out", str(tmp_path / "out.json")])
    row = result["rows"]["this"]
    for way in ("alone", "batch"):
        assert row[way]["total"]["p50"] > 0 and row[way]["compute"]["p50"] > 0
    assert row["batch_at_end"][0]["status"] == "in_progress"  # the batch still ran when the last request ended
    assert row["batch_at_end"][0]["lines_per_s_alone"] > 0  # and ran by itself before the client started
    assert "| this | queue ms |" in capsys.readouterr().out


def test_caches_mixed_http_bench_serves_both_ways_and_compares_the_bytes(tmp_path, capsys):
    """Two `basal serve` children (caches off, defaults) answer a few Zipf-drawn requests after a few untimed ones:
    the answer cache hits only on, the state cache counts only on, and the answers are equal once the timing and
    cached_tokens are out."""
    from bench.lab import caches_mixed_http

    argv = ["--requests", "24", "--warm", "8", "--states", "20", "--state-tokens", "32", "--clients", "4"]
    result = caches_mixed_http.main([*argv, "--out", str(tmp_path / "out.json")])
    assert 0 <= result["states_new_to_timed_run"] < result["distinct_states_asked"] <= 20
    off, on = result["rows"]["off"], result["rows"]["on"]
    assert result["identical_answers"] == {"off": "24/24", "on": "24/24"}
    assert off["answer_cache"] == {"none": 24} and on["answer_cache"]["hit"] > 0
    assert off["state_cache"]["hits"] == off["cached_tokens"] == 0 and on["state_cache"]["hits"] > 0
    assert on["cached_tokens"] > 0 and result["throughput_ratio"] > 0
    out = capsys.readouterr().out
    assert "answers byte-equal but timings 24/24" in out and "after 8 untimed" in out


def test_caches_mixed_http_compares_every_byte_but_the_timing_and_cached_tokens():
    from bench.lab.caches_mixed_http import comparable

    body = b'{"answers":{"q":{"type":"noul","noul":0.25}},"usage":{"input_tokens":226,"questions":1,"latency_ms":%s%s}}'
    assert comparable(body % (b"112.8", b',"cached_tokens":64')) == comparable(body % (b"0.495", b""))
    assert comparable(body % (b"1.0", b"")) != comparable(body.replace(b"0.25", b"0.26") % (b"1.0", b""))
    assert comparable(body % (b"1.0", b"")) != comparable(body.replace(b"226", b"227") % (b"1.0", b""))


def test_calibrate_speed_ceiling_counts_the_gemm_work_a_forward_does(demo_model, monkeypatch):
    """The ceiling's GEMM work per token is what the forward's GEMMs do: counted from the checkpoint's tensor shapes,
    and by counting every GEMM row of a real pass (its computed tokens at that rate, its readouts at the rest of
    the last layer)."""
    from basal.backends.cuda import model as tree_model
    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.pipeline import Pipeline, Stats
    from basal.core.model.prompt import LETTERS
    from basal.core.request.dialects import parse_systemone
    from basal.core.request.model_names import model_resolver
    from bench.lab.calibrate_speed import gemm_flops_per_token

    cfg = demo_model.config
    shapes, last = cfg.weight_shapes(), cfg.num_hidden_layers - 1
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    by_shapes = sum(
        2 * shape[0] * shape[1]
        for name, shape in shapes.items()
        if name.endswith("proj.weight")
        and (int(name.split(".")[2]) < last or name.split(".")[-2] in ("k_proj", "v_proj"))
    )
    assert gemm_flops_per_token(cfg) == by_shapes and any(p in n for n in shapes for p in projections)

    pipeline = Pipeline(demo_model, TorchBackend.load(demo_model))

    def request(state: str):
        questions = {f"q{i}": {"type": "noul", "instructions": f"Is point {i} true?"} for i in range(3)}
        body = {"model": "jev-latest", "state": state, "questions": questions}
        return parse_systemone(body, model_resolver([demo_model.name], demo_model.name))

    pipeline.decide(request("A state of some length. " * 30))  # warm-up: what runs once per process runs now
    counted = [0]
    real = tree_model.K.linear_steps

    def counting(x, w, *args, **kwargs):
        counted[0] += 2 * x.shape[0] * w.shape[0] * w.shape[1]
        return (yield from real(x, w, *args, **kwargs))

    monkeypatch.setattr(tree_model.K, "linear_steps", counting)
    stats = Stats()
    pipeline.decide(request("Another state, never seen. " * 30), stats)
    readouts = 3 * 2  # three yes/no questions, two option orders each
    d, f, q = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads * cfg.head_dim
    at_readouts = 2 * (d * q + q * d + d * 2 * f + f * d + d * len(LETTERS))  # last layer's rest, letter logits
    assert counted[0] == stats.packed_tokens * gemm_flops_per_token(cfg) + readouts * at_readouts


def test_metric_total_sums_a_sample_over_the_label_sets_it_admits():
    from bench.lab.http_speed import metric_total

    text = (
        "# TYPE basal_batch_requests histogram\n"
        'basal_batch_requests_sum{lane="main"} 5.0\n'
        'basal_batch_requests_sum{lane="long"} 7.0\n'
        'basal_batch_requests_sum{lane="background"} 11.0\n'
        'basal_batch_requests_count{lane="long"} 2.0\n'
        "# TYPE basal_packed_tokens counter\n"
        'basal_packed_tokens_total{model="a"} 3.0\n'
        'basal_packed_tokens_total{model="b"} 4.0\n'
    )
    assert metric_total(text, "basal_packed_tokens_total") == 7.0
    assert metric_total(text, "basal_batch_requests_sum") == 23.0
    assert metric_total(text, "basal_batch_requests_sum", lambda labels: labels["lane"] != "main") == 18.0
    assert metric_total(text, "basal_state_cache_hits_total") == metric_total("", "basal_packed_tokens_total") == 0
