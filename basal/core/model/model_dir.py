"""A Basal model directory: load it, check it against the contract, open its weights lazily.

Files (docs/contract.md §4): ``config.json`` (Llama), ``basal.json`` (readout contract), ``chat_template.jinja``,
``tokenizer.json`` + ``tokenizer_config.json``, ``CALIBRATION.json`` (optional: without it T = 1),
``model.safetensors`` or ``model.safetensors.index.json`` with shards. Anything else is refused with a message
that says what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from basal.core.errors import ModelDirError
from basal.core.model.evidence_head import EvidenceHead, load_head
from basal.core.model.prompt import CHAT_TEMPLATE, LETTERS, PREFILL, SYSTEM, USER
from basal.core.model.safetensors_io import SafetensorsFile
from basal.core.model.tokenizer import Tokenizer
from basal.core.model.torch_file import TorchFileError

log = logging.getLogger(__name__)

TEMPLATES_1_5 = "basal-1.0 (unchanged prompt contract)"
QUESTION_TYPES = ("choice", "noul", "score")


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    bias: bool  # basal-1.0 has attention and MLP biases, basal-1.5 has none

    @classmethod
    def from_json(cls, cfg: dict[str, Any], where: str = "config.json") -> LlamaConfig:
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise ModelDirError(f"{where}: {what}; basal serves Llama-format Basal checkpoints only")

        need(cfg.get("model_type") == "llama", f"model_type is {cfg.get('model_type')!r}, not 'llama'")
        need(
            cfg.get("architectures") in (None, ["LlamaForCausalLM"]),
            f"architectures is {cfg.get('architectures')!r}, not ['LlamaForCausalLM']",
        )
        need(cfg.get("hidden_act", "silu") == "silu", f"hidden_act is {cfg.get('hidden_act')!r}, not 'silu'")
        need(not cfg.get("tie_word_embeddings", False), "tie_word_embeddings is true")
        need(cfg.get("pretraining_tp", 1) == 1, "pretraining_tp is not 1")
        need(cfg.get("rope_scaling") is None, "rope_scaling is set (only default RoPE is supported)")
        rope = cfg.get("rope_parameters")
        need(
            isinstance(rope, dict) and "rope_theta" in rope,
            "rope_theta must be given inside rope_parameters (transformers 5 layout); a top-level value or the "
            "default 10000 would give wrong positions",
        )
        need(rope.get("rope_type", "default") == "default", f"rope_type is {rope.get('rope_type')!r}, not 'default'")
        attention_bias, mlp_bias = bool(cfg.get("attention_bias", False)), bool(cfg.get("mlp_bias", False))
        need(attention_bias == mlp_bias, "attention_bias and mlp_bias differ")
        try:
            heads = int(cfg["num_attention_heads"])
            return cls(
                hidden_size=int(cfg["hidden_size"]),
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads", heads)),
                head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
                vocab_size=int(cfg["vocab_size"]),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(rope["rope_theta"]),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 8192)),
                bias=attention_bias,
            )
        except KeyError as e:
            raise ModelDirError(f"{where}: missing key {e}") from e

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every checkpoint tensor (Hugging Face names) and its shape."""
        d, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, d)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            layer = {
                "input_layernorm.weight": (d,),
                "self_attn.q_proj.weight": (q, d),
                "self_attn.k_proj.weight": (kv, d),
                "self_attn.v_proj.weight": (kv, d),
                "self_attn.o_proj.weight": (d, q),
                "post_attention_layernorm.weight": (d,),
                "mlp.gate_proj.weight": (f, d),
                "mlp.up_proj.weight": (f, d),
                "mlp.down_proj.weight": (d, f),
            }
            if self.bias:
                layer |= {
                    "self_attn.q_proj.bias": (q,),
                    "self_attn.k_proj.bias": (kv,),
                    "self_attn.v_proj.bias": (kv,),
                    "self_attn.o_proj.bias": (d,),
                    "mlp.gate_proj.bias": (f,),
                    "mlp.up_proj.bias": (f,),
                    "mlp.down_proj.bias": (d,),
                }
            shapes |= {p + k: v for k, v in layer.items()}
        shapes |= {"model.norm.weight": (d,), "lm_head.weight": (self.vocab_size, d)}
        return shapes

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(s)) for s in self.weight_shapes().values())


@dataclass(frozen=True)
class Calibration:
    temperatures: dict[str, float] = field(default_factory=dict)
    thresholds: dict[str, Any] = field(default_factory=dict)
    path: str = ""  # the file it was read from ("": none, T = 1)
    sha256: str = ""  # of that file's bytes: the calibration's identity (answers depend on it; caches key on it)
    provenance: dict[str, Any] | None = None  # what `basal calibrate` recorded (None: a shipped file)

    @property
    def kind(self) -> str:
        """shipped (CALIBRATION.json), custom (written by `basal calibrate`) or none."""
        if not self.path:
            return "none"
        return "custom" if self.provenance is not None else "shipped"

    def temperature(self, question_type: str) -> float:
        """T of a question type; 1 for an unknown type or a model without calibration."""
        return float(self.temperatures.get(question_type, 1.0))


@dataclass(frozen=True)
class ModelDir:
    path: Path
    name: str
    version: str
    config: LlamaConfig
    calibration: Calibration
    bos: str
    weight_files: tuple[Path, ...]
    synthetic: bool  # written by `basal synth-model`: answers carry no meaning

    @classmethod
    def load(cls, path: str | Path) -> ModelDir:
        root = Path(path).expanduser()
        if not root.is_dir():
            raise ModelDirError(f"{root}: no such model directory")
        config = LlamaConfig.from_json(_read_json(root / "config.json"), str(root / "config.json"))
        basal = _read_json(root / "basal.json")
        _check_readout(basal, root / "basal.json")
        _check_chat_template(root / "chat_template.jinja")
        tok_cfg = _read_json(root / "tokenizer_config.json")
        bos = tok_cfg.get("bos_token", "<s>")
        bos = bos.get("content") if isinstance(bos, dict) else bos
        if not isinstance(bos, str) or not bos:
            raise ModelDirError(f"{root / 'tokenizer_config.json'}: bos_token is missing")
        if not (root / "tokenizer.json").is_file():
            raise ModelDirError(f"{root}: tokenizer.json is missing")
        calibration = _read_calibration(root / "CALIBRATION.json")
        files = _weight_files(root)
        return cls(
            root,
            str(basal.get("name") or root.name),
            str(basal.get("version", "")),
            config,
            calibration,
            bos,
            files,
            bool(basal.get("synthetic", False)),
        )

    @cached_property
    def evidence_head(self) -> EvidenceHead | None:
        """The pointer head of `evidence: true` (``evidence_head.pt``), read once; None: the model has none."""

        try:
            return load_head(self.path, self.config.hidden_size)
        except TorchFileError as e:
            raise ModelDirError(f"{e} (remove the file to serve the model without evidence)") from e

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer(self.path / "tokenizer.json", self.bos)

    def open_weights(self) -> dict[str, tuple[SafetensorsFile, str]]:
        """Tensor name -> (file, name). Files are memory-mapped when a tensor is first read; nothing is copied."""
        index: dict[str, tuple[SafetensorsFile, str]] = {}
        for path in self.weight_files:
            f = SafetensorsFile(path)
            index |= {name: (f, name) for name in f.tensors}
        expected = self.config.weight_shapes()
        missing = sorted(set(expected) - set(index))
        if missing:
            raise ModelDirError(
                f"{self.path}: weights missing from the checkpoint: {', '.join(missing[:5])}"
                + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            )
        for name, shape in expected.items():
            f, _ = index[name]
            if f.tensors[name].shape != shape:
                raise ModelDirError(
                    f"{name}: shape {f.tensors[name].shape} in the checkpoint, config.json implies {shape}"
                )
        return index


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ModelDirError(f"{path.name} is missing in {path.parent}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelDirError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ModelDirError(f"{path}: expected a JSON object")
    return data


def _check_readout(basal: dict[str, Any], where: Path) -> None:
    readout = basal.get("readout")
    if not isinstance(readout, dict):
        raise ModelDirError(f"{where}: no 'readout' contract; this is not a Basal model directory")
    problems = []
    if readout.get("kind") != "letter logits":
        problems.append(f"readout.kind is {readout.get('kind')!r}, not 'letter logits'")
    if readout.get("letters") != LETTERS:
        problems.append(f"readout.letters is {readout.get('letters')!r}, not {LETTERS!r}")
    if readout.get("prefill") != PREFILL:
        problems.append(f"readout.prefill is {readout.get('prefill')!r}, not {PREFILL!r}")
    templates = readout.get("templates")
    expected = {lang: {"system": SYSTEM[lang], "user": USER[lang]} for lang in ("pl", "en")}
    if templates != TEMPLATES_1_5 and templates != expected:
        problems.append("readout.templates differ from the Basal prompt contract")
    if problems:
        raise ModelDirError(
            f"{where}: another prompt contract ({'; '.join(problems)}); basal implements the Basal "
            "1.0/1.5 letter-readout contract only"
        )


def _check_chat_template(path: Path) -> None:
    if not path.is_file():
        raise ModelDirError(f"chat_template.jinja is missing in {path.parent}")
    text = path.read_text(encoding="utf-8")
    if text.removesuffix("\n") != CHAT_TEMPLATE:
        raise ModelDirError(
            f"{path}: the chat template differs from the Basal contract; prompts would not match "
            "what the model was trained on"
        )


def _read_calibration(path: Path) -> Calibration:
    if not path.is_file():
        log.warning("%s is missing: answers are not calibrated (T = 1 for every question type)", path)
        return Calibration()
    return read_calibration(path)


def read_calibration(path: Path) -> Calibration:
    """A calibration file (CALIBRATION.json, or one `basal calibrate` wrote), checked; ModelDirError otherwise."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ModelDirError(f"{path}: the calibration file cannot be read ({e.strerror or e})") from e
    data = _read_json(path)
    temps = data.get("temperature_per_prim") or {}
    if not isinstance(temps, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in temps.values()
    ):
        raise ModelDirError(f"{path}: temperature_per_prim must map question types to positive numbers")
    thresholds = data.get("thresholds") or {}
    if not isinstance(thresholds, dict):
        raise ModelDirError(f'{path}: thresholds must map target errors to {{"confidence": number}}')
    provenance = data.get("provenance")
    if provenance is not None and not isinstance(provenance, dict):
        raise ModelDirError(f"{path}: provenance must be an object")
    return Calibration(
        {k: float(v) for k, v in temps.items()},
        thresholds,
        str(path),
        hashlib.sha256(raw).hexdigest(),
        provenance,
    )


CUSTOM_CALIBRATION = "CALIBRATION.custom.json"


def served_calibration(root: Path, configured: str | None = None) -> Calibration:
    """The calibration a server serves for the model in `root`: the configured file, else CALIBRATION.custom.json
    beside the model (written by `basal calibrate`), else the shipped CALIBRATION.json (else none: T = 1). Read
    afresh each time, so a reload sees a changed file."""
    if configured:
        return read_calibration(Path(configured).expanduser())
    if (root / CUSTOM_CALIBRATION).is_file():
        return read_calibration(root / CUSTOM_CALIBRATION)
    return _read_calibration(root / "CALIBRATION.json")


def _weight_files(root: Path) -> tuple[Path, ...]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map") or {}
        files = tuple(root / f for f in dict.fromkeys(weight_map.values()))
    elif (root / "model.safetensors").is_file():
        files = (root / "model.safetensors",)
    else:
        raise ModelDirError(f"{root}: no model.safetensors (or model.safetensors.index.json)")
    for f in files:
        if not f.is_file():
            raise ModelDirError(f"{f}: weight file listed in the index is missing")
    return files
