"""basal against llama.cpp (llama-cpp-python) on the CPU: the same synthetic weights converted to GGUF, the same
prompts (basal's tokenization, fed to llama.cpp as token ids), the decision read from the letter-token logits after
each prompt. Not a dependency of basal: `pip install llama-cpp-python gguf` first (from source where no wheel fits).

    python -m bench.compare.llama_cpp                      # mini shapes cut to 2 layers; f32 and f16 GGUF
    python -m bench.compare.llama_cpp --layers 4 --reps 3
    python -m bench.compare.llama_cpp --gguf f32 --max-questions 5 --reps 1   # quicker

llama.cpp runs each prompt the way its server does with `cache_prompt`: the KV cache keeps the previous prompt, and
only the tokens after the common prefix are evaluated (a question's option orders and every question on one state
share the state). Its logits are also taken "alone" (a fresh cache, the whole prompt in one batch) to say whether
they are identical to the cached, shorter batches (llama.cpp does not promise that; basal does). basal runs the
same requests in-process (`Pipeline.decide`, f32). Reported: seconds per decision and decisions/s of each, same
run, alternating; agreement of the per-prompt argmax letter between llama.cpp and basal's letter logits.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from basal.backends.cuda.cpu.gemm_chunks import _cpu_model
from basal.benchsuite.workloads import questions, state_of_tokens
from bench.lab.cpu_speed import cpu_flags

WORKLOADS = (  # (label, questions, state tokens, language, seed)
    ("1 question, ~500-token state", 1, 500, "en", 1),
    ("5 questions, ~500-token state", 5, 500, "pl", 2),
    ("25 questions, one ~700-token state", 25, 700, "pl", 7),
)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's rotate-half q/k rows -> llama.cpp's interleaved RoPE layout (as convert_hf_to_gguf.py)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_gguf(model_dir: Path, out: Path, dtype: str) -> Path:
    """Write the checkpoint as a llama-architecture GGUF: f32, or f16 matrices (norms stay f32, as llama.cpp's
    converter keeps them). The vocabulary is the tokenizer's tokens with a plain SPM header: prompts are fed as token
    ids, so llama.cpp's own tokenizer is never used."""
    import gguf
    from safetensors.torch import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    vocab = json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    tensors = {k: v.float().numpy() for k, v in load_file(model_dir / "model.safetensors").items()}
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("basal-synthetic")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(float(cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    tokens = [""] * cfg["vocab_size"]
    for tok, i in vocab.items():
        tokens[i] = tok
    for i, t in enumerate(tokens):
        tokens[i] = t or f"<unused{i}>"
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    w.add_bos_token_id(cfg.get("bos_token_id") or 1)
    w.add_eos_token_id(cfg.get("eos_token_id") or 2)
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }

    def add(name: str, x: np.ndarray) -> None:
        x = np.ascontiguousarray(x, dtype=np.float32 if dtype == "f32" or x.ndim == 1 else np.float16)
        w.add_tensor(name, x)

    add("token_embd.weight", tensors["model.embed_tokens.weight"])
    add("output_norm.weight", tensors["model.norm.weight"])
    add("output.weight", tensors["lm_head.weight"])
    for i in range(cfg["num_hidden_layers"]):
        for hf, ll in names.items():
            x = tensors[f"model.layers.{i}.{hf}.weight"]
            if hf == "self_attn.q_proj":
                x = _permute(x, heads)
            elif hf == "self_attn.k_proj":
                x = _permute(x, kv_heads)
            add(f"blk.{i}.{ll}.weight", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


class LlamaCpp:
    """One llama.cpp context scoring prompts by their last-position logits, reusing the KV cache of the common
    prefix with the previous prompt (`reuse=False`: a fresh evaluation of every prompt)."""

    def __init__(self, gguf_path: Path, threads: int, n_ctx: int = 4096):
        import llama_cpp

        self.llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(
            str(gguf_path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=512, n_threads=threads, n_threads_batch=threads,
            logits_all=False, verbose=False,
        )  # fmt: skip
        self.previous: list[int] = []

    def letter_logits(self, prompt: list[int], letter_ids: list[int], reuse: bool = True) -> np.ndarray:
        common = 0
        if reuse:
            limit = min(len(prompt) - 1, len(self.previous))  # at least the last token is evaluated
            while common < limit and prompt[common] == self.previous[common]:
                common += 1
        self.llm.n_tokens = common  # eval() drops the cache past n_tokens, then evaluates the rest
        self.llm.eval(prompt[common:])
        self.previous = list(prompt)
        # without logits_all, eval() keeps no scores: read the last position's row from the context
        row = self.llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(row, shape=(self.llm.n_vocab(),))[letter_ids].astype(np.float32)


def main() -> None:
    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.pipeline import Pipeline
    from basal.core.model.model_dir import ModelDir
    from basal.core.model.synth import synth_model
    from basal.core.packing.passes import run_to_end
    from basal.core.request.dialects import parse_systemone

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="alternating timed rounds (after a warm-up)")
    ap.add_argument("--gguf", nargs="+", default=["f32", "f16"], choices=["f32", "f16"])
    ap.add_argument("--max-questions", type=int, default=None, help="only the workloads with at most this many")
    ap.add_argument("--out", default="bench/results/llama_cpp.json")
    a = ap.parse_args()
    import llama_cpp

    threads = torch.get_num_threads()
    rows, identical = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        path = synth_model(Path(tmp) / "mini", "mini", layers=a.layers)
        model = ModelDir.load(path)
        pipeline = Pipeline(model, TorchBackend.load(model, dtype="f32"))
        letter_ids = list(pipeline.letter_ids)
        engines = {dt: LlamaCpp(to_gguf(path, Path(tmp) / f"mini-{dt}.gguf", dt), threads) for dt in a.gguf}
        for label, n_q, tokens, lang, seed in WORKLOADS:
            if a.max_questions is not None and n_q > a.max_questions:
                continue
            body = {
                "model": "m",
                "state": state_of_tokens(model.tokenizer, tokens, lang, seed),
                "questions": questions(n_q, lang, seed),
            }
            request = parse_systemone(body, lambda m: m)
            tokenized = pipeline.tokenize(request.questions)
            prompts = [list(p) for t in tokenized for p in t.prompts]
            basal_logits = [o for q in run_to_end(pipeline.letter_logits(tokenized)) for o in q]
            times: dict[str, list[float]] = {"basal": [], **{f"llama.cpp {dt}": [] for dt in engines}}
            agree, alone_same = {}, {}
            for dt, eng in engines.items():  # warm-up, agreement and alone-vs-cached bits
                eng.previous = []
                cached = [eng.letter_logits(p, letter_ids) for p in prompts]
                alone = [eng.letter_logits(p, letter_ids, reuse=False) for p in prompts]
                alone_same[dt] = sum(c.tobytes() == s.tobytes() for c, s in zip(cached, alone, strict=True))
                agree[dt] = sum(
                    int(np.argmax(c[: len(b)])) == int(np.argmax(b)) for c, b in zip(cached, basal_logits, strict=True)
                )
            pipeline.decide(request)
            for _ in range(a.reps):
                t = time.perf_counter()
                pipeline.decide(request)
                times["basal"].append(time.perf_counter() - t)
                for dt, eng in engines.items():
                    eng.previous = []  # a new request: nothing cached from the previous round
                    t = time.perf_counter()
                    for p in prompts:
                        eng.letter_logits(p, letter_ids)
                    times[f"llama.cpp {dt}"].append(time.perf_counter() - t)
            row = {
                "workload": label,
                "questions": n_q,
                "prompts": len(prompts),
                "prompt_tokens": sum(map(len, prompts)),
                "seconds": times,
                "argmax_agrees_with_basal": agree,
                "llama_cpp_cached_equals_alone": alone_same,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            identical.update({dt: identical.get(dt, 0) + alone_same[dt] for dt in engines})
    out = {
        "machine": {
            "platform": platform.platform(),
            "cpu": _cpu_model(),
            "flags": cpu_flags(),
            "cpus": os.cpu_count(),
            "threads": threads,
            "load_average": os.getloadavg(),
        },
        "torch": torch.__version__,
        "llama_cpp_python": llama_cpp.__version__,
        "model": {"preset": "mini", "layers": a.layers, "basal_dtype": "f32", "gguf": a.gguf},
        "rows": rows,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    print(
        f"\nmini cut to {a.layers} layers, {threads} threads, llama-cpp-python {llama_cpp.__version__}, "
        f"median of {a.reps} rounds, load average {os.getloadavg()[0]:.1f}\n"
    )
    print(
        "| workload | prompts | engine | s per decision | decisions/s | speed vs basal | argmax = basal "
        "| cached = alone |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        base = statistics.median(r["seconds"]["basal"])
        for engine, secs in r["seconds"].items():
            s = statistics.median(secs)
            dt = engine.removeprefix("llama.cpp ")
            extra = (
                f"{r['argmax_agrees_with_basal'][dt]}/{r['prompts']} | {r['llama_cpp_cached_equals_alone'][dt]}/"
                f"{r['prompts']}"
                if engine != "basal"
                else "— | —"
            )
            print(
                f"| {r['workload']} | {r['prompts']} | {engine} | {s / r['questions']:.3f} | "
                f"{r['questions'] / s:.2f} | {base / s:.2f}x | {extra} |"
            )


if __name__ == "__main__":
    main()
