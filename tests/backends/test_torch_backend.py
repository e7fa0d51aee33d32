"""The torch backend's contract: dtypes, defaults, selection, the last-layer shortcut, and answers end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from basal.backends.cuda.backend import TorchBackend
from basal.backends.load import load_backend, pick_backend
from basal.core.engine.pipeline import Pipeline, Stats
from basal.core.request.dialects import parse_systemone
from basal.core.request.model_names import model_resolver


def test_defaults_and_selection(demo_model):
    from basal.backends.load import _apple_silicon, load_backend_class

    if torch.cuda.is_available():
        expected = ("torch",)  # CUDA (the GPU engineer's tests cover its device and dtype)
    elif _apple_silicon() and load_backend_class("mlx") is not None:
        expected = ("mlx", "metal", "f16")  # auto on a Mac: MLX on Metal
    else:
        expected = ("torch", "cpu", "f32")
    assert pick_backend("auto") == expected[0]
    backend = load_backend(demo_model, "auto")
    assert (backend.name, backend.device, backend.dtype)[: len(expected)] == expected
    with pytest.raises(ValueError, match="unknown backend"):
        pick_backend("tpu")
    with pytest.raises(ValueError, match="unknown dtype"):
        load_backend(demo_model, "torch", "f8")


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_16_bit_dtypes_stay_close_to_f32(demo_model, dtype):
    request = parse_systemone(
        {
            "model": "m",
            "state": "Order 42 arrived late and damaged.",
            "questions": {
                "a": {
                    "type": "choice",
                    "instructions": "What happened?",
                    "criteria": {"late": None, "damaged": None, "lost": None},
                }
            },
        },
        lambda m: m,
    )
    answers = {}
    for dt in ("f32", dtype):
        pipeline = Pipeline(demo_model, TorchBackend.load(demo_model, dtype=dt))
        answers[dt] = pipeline.decide(request).answers["a"].probabilities
    diff = max(abs(answers["f32"][k] - answers[dtype][k]) for k in answers["f32"])
    assert diff < (1e-6 if dtype == "f32" else 0.05)


def test_decide_end_to_end_and_packing_saves_tokens(demo_model):
    pipeline = Pipeline(demo_model, TorchBackend.load(demo_model))
    questions = {f"q{i}": {"type": "noul", "instructions": f"Is point {i} true?"} for i in range(5)}
    questions["s"] = {"type": "score", "instructions": "How bad?", "criteria": ["low", "mid", "high"]}
    questions["one"] = {"type": "choice", "criteria": {"only": None}}
    request = parse_systemone(
        {"model": "jev-latest", "state": "A long state. " * 40, "questions": questions},
        model_resolver([demo_model.name], demo_model.name),
    )
    stats = Stats()
    response = pipeline.decide(request, stats)
    assert response.model == demo_model.name and list(response.answers) == list(questions)
    assert response.answers["one"].probabilities == {"only": 1.0}
    assert abs(sum(response.answers["s"].probabilities.values()) - 1) < 1e-12
    assert response.usage.input_tokens == stats.prompt_tokens
    assert stats.packed_tokens < 0.3 * stats.prompt_tokens  # state once for 12 prompts, template prefix cached
    assert stats.forwards == 1


def test_letter_logits_are_float32_for_k_letters(demo_model):
    pipeline = Pipeline(demo_model, TorchBackend.load(demo_model))
    request = parse_systemone(
        {
            "model": "m",
            "state": "x",
            "questions": {"c": {"type": "choice", "criteria": {str(i): None for i in range(7)}}},
        },
        lambda m: m,
    )
    from basal.core.packing.passes import run_to_end

    (orders,) = run_to_end(pipeline.letter_logits(pipeline.tokenize(request.questions)))
    assert len(orders) == 2 and all(o.dtype == np.float32 and o.shape == (10,) for o in orders)


@pytest.mark.skipif(torch.cuda.is_available(), reason="stands in for CUDA on a machine without it")
def test_on_cuda_load_hands_over_to_the_gpu_path_and_says_when_it_cannot(demo_model, monkeypatch, caplog):
    """With Triton the GPU path serves (`basal serve` picks it by itself); without, the portable path serves and
    the log says why it is slow and what to install."""
    import importlib.util

    from basal.backends.cuda.gpu.backend import GpuBackend

    handed = []
    monkeypatch.setattr(GpuBackend, "load", classmethod(lambda cls, model, dtype, device: handed.append(device)))
    TorchBackend.load(demo_model, device="cuda")
    assert handed == ["cuda"] and "without Triton" not in caplog.text
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    with pytest.raises((AssertionError, RuntimeError)):  # this CPU build of torch has no CUDA to load onto
        TorchBackend.load(demo_model, device="cuda")
    assert handed == ["cuda"] and "CUDA without Triton" in caplog.text
    assert "pip install 'basal-bitwise[cuda]'" in caplog.text
