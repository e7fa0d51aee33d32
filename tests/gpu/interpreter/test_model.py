"""The GPU model end to end under the interpreter, on the demo model: a question's logits are bitwise the same alone,
in a tree with questions on the same state, in a batch, with and without the prefix cache, and at a larger token
bucket; and close to the torch CPU f32 backend."""

from __future__ import annotations

import random

import numpy as np
import pytest

from basal.backends.cuda.backend import TorchBackend
from basal.backends.cuda.gpu.backend import GpuBackend
from basal.core.engine.pipeline import Pipeline
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import split_forwards
from tests.determinism.harness import Harness, same_bits

pytestmark = pytest.mark.slow  # minutes under the interpreter; gpu_check.py --cpu-dry-run covers a toy model


@pytest.fixture(scope="module")
def gpu(demo_model):
    return GpuBackend.load(demo_model, dtype="f32", device="cpu", arena_tokens=128, progress=False)


@pytest.fixture(scope="module")
def questions(demo_model):
    h = Harness.__new__(Harness)
    h.tok = demo_model.tokenizer
    rng = random.Random(5)
    first = h.question(rng, "en", state_words=6, k=2)
    return [first, h.question(rng, "en", state=first.state, k=2)]


@pytest.fixture(scope="module")
def cached(demo_model, gpu):
    return Pipeline(demo_model, gpu)  # computes the template prefixes once


def _logits(pipeline, questions):
    return run_to_end(pipeline.letter_logits(questions))


def test_alone_tree_batch_and_cache_give_the_same_bits(demo_model, gpu, cached, questions):
    together = _logits(cached, questions)
    for i, q in enumerate(questions):
        assert same_bits(_logits(cached, [q])[0], together[i]), i
    uncached = _logits(Pipeline(demo_model, gpu, prefix_cache=False), questions)
    assert all(same_bits(a, b) for a, b in zip(uncached, together, strict=True))


def test_larger_bucket_gives_the_same_bits(gpu, cached, questions):
    pipeline = cached
    (forward,) = split_forwards(questions[:1], pipeline.letter_ids, pipeline.prefixes)
    small = run_to_end(gpu.run(forward.packed))
    large = run_to_end(gpu.run(forward.packed, pad_to=2 * forward.packed.n_tokens + 40))
    assert small.tobytes() == large.tobytes()


def test_close_to_the_torch_cpu_f32_backend(demo_model, cached, questions):
    ours = _logits(cached, questions)
    reference = _logits(Pipeline(demo_model, TorchBackend.load(demo_model, dtype="f32", device="cpu")), questions)
    for qa, qb in zip(ours, reference, strict=True):
        for a, b in zip(qa, qb, strict=True):
            assert np.abs(a - b).max() <= 1e-3 * max(1.0, float(np.abs(b).max()))


def test_evidence_rows_keep_the_logits_and_match_the_torch_cpu_rows(demo_model, gpu, cached, questions):
    """`run_with_hidden`: the readouts' bits are those of `run`; the extra rows are the torch CPU f32 backend's
    final-normed hidden states, closely."""
    from dataclasses import replace

    (forward,) = split_forwards(questions[:1], cached.letter_ids, cached.prefixes)
    hidden = np.arange(3, dtype=np.int32)  # three tokens of the row that are not readouts
    batch = replace(forward.packed, hidden=hidden)
    logits, states = run_to_end(gpu.run_with_hidden(batch))
    assert logits.tobytes() == run_to_end(gpu.run(forward.packed)).tobytes()
    cpu = TorchBackend.load(demo_model, dtype="f32", device="cpu")
    Pipeline(demo_model, cpu)  # the same template prefixes
    cpu_logits, cpu_states = run_to_end(cpu.run_with_hidden(batch))
    assert states.shape == cpu_states.shape == (len(batch.readouts) + 3, demo_model.config.hidden_size)
    assert np.abs(states - cpu_states).max() <= 1e-3 * max(1.0, float(np.abs(cpu_states).max()))
    assert np.abs(logits - cpu_logits).max() <= 1e-3 * max(1.0, float(np.abs(cpu_logits).max()))
