"""The `basal` command line. Each subcommand parses its flags and calls into `basal.core`; nothing else here."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from basal import __version__

if TYPE_CHECKING:
    from basal.replay.run import Captured


def _synth_model(a: argparse.Namespace) -> int:
    import signal

    from tqdm import tqdm

    from basal.core.model.synth import PRESETS, preset_config, synth_model, weights_bytes

    cfg = preset_config(a.preset, a.layers, a.bias)
    print(
        f"writing {a.preset} ({PRESETS[a.preset].description}{', with biases' if a.bias else ''}; "
        f"{cfg.num_hidden_layers} layers, "
        f"{cfg.n_params / 1e9:.2f}B parameters, {weights_bytes(cfg) / 2**30:.2f} GiB bf16) to {a.out}",
        file=sys.stderr,
    )
    # SIGTERM becomes SystemExit, so synth_model removes its temporary folder exactly as on Ctrl-C
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc="weights", disable=a.quiet) as bar:
        synth_model(
            a.out,
            a.preset,
            a.layers,
            a.seed,
            on_bytes=bar.update,
            on_total=_total_of(bar),
            evidence_head=a.evidence_head,
            bias=a.bias,
        )
    print(f"done: {a.out} (synthetic weights: its answers carry no meaning)", file=sys.stderr)
    return 0


def _total_of(bar):
    """synth_model's `on_total`: the bar learns the size once the weights are planned."""

    def on_total(n: int) -> None:
        bar.total = n
        bar.refresh()

    return on_total


# `basal decide` and `basal export` read requests in the same dialect by default: the lenient upstream one, in
# which reference exports, the native SDK and upstream request files are written and which accepts TypeSafe
# bodies as well (the strict TypeSafe parser refuses many upstream bodies).
DEFAULT_DIALECT = "basal"


def _check_reference(a: argparse.Namespace) -> int:
    from basal.core.model.model_dir import ModelDir
    from basal.export.reference import ReferenceChecker

    model = ModelDir.load(a.model) if a.model else None
    temps = _manifest_temperatures(a.manifest) if a.manifest and not model else None
    checker = ReferenceChecker(model, temps)
    for export in a.export:
        checker.check_file(Path(export), manifests=model is None and temps is None)
    report = checker.report
    for line in report.mismatches[: a.show]:
        print(line)
    if len(report.mismatches) > a.show:
        print(f"... and {len(report.mismatches) - a.show} more mismatches")
    if model is None:
        print("(no --model: token ids and letter ids were not checked)")
    print(report.table())
    return 0 if report.ok else 1


def _manifest_temperatures(path: str) -> dict[str, float] | None:
    """The calibration temperatures of a manifest file named with --manifest."""
    import json

    data = json.loads(Path(path).read_text(encoding="utf-8"))
    temps = data.get("manifest", data).get("calibration", {}).get("temperatures")
    if not temps:
        raise SystemExit(f"basal check-reference: {path} has no calibration.temperatures")
    return {k: float(v) for k, v in temps.items()}


def _open_model(path: str | None):
    """A model directory, or the built-in demo model (with a plain warning that its answers mean nothing)."""
    from basal.core.model.model_dir import ModelDir
    from basal.core.model.synth import demo_model
    from basal.serve.config import DEMO_PATH

    model = ModelDir.load(path) if path and path != DEMO_PATH else demo_model()
    if model.synthetic:
        print(
            f"basal: {model.name} is a synthetic model with random weights: its answers carry no meaning",
            file=sys.stderr,
        )
    return model


def _decide(a: argparse.Namespace) -> int:
    if a.config:
        return _decide_served(a)
    from basal.backends.cuda.cpu.threads import prepare_server_environment

    prepare_server_environment()  # before torch loads: no OpenMP worker spins between ops for one request
    import gc
    import time

    import msgspec

    from basal.backends.load import load_backend
    from basal.core.engine.pipeline import Pipeline, Stats
    from basal.core.errors import RequestError
    from basal.core.request.dialects import decode_body, parse_basal, parse_systemone
    from basal.core.request.model_names import model_resolver

    from_stdin = a.request in (None, "-")
    body = b"" if from_stdin else Path(a.request).read_bytes()  # a missing file fails before the model loads
    started = time.perf_counter()
    gc.disable()  # no cycle collection walks the objects of torch and the model while they load (~0.1 s of CPU)
    try:
        model = _open_model(a.model)
        backend = load_backend(model, a.backend, a.dtype)
        pipeline = Pipeline(model, backend, prefix_cache=a.prefix_cache, large_choice=a.large_choice)
    finally:
        gc.freeze()  # start-up's objects stay out of later collections; what the request allocates is collected
        gc.enable()
    load_ms = (time.perf_counter() - started) * 1000
    if from_stdin:
        if sys.stdin.isatty():
            print("basal decide: reading the request JSON from standard input (end it with Ctrl-D)", file=sys.stderr)
        body = sys.stdin.buffer.read()
    resolve = model_resolver([model.name], model.name)
    stats = Stats()
    try:
        raw = decode_body(body, a.dialect)
        head = lambda _name: pipeline.serves_evidence  # noqa: E731
        parse = parse_systemone if a.dialect == "systemone" else parse_basal
        request = parse(raw, resolve, serves_evidence=head)
        response = pipeline.decide(request, stats)
    except RequestError as e:
        print(msgspec.json.encode(e.body).decode())
        print(f"basal decide: the request was refused (HTTP {e.status})", file=sys.stderr)
        return 1
    print(msgspec.json.encode(response).decode())
    if a.timing:
        saved = 1 - stats.packed_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
        loaded = "model, backend, template prefix" if a.prefix_cache else "model, backend"
        print(
            f"backend {backend.name} {backend.device} {backend.dtype}\n"
            f"tokens: {stats.prompt_tokens} in the option-order prompts, {stats.packed_tokens} computed "
            f"({saved:.0%} saved by the prefix tree{' and the template-prefix cache' if a.prefix_cache else ''}), "
            f"{stats.forwards} forward(s)\n"
            f"time: load {load_ms:.0f} ms ({loaded}), tokenize {stats.tokenize_ms:.1f} ms, "
            f"pack {stats.pack_ms:.1f} ms, "
            f"forward {stats.forward_ms:.1f} ms",
            file=sys.stderr,
        )
    return 0


def _decide_served(a: argparse.Namespace) -> int:
    """`basal decide --config FILE`: one request through the front `basal serve` would build (cascades too)."""
    import asyncio

    import msgspec

    from basal.core.errors import RequestError
    from basal.core.request.dialects import decode_body, parse_basal, parse_systemone
    from basal.core.request.model_names import ServedModels
    from basal.serve.config import load_config
    from basal.serve.server import build_engines, with_cascades

    if a.model is not None:
        raise ValueError("give either --model or --config (the file names the models)")
    config = load_config(a.config)
    body = sys.stdin.buffer.read() if a.request in (None, "-") else Path(a.request).read_bytes()
    engines = build_engines(config)
    front = with_cascades(engines, config)
    front.start()
    try:
        parse = parse_systemone if a.dialect == "systemone" else parse_basal
        evidence = lambda name: front.model_info(name).serves_evidence  # noqa: E731
        request = parse(
            decode_body(body, a.dialect), ServedModels(tuple(front.names), front.default), serves_evidence=evidence
        )
        result = asyncio.run(front.run(request))
    except RequestError as e:
        print(msgspec.json.encode(e.body).decode())
        print(f"basal decide: the request was refused (HTTP {e.status})", file=sys.stderr)
        return 1
    finally:
        front.close()
    print(msgspec.json.encode(result.response).decode())
    if result.cascade is not None:
        print(f"answered by: {result.cascade.answered_by_header()}", file=sys.stderr)
    return 0


def _facts(a: argparse.Namespace) -> int:
    from basal.core.facts import FactsError, inject
    from basal.core.facts.show import jsonl_results, state_of_file

    if a.jsonl is not None and a.state is not None:
        raise ValueError("give either a state file or --jsonl FILE, not both")
    source = a.jsonl if a.jsonl is not None else a.state
    from_stdin = source in (None, "-")
    if from_stdin and sys.stdin.isatty():
        print("basal facts: reading from standard input (end it with Ctrl-D)", file=sys.stderr)
    if a.jsonl is not None:
        stream = sys.stdin if from_stdin else open(source, encoding="utf-8")  # noqa: SIM115 - closed below
        malformed = 0
        try:
            for line, well_formed in jsonl_results(stream):
                print(line, flush=False)
                malformed += not well_formed
        finally:
            if stream is not sys.stdin:
                stream.close()
        if malformed:
            print(f'basal facts: {malformed} input line(s) were not {{"id", "state"}} objects', file=sys.stderr)
        return 1 if malformed else 0
    content = sys.stdin.read() if from_stdin else Path(source).read_text(encoding="utf-8")
    try:
        print(inject(state_of_file(content)))
    except FactsError as e:
        print(f"basal facts: the facts computation fails as upstream's does: {e}", file=sys.stderr)
        return 1
    return 0


# Ray's switch for a single-node Ray on 127.0.0.1 (its default on macOS and Windows): with it 0, a local Ray's GCS,
# raylet and worker ports listen on loopback instead of every interface.
RAY_LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _serve(a: argparse.Namespace) -> int:
    from basal.backends.cuda.cpu.threads import prepare_server_environment

    prepare_server_environment()  # before torch loads: OpenMP workers sleep between ops (threads.py)
    import gc

    gc.disable()  # no collection walks the start-up heap while it grows; freeze_startup_heap turns them on again
    try:
        return _serve_configured(a)
    finally:
        gc.enable()  # also after a start that stopped early (a busy port, a bad setting)


def _serve_configured(a: argparse.Namespace) -> int:
    from basal.serve.flags import serve_config
    from basal.serve.server import serve

    config = serve_config(a)
    if config.log_format != "text":
        from basal.observability.logs import configure

        configure(config.log_format, logging.getLogger().level)
    if a.ray is not None or a.replicas is not None:
        import msgspec

        from basal.serve.config import RayConfig

        ray = config.ray or RayConfig()
        if a.ray not in (None, "local"):
            ray = msgspec.structs.replace(ray, address=a.ray)
        if a.replicas is not None:
            ray = msgspec.structs.replace(ray, replicas=a.replicas)
        config = msgspec.structs.replace(config, ray=ray)
    if config.ray is not None:
        if config.ray.address is None:  # a local Ray: every one of its ports on loopback (docs/ray.md, Security)
            os.environ.setdefault(RAY_LOCAL_ONLY, "0")  # read when ray is imported, so before the import below
        try:
            from basal.ray_serve.app import serve_ray
        except ImportError as e:
            raise ValueError(f"serving on Ray needs the ray extra: pip install 'basal-bitwise[ray]' ({e})") from e
        serve_ray(config)
        return 0
    serve(config)
    return 0


def _download(a: argparse.Namespace) -> int:
    from basal.core.model.model_dir import ModelDir
    from basal.serve.config import HUB_ID
    from basal.serve.hub import download

    if not HUB_ID.fullmatch(a.repo):
        raise ValueError(f"{a.repo!r} is not a Hugging Face model id: give owner/name or owner/name@revision")
    repo, _, revision = a.repo.partition("@")
    path = download(repo, revision or None)
    model = ModelDir.load(path)  # a Basal model, complete: the server would refuse anything else at its start
    print(f"{a.repo}: {model.name} in {path}; serve it with basal serve --model {a.repo}", file=sys.stderr)
    print(path)
    return 0


def _run_batch(a: argparse.Namespace) -> int:
    """A Batch API input file through the same decision path as `basal serve`, without a server."""
    import asyncio
    import time

    from basal.batch.offline import pending, run_file
    from basal.serve.config import DEMO_PATH, ModelConfig, ServeConfig, load_config

    source, output = Path(a.input), Path(a.output)
    if not source.is_file():
        raise ValueError(f"{source}: no such input file")
    if a.config is not None:
        config = load_config(a.config)
    else:
        config = ServeConfig(models=[ModelConfig(path=a.model or DEMO_PATH)])
    todo, skipped = pending(source, output, config.batches.max_line_kb << 10)  # as batch_settings() reads it
    if not todo:  # nothing to run: no model is loaded
        print(f"basal run-batch: nothing left to do: all {skipped} line(s) already in {output}", file=sys.stderr)
        return 0
    from basal.api.decide import body_decider
    from basal.progress import Progress
    from basal.serve.server import api_settings, batch_settings, build_engines

    engines = build_engines(config, progress=True)
    engines.start()
    decide = body_decider(engines, api_settings(config))
    shown: list[Progress] = []

    def before(todo: int, skipped: int) -> None:
        if skipped:
            print(f"basal run-batch: {skipped} line(s) already in {output}: skipped", file=sys.stderr)
        shown.append(Progress("run-batch", todo, min_interval_s=5.0))

    def on_record(custom_id: str, ok: bool) -> None:
        with shown[0].step(custom_id):
            pass

    started = time.perf_counter()
    try:
        summary = asyncio.run(
            run_file(source, output, decide, batch_settings(config).max_line_bytes, on_record, before)
        )
    finally:
        for bar in shown:
            bar.close()
        engines.close(drain=False)
    seconds = time.perf_counter() - started
    print(
        f"basal run-batch: {summary.ran} line(s) in {seconds:.1f} s ({summary.ran / max(seconds, 1e-9):.1f} lines/s), "
        f"{summary.failed} failed, {summary.skipped} skipped; records in {output}",
        file=sys.stderr,
    )
    return 0


def _replay(a: argparse.Namespace) -> int:
    """Captured requests under two configurations, compared answer by answer."""
    from basal.replay.run import read_capture

    captured = read_capture(Path(a.capture))
    try:
        return _replay_captured(a, captured)
    finally:
        captured.close()


def _replay_captured(a: argparse.Namespace, captured: Captured) -> int:
    """`_replay` once the capture is open."""
    import asyncio
    import os

    from basal.progress import Progress
    from basal.replay import report
    from basal.replay.diff import Diff, diff, failures
    from basal.replay.run import configuration, run

    failures(Diff().summary(), a.fail_on)  # a malformed --fail-on fails before any run
    key = a.api_key or os.environ.get("BASAL_API_KEY")
    outcomes, names = [], []
    for side, spec in (("A", a.a), ("B", a.b)):
        with configuration(spec, key) as config:
            bar = Progress(f"replay {side}", len(captured.lines), min_interval_s=5.0)

            def tick(bar=bar) -> None:
                with bar.step(""):
                    pass

            async def side_run(config=config, tick=tick):
                try:
                    return await run(captured, config.decide, tick)
                finally:
                    await config.aclose()

            try:
                outcomes.append(asyncio.run(side_run()))
            finally:
                bar.close()
            names.append(config.name)
    compared = diff(outcomes[0], outcomes[1])
    summary = compared.summary()
    failed = failures(summary, a.fail_on)
    report.write(Path(a.output), compared, names[0], names[1], captured.states, failed)
    print(f"basal replay: {report.headline(summary)}; report in {a.output}/report.html", file=sys.stderr)
    if captured.unreadable:
        print(f"basal replay: {len(captured.unreadable)} unreadable line(s) skipped", file=sys.stderr)
    for reason in failed:
        print(f"basal replay: fail-on: {reason}", file=sys.stderr)
    return 2 if failed else 0


def _doctor(a: argparse.Namespace) -> int:
    from basal.doctor import report

    model = None if a.no_check else _open_model(a.model)
    print(report(model, run_checks=not a.no_check))
    return 0


def _bench(a: argparse.Namespace) -> int:
    from basal.benchsuite.run import run_suites, suite_names

    names = suite_names(a.suites)
    model = _open_model(a.model) if a.model else None
    run_suites(
        names, model, a.preset, a.layers, a.backend, a.dtype,
        full=a.full, transformers=not a.no_transformers, out=Path(a.out), plot=a.plot, quiet=a.quiet,
    )  # fmt: skip
    return 0


LARGE_CHOICE_HELP = "choices with 11..255 options: group rounds in one option order (luce2-1o, default) or both"
DTYPE_HELP = "weights and activations (default: f16 on CUDA and Metal, f32 on the CPU)"
BACKEND_HELP = "auto (default): CUDA -> torch, Apple Silicon -> mlx, else torch on the CPU"


def _backend_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="auto", choices=["auto", "torch", "mlx"], help=BACKEND_HELP)
    parser.add_argument("--dtype", default=None, choices=["f32", "f16", "bf16"], help=DTYPE_HELP)


def _export(a: argparse.Namespace) -> int:
    from basal.export.api import export_records

    model = _open_model(a.model)
    try:
        summary = export_records(
            a.requests,
            a.out,
            model,
            a.backend,
            a.dtype,
            batching=a.batching,
            dialect=a.dialect,
            prefix_cache=not a.no_prefix_cache,
            overwrite=a.overwrite,
            state_cache_mb=a.state_cache_mb,
            progress=not a.quiet,
        )
    except KeyboardInterrupt:
        print(f"basal export: interrupted; run the same command again to continue {a.out}", file=sys.stderr)
        return 130
    resumed = f" ({summary.resumed_from} were there from an interrupted run)" if summary.resumed_from else ""
    print(f"wrote {summary.records} records to {summary.out}{resumed}", file=sys.stderr)
    return 0


def _compare(a: argparse.Namespace) -> int:
    from basal.export.compare import compare_files, dumps

    result = compare_files(a.a, a.b, a.bitwise, a.max_logit_diff, a.allow_different_models)
    print(dumps(result) if a.json else result.table())
    return 0 if result.ok else 1


def _preset_help() -> str:
    from basal.core.model.synth import PRESETS, preset_config, weights_bytes

    sizes = ", ".join(f"{name} {weights_bytes(preset_config(name)) / 2**30:.2g} GiB" for name in PRESETS)
    return f"model shapes (default demo); full-size weights: {sizes}"


def build_parser() -> argparse.ArgumentParser:
    from basal.core.model.synth import PRESETS

    p = argparse.ArgumentParser(prog="basal", description="Serving engine for Basal typed-decision models.")
    p.add_argument("--version", action="version", version=f"basal {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("synth-model", help="write a synthetic Basal model directory (real shapes, random weights)")
    s.add_argument("--out", required=True, help="directory to create (must not exist or be empty)")
    s.add_argument("--preset", default="demo", choices=list(PRESETS), help=_preset_help())
    s.add_argument(
        "--layers",
        type=int,
        default=None,
        help="cut the preset to N layers, at most its own (fast tests, benchmarks; default: all of them)",
    )
    s.add_argument("--seed", type=int, default=0, help="random seed of the weights and tokenizer (default 0)")
    s.add_argument(
        "--evidence-head", action="store_true", help="also write a seeded synthetic evidence_head.pt (k = 256)"
    )
    s.add_argument(
        "--bias", action="store_true", help="the basal-1.0 layout: attention and MLP biases (basal-1.5 has none)"
    )
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(run=_synth_model)

    c = sub.add_parser("check-reference", help="rebuild an upstream reference export and compare everything")
    c.add_argument("export", nargs="+", help="reference export JSONL file(s) (systemone.jsonl, bench.jsonl)")
    c.add_argument(
        "--model", default=None, help="model directory: also compare token ids and letter ids (default: none)"
    )
    c.add_argument(
        "--manifest",
        default=None,
        help="manifest JSON whose calibration temperatures to use (default: the export's own manifest line, else "
        "the manifest*.json beside it that names the record's model, else manifest.json)",
    )
    c.add_argument("--show", type=int, default=20, help="mismatches to print (default 20)")
    c.set_defaults(run=_check_reference)

    d = sub.add_parser("decide", help="answer one request (JSON file or stdin) and print the answer JSON")
    d.add_argument("request", nargs="?", default=None, help="request JSON file; - or nothing: standard input")
    d.add_argument("--model", default=None, help="model directory (default: the built-in demo model)")
    d.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="decide as `basal serve --config FILE` would: its models and cascades (the request's model names one) "
        "(default: none, one model)",
    )
    d.add_argument(
        "--dialect",
        default=DEFAULT_DIALECT,
        choices=["basal", "systemone"],
        help="basal: the upstream basal-serve dialect (default, as `basal export`; it reads TypeSafe bodies too); "
        "systemone: TypeSafe System One (strict)",
    )
    _backend_flags(d)
    d.add_argument(
        "--prefix-cache",
        action="store_true",
        help="compute the template prefixes' K/V first, as a server does (default: off; one request only pays for "
        "it: its prompts share the prefix in the tree anyway; the answers are the same bits)",
    )
    d.add_argument("--timing", action="store_true", help="print packed vs unpacked tokens and time per stage")
    d.add_argument("--large-choice", default="luce2-1o", choices=["luce2-1o", "luce2"], help=LARGE_CHOICE_HELP)
    d.set_defaults(run=_decide)

    f = sub.add_parser("facts", help='print a state as the model reads it with facts: "auto" (the facts block)')
    f.add_argument(
        "state", nargs="?", default=None, help="file with the state (text, or a JSON object/array); - or nothing: stdin"
    )
    f.add_argument(
        "--jsonl",
        metavar="FILE",
        default=None,
        help='many states: lines {"id", "state"} in, lines {"id", "output"} or {"id", "error"} out (- = stdin; '
        "default: one state)",
    )
    f.set_defaults(run=_facts)

    v = sub.add_parser(
        "serve",
        help="serve models over HTTP (System One and basal dialects)",
        description="Serve models over HTTP. Each setting comes from, first to last: a flag given here, the "
        "--config file, the environment (BASAL_<KEY>, e.g. BASAL_MAX_INFLIGHT, BASAL_LIMITS__MAX_QUESTIONS; "
        "docs/configuration.md), the default shown below.",
    )
    from basal.serve.flags import add_serve_flags

    add_serve_flags(v)
    v.set_defaults(run=_serve)

    w = sub.add_parser(
        "download",
        help="fetch a model from the Hugging Face hub into its cache (HF_HOME), for images and init containers",
        description="Fetch a Basal model into the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub) and print "
        "its folder; `basal serve --model OWNER/NAME[@REV]` then serves it offline. Needs the hub extra: "
        "pip install 'basal-bitwise[hub]'. HF_TOKEN authenticates (gated or private models).",
    )
    w.add_argument("repo", metavar="OWNER/NAME[@REV]", help="model id, optionally @ a branch, tag or commit")
    w.set_defaults(run=_download)

    r = sub.add_parser(
        "run-batch",
        help="run a Batch API input file (JSONL) without a server; resumable",
        description="Run a Batch API input file through the same decision path as basal serve and append one "
        "record per line to OUTPUT (docs/batches.md). Run it again with the same OUTPUT to resume: custom_ids "
        "already there are skipped.",
    )
    r.add_argument("input", help="input JSONL: {custom_id, method, url, body} per line")
    r.add_argument("-o", "--output", required=True, help="output JSONL of records (appended to; resumes)")
    r.add_argument("--model", default=None, help="model directory (default: the built-in demo model)")
    r.add_argument(
        "--config", default=None, help="a basal serve configuration file: its models and limits (default: none)"
    )
    r.set_defaults(run=_run_batch)

    rp = sub.add_parser(
        "replay",
        help="run captured requests under two configurations and report what changes",
        description="Run every request of a capture (Batch API input JSONL) under configuration A and under B, "
        "through the batch path, and write a report of flips, |Δp| and the largest changes to REPORT_DIR "
        "(report.html, summary.md, report.json, a PNG per plot; docs/replay.md). A configuration is a model "
        "directory, demo, a basal serve YAML file, or a running server's URL. Each configuration's default model "
        "answers (the captured model names are dropped). Exit 2 when a --fail-on condition holds.",
    )
    rp.add_argument("capture", help="the requests: Batch API input JSONL ({custom_id, method, url, body} per line)")
    rp.add_argument("--a", required=True, metavar="CONFIG", help="the configuration now (dir, demo, YAML or URL)")
    rp.add_argument("--b", required=True, metavar="CONFIG", help="the candidate (dir, demo, YAML or URL)")
    rp.add_argument("-o", "--output", required=True, metavar="REPORT_DIR", help="where the report is written")
    rp.add_argument(
        "--fail-on",
        default="",
        metavar="CONDITIONS",
        help='e.g. "flips>0.01,max_abs_dp>0.05": exit 2 if any holds (flips and changed are shares of answers) '
        "(default: none, never fails)",
    )
    rp.add_argument("--api-key", default=None, help="bearer key for a URL configuration (default: $BASAL_API_KEY)")
    rp.set_defaults(run=_replay)

    o = sub.add_parser("doctor", help="what this machine runs, and a quick bitwise-invariance check of each path")
    o.add_argument("--model", default=None, help="model for the check (default: the built-in demo model)")
    o.add_argument("--no-check", action="store_true", help="only list backends, devices and versions")
    o.set_defaults(run=_doctor)

    e = sub.add_parser("export", help="run a request file and write the reference export format (JSONL)")
    e.add_argument("requests", help="JSONL: requests ({id, request, dialect?}) or bench items (state, question, ...)")
    e.add_argument("-o", "--out", required=True, help="output JSONL (an interrupted export there is continued)")
    e.add_argument("--model", default=None, help="model directory (default: the built-in demo model)")
    _backend_flags(e)
    e.add_argument(
        "--batching",
        default="single",
        choices=["single", "batch", "tree"],
        help="single (default): each question alone; batch: through the engine as a server; tree: questions "
        "packed together",
    )
    e.add_argument(
        "--dialect",
        default=DEFAULT_DIALECT,
        choices=["basal", "systemone"],
        help="for lines without one (default basal, as `basal decide`)",
    )
    e.add_argument("--no-prefix-cache", action="store_true", help="do not cache the template prefix K/V")
    e.add_argument(
        "--state-cache-mb", type=float, default=0, help="keep states' K/V across requests (MiB; default 0: off)"
    )
    e.add_argument("--overwrite", action="store_true", help="start over instead of continuing an existing file")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.set_defaults(run=_export)

    m = sub.add_parser("compare", help="compare two exports: tokens, logits, decisions, answers (exit 1: policy fails)")
    m.add_argument("a", help="export JSONL (basal or upstream)")
    m.add_argument("b", help="export JSONL (basal or upstream)")
    m.add_argument("--bitwise", action="store_true", help="require bitwise-identical letter logits and answers")
    m.add_argument(
        "--max-logit-diff",
        type=float,
        default=None,
        help="require every |Δ letter logit| <= X (default: no bound; decisions must agree)",
    )
    m.add_argument("--json", action="store_true", help="print the report as JSON")
    m.add_argument("--allow-different-models", action="store_true", help="compare exports of different models")
    m.set_defaults(run=_compare)

    b = sub.add_parser("bench", help="benchmark suites with their baselines; JSON + markdown (+ PNG with --plot)")
    b.add_argument("suites", nargs="*", help="single latency scoring throughput concurrency mixed (default: all)")
    b.add_argument("--model", default=None, help="model directory (default: synthesize --preset cut to --layers)")
    b.add_argument("--preset", default="mini", choices=list(PRESETS), help="preset to synthesize (default mini)")
    b.add_argument(
        "--layers",
        type=int,
        default=2,
        help="layers of the synthesized preset (default 2: the last layer runs at readouts only, so 1 would "
        "flatter basal)",
    )
    _backend_flags(b)
    b.add_argument("--full", action="store_true", help="the full sizes of the suites (for a GPU or a big CPU)")
    b.add_argument("--no-transformers", action="store_true", help="skip the transformers baseline")
    b.add_argument("--out", default="bench/results", help="folder for the results (default bench/results)")
    b.add_argument("--plot", action="store_true", help="write PNG charts (needs matplotlib)")
    b.add_argument("--quiet", action="store_true", help="no progress bars or progress lines")
    b.set_defaults(run=_bench)
    described = {  # what `basal CMD --help` opens with (the others set their own description above)
        "synth-model": "Write a synthetic Basal model directory: the real shapes of a preset (or --layers fewer), "
        "random weights, a tokenizer trained on the prompt contract. Its answers carry no meaning; its speed is real.",
        "check-reference": "Rebuild upstream reference exports (systemone.jsonl, bench.jsonl) with this engine and "
        "compare every prompt, token and probability against them (docs/operations.md, Reference exports).",
        "decide": "Answer one decision request (a JSON file, or standard input) on one model without a server and "
        "print the answer JSON; --timing adds where the time went (load, tokenize, pack, forward).",
        "facts": 'Print a state as the model reads it with facts: "auto": the facts block basal adds to the prompt.',
        "doctor": "Print the versions, backends and devices of this machine, then check bitwise batch invariance "
        "of every backend and dtype here (alone = batched = no prefix cache) on the demo model or --model.",
        "export": "Run a request file and write every result in the reference export format (JSONL), to compare "
        "machines, backends or versions with `basal compare` (docs/determinism.md section 5).",
        "compare": "Compare two exports (basal's or upstream's): tokens, letter logits, decisions and answers; "
        "exit status 1 when the comparison policy fails.",
        "bench": "Run benchmark suites with their baselines in the same run and write JSON and markdown tables "
        "(PNG charts with --plot); `make bench` runs all of them (bench/README.md).",
    }
    for name, text in described.items():
        sub.choices[name].description = text

    from basal.calibration.command import add_parsers

    add_parsers(sub)  # calibrate, eval
    return p


def main(argv: list[str] | None = None) -> int:
    from basal.ownership import conflict

    if problem := conflict():  # before anything else runs in a package another project wrote into
        print(f"basal: {problem}", file=sys.stderr)
        return 2
    from basal.core.errors import ModelDirError
    from basal.serve.config import ConfigError

    a = build_parser().parse_args(argv)
    from basal.observability.logs import configure

    configure("text", logging.DEBUG if a.verbose else logging.INFO)  # `basal serve` may switch to JSON
    try:
        return a.run(a)
    except (ModelDirError, ConfigError, ValueError) as e:
        print(f"basal {a.command}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a missing or unreadable file, a full disk: the message says which
        print(f"basal {a.command}: {e.strerror or e}{f': {e.filename}' if e.filename else ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"basal {a.command}: interrupted", file=sys.stderr)
        return 130
