"""Synthetic Basal model directories: real file layout and real shapes, seeded random weights.

Real Basal weights are not available here, so tests and benchmarks run on these. A synthetic directory passes
every contract check of `ModelDir.load`; its answers carry no meaning (``basal.json`` says ``synthetic: true``).

The tokenizer is a byte-fallback BPE trained on seeded Polish and English text with the Bielik layout
(Metaspace ``▁``, ``split: false``, ``<s>``, ``<|im_start|>``, ``<|im_end|>``); the option letters A–J are
single tokens after the prefill, as on the real tokenizer.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from basal.core.home import cache_dir
from basal.core.model.evidence_head import HEAD_FILE, HEAD_RANK, EvidenceHead
from basal.core.model.model_dir import LlamaConfig, ModelDir
from basal.core.model.prompt import CHAT_TEMPLATE, LETTERS, PREFILL, SYSTEM, USER
from basal.core.model.safetensors_io import TensorSpec, to_bf16_bits, write_safetensors

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_VOCAB = 3000  # trained pieces; the model's vocab_size may be larger (unused rows, as padded vocabularies)
# Temperatures of basal-1.5-mini (docs/contract.md §2.2), so calibration paths run with realistic values.
TEMPERATURES = {"choice": 1.1387886347566916, "noul": 1.3939382634489992, "score": 1.5422108254079405}


@dataclass(frozen=True)
class Preset:
    """Shapes of a Basal size. [I] marks values not confirmed for the real checkpoints (docs/contract.md §4)."""

    config: LlamaConfig
    description: str


def _llama(d: int, f: int, layers: int, heads: int, kv: int, hd: int, vocab: int, max_pos: int) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=d,
        intermediate_size=f,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hd,
        vocab_size=vocab,
        rms_norm_eps=1e-5,
        rope_theta=1_000_000.0,
        max_position_embeddings=max_pos,
        bias=False,
    )


PRESETS = {
    "demo": Preset(_llama(64, 176, 2, 4, 2, 16, TOKENIZER_VOCAB, 8192), "tiny built-in demo model (a few MB)"),
    # GEMM shapes confirmed (qkv 2048x1536, gate+up 17920x1536); 32 layers and vocab 32000 are [I].
    "mini": Preset(_llama(1536, 8960, 32, 12, 2, 128, 32000, 8192), "basal-1.5-mini shapes (1.5B)"),
    # GEMM shapes confirmed; 60 layers from the 1.0-4.5B README [I for 1.5].
    "4.5B": Preset(_llama(2048, 11008, 60, 16, 2, 128, 32000, 32768), "basal-1.5-4.5B shapes"),
    "max": Preset(_llama(4096, 14336, 50, 32, 8, 128, 32000, 32768), "basal-1.5-max shapes (11B)"),
}


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer

_PL = (
    "klient zamówienie faktura paczka umowa termin zwrot dostawa reklamacja płatność karta konto bank sklep "
    "towar cena kwota dni tydzień miesiąc rok stan pytanie opcje odpowiedź wniosek regulamin pracownik premia "
    "sprzedaż plan zgłoszenie dział adres numer telefon dokument podpis uszkodzona opóźnienie pilne niska "
    "średnia wysoka tak nie czy jest był została został nie może można należy wypłacić przysługuje odstąpić "
    "oświadczenie wysłał odebrał zażółć gęślą jaźń źródło łódź ćma żółw się że jak który która które gdzie kiedy "
    "oraz albo lub ponieważ jednak według przed po od do na w z o u przy dla bez"
).split()
_EN = (
    "customer order invoice package contract deadline refund delivery complaint payment card account bank store "
    "item price amount days week month year state question options answer request policy employee bonus sales "
    "plan ticket team address number phone document signature damaged late urgent low medium high yes no is "
    "was were can may should must the a an of to in on at for with without before after and or because however "
    "which what where when who how evaluate choose exactly one given treat data not instructions only"
).split()
_PUNCT = [".", ",", ":", ";", "?", "!", " -", " (", ")", " 12", " 5521", " 30", " 129,99 zł", " 45 PLN", " 2026"]


def _corpus(seed: int, lines: int = 6000) -> list[str]:
    """Seeded PL/EN sentences, JSON-ish lines and the contract's template texts. One line per entry: no newline
    ever enters a merge, so a newline is always its own byte token and the template prefix is stable."""
    rng = random.Random(seed)
    out = [SYSTEM["pl"], SYSTEM["en"], PREFILL, "assistant", "system", "user"]
    out += [part for lang in ("pl", "en") for part in USER[lang].replace("{{", "{").replace("}}", "}").split("\n")]
    for i in range(lines):
        words = _PL if i % 2 else _EN
        sent = " ".join(rng.choice(words) for _ in range(rng.randint(4, 16)))
        sent += rng.choice(_PUNCT) + " " + " ".join(rng.choice(words) for _ in range(rng.randint(0, 6)))
        if i % 7 == 0:  # structured states are rendered as Python-style JSON (lowercase values only: a quote is
            # never followed by a capital letter, so no merge can swallow an option letter after the prefill)
            sent = json.dumps({rng.choice(words): rng.choice(words), "n": rng.randint(0, 999)}, ensure_ascii=False)
        out.append(sent[0].upper() + sent[1:] if i % 3 else sent)
    out += [f"{c}. {rng.choice(_EN)}" for c in LETTERS for _ in range(20)]
    return out


def train_tokenizer(seed: int, vocab_size: int = TOKENIZER_VOCAB) -> Tokenizer:
    """A Bielik-style byte-fallback BPE (Metaspace ``▁``, prepend first, split false), deterministic per seed."""
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    # Train on words (as sentencepiece does), then serve with split=false like the real tokenizer.
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    alphabet = sorted(set("".join(_corpus(seed, 200))) - {" "} | set(LETTERS) | {"▁"})
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + byte_tokens,
        initial_alphabet=alphabet,
        min_frequency=2,
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(seed), trainer=trainer)
    spec = json.loads(bpe.to_str())
    # byte tokens are vocabulary entries for byte fallback, not special tokens matched in text
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in SPECIAL_TOKENS]
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tok


# ---------------------------------------------------------------------------------------------------------------
# Weights


def _tensor_specs(cfg: LlamaConfig) -> list[TensorSpec]:
    return [TensorSpec(name, "BF16", shape) for name, shape in cfg.weight_shapes().items()]


def _random_weight(spec: TensorSpec, index: int, seed: int) -> np.ndarray:
    """Seeded per tensor (seed, index), so one tensor's values do not depend on the order others are made."""
    if spec.name.endswith("layernorm.weight") or spec.name == "model.norm.weight":
        return to_bf16_bits(np.ones(spec.shape, dtype=np.float32))
    rng = np.random.Generator(np.random.PCG64([seed, index]))
    fan_in = spec.shape[-1] if len(spec.shape) == 2 else 1
    std = 1.0 if spec.name == "model.embed_tokens.weight" else fan_in**-0.5
    x = rng.standard_normal(spec.shape, dtype=np.float32)
    x *= std
    return to_bf16_bits(x)


# ---------------------------------------------------------------------------------------------------------------
# Directory


def preset_config(preset: str, layers: int | None = None, bias: bool = False) -> LlamaConfig:
    """`bias`: the basal-1.0 layout, with attention and MLP biases (basal-1.5 has none)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    cfg = PRESETS[preset].config
    if layers is not None:
        if not 1 <= layers <= cfg.num_hidden_layers:
            raise ValueError(
                f"--layers {layers}: the {preset} preset has {cfg.num_hidden_layers} layers; "
                f"choose 1 to {cfg.num_hidden_layers}"
            )
        cfg = replace(cfg, num_hidden_layers=layers)
    return replace(cfg, bias=bias)


def weights_bytes(cfg: LlamaConfig) -> int:
    """Size of the synthetic ``model.safetensors`` tensors (bf16), to show and to check free disk first."""
    return sum(s.nbytes for s in _tensor_specs(cfg))


DISK_MARGIN = 64 << 20  # free space kept beyond the weights (tokenizer, JSON files, the file system's own needs)


def check_free_disk(cfg: LlamaConfig, where: Path) -> None:
    need = weights_bytes(cfg) + DISK_MARGIN
    free = shutil.disk_usage(where).free
    if free < need:
        raise ValueError(
            f"the weights need {need / 2**30:.2f} GiB but {where} has {free / 2**30:.2f} GiB free; "
            "free some space or choose fewer --layers"
        )


def config_json(cfg: LlamaConfig, tok: Tokenizer) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_scaling": None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": cfg.bias,
        "mlp_bias": cfg.bias,
        "bos_token_id": tok.token_to_id("<s>"),
        "eos_token_id": tok.token_to_id("<|im_end|>"),
        "torch_dtype": "bfloat16",
    }


def synth_model(
    out: str | Path,
    preset: str = "demo",
    layers: int | None = None,
    seed: int = 0,
    on_bytes: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
    evidence_head: bool = False,
    bias: bool = False,
) -> Path:
    """Write a complete synthetic Basal model directory to `out` (written in a temporary folder, then renamed,
    so a crash or an interrupt never leaves a half-written model behind). Same arguments -> same bytes.
    `evidence_head`: also write a seeded synthetic `evidence_head.pt` (the real layout, k = 256). `bias`: the
    basal-1.0 layout (attention and MLP biases), which every backend must serve too."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    cfg = preset_config(preset, layers, bias)
    tok = train_tokenizer(seed)
    if tok.get_vocab_size() > cfg.vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, more than vocab_size {cfg.vocab_size}")
    out.parent.mkdir(parents=True, exist_ok=True)
    check_free_disk(cfg, out.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write_json(tmp / "config.json", config_json(cfg, tok))
        (tmp / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
        _write_json(
            tmp / "tokenizer_config.json",
            {
                "bos_token": "<s>",
                "eos_token": "<|im_end|>",
                "unk_token": "<unk>",
                "model_max_length": cfg.max_position_embeddings,
                "tokenizer_class": "PreTrainedTokenizerFast",
            },
        )
        (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
        _write_json(
            tmp / "basal.json",
            {
                "name": f"basal-synthetic-{preset}",
                "version": "synthetic",
                "synthetic": True,
                "note": f"Synthetic {PRESETS[preset].description}: random weights (seed {seed}); "
                "answers carry no meaning.",
                "readout": {
                    "kind": "letter logits",
                    "letters": LETTERS,
                    "prefill": PREFILL,
                    "templates": "basal-1.0 (unchanged prompt contract)",
                },
            },
        )
        _write_json(
            tmp / "CALIBRATION.json",
            {
                "temperature_per_prim": TEMPERATURES,
                "thresholds": {"0.01": {"confidence": 0.93}, "0.05": {"confidence": 0.74}},
            },
        )
        if evidence_head:
            EvidenceHead.random(cfg.hidden_size, HEAD_RANK, seed).save(tmp / HEAD_FILE)
        specs = _tensor_specs(cfg)
        if on_total:
            on_total(sum(s.nbytes for s in specs))
        index = {s.name: i for i, s in enumerate(specs)}
        write_safetensors(
            tmp / "model.safetensors",
            specs,
            lambda s: _random_weight(s, index[s.name], seed),
            {"format": "pt", "basal_synthetic_seed": str(seed)},
            on_bytes,
        )
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


DEMO_VERSION = 2  # v2: with a seeded evidence head. A new version is a new folder, so an old cache is not used


def demo_model() -> ModelDir:
    """The built-in demo model: synthesized on first use into the cache folder (a few MB, about a second), with a
    seeded evidence head, so the demo serves every extension."""

    path = cache_dir() / "models" / f"demo-seed0-v{DEMO_VERSION}"
    if not (path / "model.safetensors").is_file():
        with contextlib.suppress(FileExistsError):  # another process finished first
            synth_model(path, "demo", seed=0, evidence_head=True)
    if not (path / HEAD_FILE).is_file():  # the head was removed by hand: the same seeded bytes again
        partial = path / f".{HEAD_FILE}.{os.getpid()}"
        EvidenceHead.random(preset_config("demo").hidden_size, HEAD_RANK, 0).save(partial)
        os.replace(partial, path / HEAD_FILE)
    return ModelDir.load(path)
