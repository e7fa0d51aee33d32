"""Diagnostics' letter mass: the full-vocabulary softmax probability of each order's option letters at its answer
position, checked against the whole lm_head in float64 numpy on the same hidden state; asked for only by a
diagnostics request, and never changing a bit of the letter logits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from basal.core.engine.pipeline import Pipeline
from basal.core.model.safetensors_io import bf16_bits_to_f32
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import single_prompt_forward
from basal.core.request.dialects import parse_basal

QUESTIONS = {
    "kind": {
        "type": "choice",
        "instructions": "Rodzaj?",
        "criteria": {"a": "Uszkodzenie", "b": "Opóźnienie", "c": "Inne"},
    },
    "refund": {"type": "noul", "instructions": "Czy zwrot?"},
    "tags": {"type": "multi", "instructions": "Tematy?", "criteria": ["płatność", "dostawa"]},
}

CHUNK = 700  # head rows per product in these tests: several chunks and a short last one on the demo's 3000


@pytest.fixture(params=["torch", "mlx"])
def backend(request, demo_model):
    if request.param == "torch":
        from basal.backends.cuda.backend import TorchBackend

        return TorchBackend.load(demo_model, device="cpu")
    pytest.importorskip("mlx.core")
    from basal.backends.mlx.backend import MLXBackend

    return MLXBackend.load(demo_model, device="cpu")


def _answer(pipeline: Pipeline, diagnostics: bool):
    request = parse_basal({"state": "Paczka dotarła uszkodzona.", "questions": QUESTIONS}, lambda _m: "m")
    rounds = pipeline.admit(replace(request, diagnostics=diagnostics)).state
    forwards = []
    while not rounds.done:
        forwards += pipeline.pack_questions(rounds.tokenized)
        settled = pipeline.settle(rounds, run_to_end(pipeline.letter_logits(rounds.tokenized)), 0.0)
    return rounds, forwards, settled


def _lm_head(model) -> np.ndarray:
    f, key = model.open_weights()["lm_head.weight"]
    kind, array = f.tensor(key)
    return (bf16_bits_to_f32(np.asarray(array)) if kind == "BF16" else np.asarray(array)).astype(np.float64)


@pytest.fixture
def small_chunks(monkeypatch):
    """The head read CHUNK rows at a time: several chunks and a short last one on the demo's vocabulary."""
    import basal.backends.cuda.model as torch_model

    monkeypatch.setattr(torch_model, "HEAD_CHUNK_ROWS", CHUNK)
    try:
        import basal.backends.mlx.model as mlx_model
    except ImportError:
        return
    monkeypatch.setattr(mlx_model, "HEAD_CHUNK_ROWS", CHUNK)


def test_letter_mass_is_the_full_vocabulary_softmax_mass_of_the_letters(demo_model, backend, small_chunks):
    assert demo_model.config.vocab_size % CHUNK and demo_model.config.vocab_size > 2 * CHUNK
    pipeline = Pipeline(demo_model, backend)
    rounds, _, answer = _answer(pipeline, diagnostics=True)
    questions = answer.diagnostics.questions
    head = _lm_head(demo_model)
    checked = 0
    for q in rounds.request.questions:
        for item, readout in zip(q.asked, questions[q.name].readouts, strict=True):
            k = len(item.keys)
            for perm, order in zip(item.orders, readout.orders, strict=True):
                ids = demo_model.tokenizer.encode(item.prompt(perm, demo_model.bos))
                batch = replace(single_prompt_forward(ids), letter_ids=np.asarray(pipeline.letter_ids[:k], np.int32))
                _, states = run_to_end(backend.run_with_hidden(batch))
                z = head @ states[0].astype(np.float64)  # every row of the head, independently of the backend
                p = np.exp(z - z.max())
                want = p[pipeline.letter_ids[:k]].sum() / p.sum()
                assert 0 < order.letter_mass <= 1
                assert order.letter_mass == pytest.approx(want, rel=1e-5, abs=1e-9)
                checked += 1
    assert checked == 2 * 4  # choice, noul and the multi's two labels, in both orders


def test_without_diagnostics_nothing_is_computed_and_no_logit_changes(demo_model, backend):
    pipeline = Pipeline(demo_model, backend)
    plain, plain_forwards, _ = _answer(pipeline, diagnostics=False)
    asked, asked_forwards, _ = _answer(pipeline, diagnostics=True)
    assert not plain.log_norms and not any(f.letter_mass for f in plain_forwards)
    assert all(f.letter_mass for f in asked_forwards) and set(asked.log_norms) == set(QUESTIONS)
    assert plain.plain_logits.keys() == asked.plain_logits.keys()
    for name, rows in plain.plain_logits.items():
        for a, b in zip(rows, asked.plain_logits[name], strict=True):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()  # bit for bit


def test_the_gpu_paths_head_gives_the_whole_vocabulary_log_sum_exp(demo_model, small_chunks):
    """The GPU path's weights read the head as the torch path does (checkpoint rows from the memory map, or the
    random weights' head), here on the CPU: its log-sum-exp is the whole head's, in float64 numpy."""
    import torch

    from basal.backends.cuda.gpu.weights_direct import DeviceWeights
    from basal.backends.cuda.model import head_logsumexp

    cpu = torch.device("cpu")
    states = np.random.default_rng(0).standard_normal((3, demo_model.config.hidden_size)).astype(np.float32)
    for weights, head in [
        (DeviceWeights(demo_model, torch.float32, cpu, progress=False), _lm_head(demo_model)),
        (w := DeviceWeights.random(demo_model.config, torch.float32, cpu), w._lm_head.double().numpy()),
    ]:
        z = states.astype(np.float64) @ head.T
        top = z.max(axis=1)
        want = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
        got = head_logsumexp(weights.head_rows, weights.vocab_size, states, weights.device)
        assert got.dtype == np.float64 and got == pytest.approx(want, rel=1e-6)
