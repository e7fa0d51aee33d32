"""`basal doctor`: what this machine can run, and a quick check that each path is bitwise batch-invariant here."""

from __future__ import annotations

import random
import time

import numpy as np

from basal.backends.load import DTYPES, load_backend_class, torch_installed
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from basal.core.model.prompt import Item, option_orders, render_prompt
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import TokenizedQuestion
from basal.progress import Progress
from basal.versions import versions


def paths() -> list[tuple[str, str]]:
    """(backend, device) pairs available here (none of torch's where only MLX is installed, as on a Mac)."""
    found = []
    if torch_installed():
        import torch

        found = [("torch", "cpu")]
        if torch.cuda.is_available():
            found.insert(0, ("torch", "cuda"))
    mlx = load_backend_class("mlx")
    if mlx is not None:
        found += [("mlx", d) for d in mlx.devices()]
    return found


def _questions(model: ModelDir, n: int = 6) -> list[TokenizedQuestion]:
    rng = random.Random(0)
    tok = model.tokenizer
    words = "order late damaged refund invoice zamówienie paczka zwrot żółw".split()
    out = []
    for i in range(n):
        lang = "pl" if i % 2 else "en"
        state = " ".join(rng.choice(words) for _ in range(rng.randint(3, 60)))
        k = rng.randint(2, 10)
        opts = [f"option {j} {rng.choice(words)}" for j in range(k)]
        out.append(
            TokenizedQuestion(
                lang,
                state,
                tuple(
                    tuple(tok.encode(render_prompt(state, "Which?", [opts[p] for p in perm], lang)))
                    for perm in option_orders(k)
                ),
            )
        )
    return out


def _evidence_questions(pipeline: Pipeline, n: int = 3) -> list[TokenizedQuestion]:
    """`n` questions that ask for evidence about one state: the first fills its state cache entry, the rest hit."""
    rng = random.Random(1)
    words = "order late damaged refund invoice parcel courier address".split()
    state = " ".join(rng.choice(words) for _ in range(40))
    items = [
        Item("q", "choice", ("a", "b", "c"), tuple(f"option {j} {rng.choice(words)}" for j in range(3)), "en", state,
             f"Which one, {i}?")
        for i in range(n)
    ]  # fmt: skip
    found: dict = {id(item): None for item in items}
    return pipeline.tokenize_items(items, found)


def _evidence_bits(results) -> list[bytes]:
    """Letter logits of every order and the evidence rows (the state tokens' hidden states), as bytes."""
    return [
        b"".join(np.asarray(o, dtype=np.float32).tobytes() for o in r) + np.asarray(r.states).tobytes() for r in results
    ]


def check(model: ModelDir, backend: str, device: str, dtype: str) -> tuple[bool, float, dict]:
    """Alone vs batched vs without the prefix cache, compared as bits. -> (invariant, seconds, backend facts)."""
    started = time.perf_counter()
    b = load_backend_class(backend).load(model, dtype=dtype, device=device)
    cached, plain = Pipeline(model, b), Pipeline(model, b, prefix_cache=False)
    qs = _questions(model)
    together = run_to_end(cached.letter_logits(qs))
    alone = [run_to_end(cached.letter_logits([q]))[0] for q in qs]
    uncached = run_to_end(plain.letter_logits(qs))

    def bits(logits):
        return [np.asarray(o, dtype=np.float32).tobytes() for q in logits for o in q]

    ok = bits(together) == bits(alone) == bits(uncached)
    facts = b.describe()
    if b.caches_states:  # the state cache: a miss, then a hit, each equal to the question alone without it
        states = Pipeline(model, b, state_cache_mb=64)
        assert states.state_cache is not None
        miss = [run_to_end(states.letter_logits([q]))[0] for q in qs]
        hit = [run_to_end(states.letter_logits([q]))[0] for q in qs]
        ok = ok and bits(miss) == bits(hit) == bits(alone)
        cache = states.state_cache
        per_token = cache.bytes / max(1, cache.tokens)
        evidence = ""
        if states.serves_evidence:  # evidence: the entry keeps its state rows' hidden states too
            asked = _evidence_questions(cached)
            off = _evidence_bits(run_to_end(cached.letter_logits([q]))[0] for q in asked)
            on = _evidence_bits(run_to_end(states.letter_logits([q]))[0] for q in asked)
            ok = ok and on == off
            evidence = "; evidence questions too"
        facts["state_cache"] = (
            f"miss = hit = off, bitwise ({cache.counts.hits} hits, {cache.counts.misses} misses{evidence}); "
            f"{cache.entries} entries hold {cache.bytes} bytes (~{per_token:.0f} per token)"
        )
        cache.clear()
    else:
        facts["state_cache"] = "not used on this path (state_cache_mb is ignored)"
    return ok, time.perf_counter() - started, facts


def chunk_lines(facts: dict) -> list[str]:
    """The GEMM row-chunk sizes (and column blocks) per weight shape (torch backend), one line each."""
    chunks = facts.get("gemm_chunks")
    if not isinstance(chunks, dict):
        return [f"    GEMM row chunks: {chunks}"] if chunks else []
    out = []
    for shape, p in chunks.items():
        tails = f"tails {p['tails'][0]}-{p['tails'][-1]}" if len(p["tails"]) > 1 else "no other sizes"
        same = "bits of the 64-row reference" if p["reference_bits"] else "bits DIFFER from the 64-row reference"
        cols = f" in {p['cols']}-column blocks" if p.get("cols") else ""
        out.append(f"    GEMM {shape:<22} {p['rows']:>4} rows{cols} ({tails}; {same})")
    return out


def gpu_gemm_tables() -> list[str]:
    """The GEMM tables the GPU path probed on this machine, and whether they match the running versions."""
    if not torch_installed():
        return []
    import torch

    from basal.backends.cuda.gpu import gemm_table as gt
    from basal.backends.cuda.gpu.environment import device_stack

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lines = []
    for dtype in DTYPES:
        path = gt.table_path(dtype)
        if path.is_file():
            lines += gt.describe(*gt.load_table(path, gt.table_key(device_stack(device), dtype)))
    return lines or ["  GEMM tables: none yet (the GPU path writes one at its first start on a GPU)"]


def cuda_line() -> str:
    """The CUDA device, and which torch path would serve on it: the GPU path needs Triton (Linux)."""
    if not torch_installed():
        return "CUDA: torch is not installed (pip install 'basal-bitwise[cuda]' on NVIDIA)"
    import torch

    from basal.backends.cuda.backend import NO_TRITON, gpu_path_installed

    if not torch.cuda.is_available():
        return "CUDA: not available"
    device = torch.cuda.get_device_name(0)
    if not gpu_path_installed():
        return f"CUDA: available: {device}; Triton is not installed, so {NO_TRITON}"
    return f"CUDA: available: {device}; the GPU path serves (Triton kernels, docs/gpu-path.md)"


def report(model: ModelDir | None, run_checks: bool, show_progress: bool = True) -> str:
    """The whole report (stdout's); while the checks run, `basal.progress` shows which one on standard error."""
    lines = ["versions:"] + [f"  {k:<12} {v}" for k, v in versions().items()]
    lines.append("backends:")
    for backend, device in paths():
        lines.append(f"  {backend:<6} {device:<6} dtypes {', '.join(DTYPES)}")
    try:
        import mlx.core as mx

        lines.append(f"Metal: {'available' if mx.metal.is_available() else 'not available (MLX runs on the CPU)'}")
    except ImportError:
        lines.append("Metal: MLX is not installed")
    lines.append(cuda_line())
    lines += gpu_gemm_tables()
    if torch_installed():
        from basal.backends.cuda.cpu import cpu_kernels

        lines.append(f"compiled CPU kernels (torch CPU attention and SwiGLU): {cpu_kernels.status()}")
    if run_checks and model is not None:
        lines.append(
            f"batch invariance on this hardware ({model.name}; alone = batched = no prefix cache = state cache "
            "miss and hit, bitwise):"
        )
        checks = [(backend, device, dtype) for backend, device in paths() for dtype in DTYPES]
        with Progress("doctor: checking", len(checks), enabled=show_progress) as shown:
            for backend, device, dtype in checks:
                with shown.step(f"{backend}-{device}-{dtype} (load, alone, batched, no prefix cache)"):
                    ok, seconds, facts = check(model, backend, device, dtype)
                verdict = "verified" if ok else "NOT INVARIANT"
                lines.append(f"  {f'{backend}-{device}-{dtype}':<16} {verdict} ({seconds:.1f} s)")
                lines += chunk_lines(facts)
                lines.append(f"    state cache: {facts['state_cache']}")
                if "attention_gemm_rows" in facts:
                    lines.append(f"    attention tile GEMMs: {facts['attention_gemm_rows']}")
                if "gemm_kernels" in facts:  # the GPU path
                    gemms = ", ".join(f"{shape} {name}" for shape, name in facts["gemm_kernels"].items())
                    lines.append(f"    GEMMs: {gemms}; attention {facts['attention']}; {facts['cuda_graphs']}")
    return "\n".join(lines)
