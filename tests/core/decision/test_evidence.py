"""Evidence spans: the head file read safely, the state's tokens located, spans chosen as the reference does."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from basal.core.decision.evidence import best_spans, state_tokens
from basal.core.model.evidence_head import EvidenceHead, layer_norm, log_softmax
from basal.core.model.torch_file import TorchFileError, load_tensors, save_tensors
from tests.conftest import DATA

VECTORS = [json.loads(line) for line in (DATA / "extensions" / "evidence.jsonl").read_text().splitlines() if line]


def vectors(kind: str) -> list[dict]:
    return [v for v in VECTORS if v["kind"] == kind]


@pytest.mark.parametrize("v", vectors("evidence_spans"), ids=lambda v: v["id"])
def test_span_selection_vectors(v):
    x = v["inputs"]
    got = best_spans(x["state"], [tuple(r) for r in x["rel"]], np.float32(x["ls"]), np.float32(x["le"]), x["limit"])
    assert got == v["expected"]
    for span in got:
        assert x["state"][span["start"] : span["end"]] == span["text"]


@pytest.mark.parametrize("v", vectors("evidence_input"), ids=lambda v: v["id"])
def test_state_token_vectors(v):
    x, want = v["inputs"], v["expected"]
    prompt = "x" * (x["s0"] - 1) + "\n" + x["state"] + "\n\nPytanie: ..."  # the state starts at s0
    found = state_tokens(prompt, x["state"], [tuple(o) for o in x["offset_mapping"]])
    assert (found.t0, found.t1) == (want["t0"], want["t1"])
    assert [list(r) for r in found.rel] == want["rel"]


def test_no_state_token_means_no_evidence():
    assert state_tokens("abc\n\ndef", "", [(0, 3), (3, 5)]) is None
    assert best_spans("", [], np.zeros(0, np.float32), np.zeros(0, np.float32)) == []


def test_spans_never_end_before_they_start_or_exceed_the_maximum():
    """The upstream property: with n*n >= 20 valid pairs every kept span has 0 < end - start <= 80 tokens."""
    rng = np.random.default_rng(0)
    state = "x" * 300
    rel = [(i, i + 1) for i in range(300)]
    for _ in range(5):
        ls = log_softmax(rng.standard_normal(300).astype(np.float32))
        le = log_softmax(rng.standard_normal(300).astype(np.float32))
        for span in best_spans(state, rel, ls, le):
            assert 0 < span["end"] - span["start"] <= 80


def test_head_scores_are_log_probabilities_and_follow_the_formula():
    head = EvidenceHead.random(d=16, k=8, seed=1)
    rng = np.random.default_rng(2)
    h, q = rng.standard_normal((7, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    ls, _ = head.log_scores(h, q)
    assert ls.dtype == np.float32 and np.isclose(np.exp(ls.astype(np.float64)).sum(), 1.0, atol=1e-5)
    lh, lq = layer_norm(h), layer_norm(q[None])[0]
    s = (lh @ head.ws.T) @ (head.us @ lq) / np.sqrt(8) + lh @ head.bs[0]
    np.testing.assert_allclose(ls, s - np.log(np.exp(s - s.max()).sum()) - s.max(), rtol=1e-5, atol=1e-5)


def test_head_file_round_trip_with_torch(tmp_path):
    head = EvidenceHead.random(d=16, k=8, seed=3)
    head.save(tmp_path / "evidence_head.pt")
    loaded = torch.load(tmp_path / "evidence_head.pt", weights_only=True)  # torch reads what basal writes
    assert (
        loaded["d"] == 16
        and loaded["k"] == 8
        and torch.equal(loaded["state_dict"]["ue.weight"], torch.from_numpy(head.ue))
    )
    torch.save(loaded, tmp_path / "by_torch.pt")  # and basal reads what torch writes
    again = EvidenceHead.load(tmp_path / "by_torch.pt", hidden_size=16)
    assert all(np.array_equal(getattr(again, n), getattr(head, n)) for n in ("ws", "us", "we", "ue", "bs", "be"))
    with pytest.raises(TorchFileError, match="hidden size 16, the model has 32"):
        EvidenceHead.load(tmp_path / "by_torch.pt", hidden_size=32)


def test_the_writer_is_deterministic(tmp_path):
    head = EvidenceHead.random(d=8, k=4, seed=0)
    head.save(tmp_path / "a.pt")
    head.save(tmp_path / "b.pt")
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def test_a_file_that_would_run_code_is_refused(tmp_path, capfd):
    torch.save({"d": 1, "k": 1, "state_dict": {"ws.weight": _RunsCode()}}, tmp_path / "evil.pt")
    with pytest.raises(TorchFileError, match=r"refusing to load posix\.system"):
        load_tensors(tmp_path / "evil.pt")
    assert "must never run" not in capfd.readouterr().out
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(TorchFileError, match=r"not a torch\.save archive"):
        EvidenceHead.load(tmp_path / "junk.pt")


def test_missing_and_misshapen_weights_are_named(tmp_path):
    save_tensors(tmp_path / "h.pt", {"d": 4, "k": 2, "state_dict": {"ws.weight": np.zeros((2, 4), np.float32)}})
    with pytest.raises(TorchFileError, match=r"lacks us\.weight"):
        EvidenceHead.load(tmp_path / "h.pt")
    good = EvidenceHead.random(4, 2, 0)
    sd = {f"{n}.weight": getattr(good, n) for n in ("ws", "us", "we", "ue", "bs", "be")}
    sd["be.weight"] = np.zeros((2, 4), np.float32)
    save_tensors(tmp_path / "h.pt", {"d": 4, "k": 2, "state_dict": sd})
    with pytest.raises(TorchFileError, match=r"be \(2, 4\)"):
        EvidenceHead.load(tmp_path / "h.pt")


def test_synth_model_writes_a_head_that_loads(tmp_path):
    from basal.core.model.evidence_head import load_head
    from basal.core.model.synth import synth_model

    plain = synth_model(tmp_path / "plain", "demo")
    with_head = synth_model(tmp_path / "head", "demo", evidence_head=True)
    assert load_head(plain, 64) is None
    head = load_head(with_head, 64)
    assert (head.d, head.k) == (64, 256)


# -- the packed batch: which rows the backend reads -----------------------------------------------------------


def _evidence_request(state: str, *names: str):
    from basal.core.request.dialects import parse_basal

    questions = {n: {"type": "noul", "instructions": f"{n}?", "evidence": True} for n in names}
    return parse_basal({"state": state, "questions": questions}, lambda _m: "m", serves_evidence=lambda _m: True)


def test_hidden_rows_are_the_state_tokens_and_questions_on_one_state_share_them(demo_model):
    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.pipeline import Pipeline

    pipeline = Pipeline(demo_model, TorchBackend.load(demo_model))
    rounds = pipeline.admit(_evidence_request("Paczka dotarła uszkodzona, klient chce zwrotu.", "a", "b")).state
    (forward,) = pipeline.pack_questions(rounds.tokenized)
    batch = forward.packed
    assert set(forward.hidden_of) == {0, 1} and len(batch.hidden) == len(rounds.tokenized[0].hidden)  # shared
    assert not set(batch.hidden.tolist()) & set(batch.readouts.tolist())
    for qi, tokenized in enumerate(rounds.tokenized):
        rows = batch.hidden[forward.hidden_of[qi]]
        assert batch.tokens[rows].tolist() == [tokenized.prompts[0][p] for p in tokenized.hidden]
        assert batch.positions[rows].tolist() == list(tokenized.hidden)


def test_a_state_found_inside_the_template_is_computed_without_the_prefix_cache(demo_model):
    """The first "\\n" + state can lie in the cached template (a state that repeats the system prompt's start):
    that question's row is packed without the cached prefix, and its spans equal an uncached pipeline's."""
    import msgspec

    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.pipeline import Pipeline
    from basal.core.model.prompt import SYSTEM

    backend = TorchBackend.load(demo_model)
    cached, uncached = Pipeline(demo_model, backend), Pipeline(demo_model, backend, prefix_cache=False)
    request = _evidence_request(SYSTEM["en"][:40], "q")  # English: no Polish letters
    rounds = cached.admit(request).state
    assert rounds.tokenized[0].hidden[0] < len(cached.prefixes["en"])  # inside the cached prefix
    (forward,) = cached.pack_questions(rounds.tokenized)
    assert forward.packed.prefix_keys == ()
    answers = [msgspec.to_builtins(p.decide(request))["answers"]["q"] for p in (cached, uncached)]
    assert answers[0] == answers[1] and answers[0]["evidence"]


def test_served_spans_are_the_heads_choice_over_the_state_rows(demo_model):
    """The answer's spans are best_spans of the head's scores over the rows the backend returned."""
    import msgspec

    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.pipeline import Pipeline

    pipeline = Pipeline(demo_model, TorchBackend.load(demo_model))
    request = _evidence_request("Termin płatności faktury minął wczoraj. Klient prosi o przedłużenie.", "q")
    rounds = pipeline.admit(request).state
    from basal.core.packing.passes import run_to_end

    answer = pipeline.settle(rounds, run_to_end(pipeline.letter_logits(rounds.tokenized)), 0.0)
    states, found = np.asarray(rounds.states["q"]), rounds.state_tokens["q"]
    assert states.shape == (found.t1 - found.t0 + 1, demo_model.config.hidden_size) and states.dtype == np.float32
    ls, le = demo_model.evidence_head.log_scores(states[:-1], states[-1])
    want = best_spans(request.questions[0].item.state_text, found.rel, ls, le)
    got = msgspec.to_builtins(answer.response)["answers"]["q"]["evidence"]
    assert got == want and 1 <= len(got) <= 3


def _full_matrix_spans(state, rel, ls, le):
    """The selection written directly over the whole n×n matrix (the band shortcut of best_spans must agree)."""
    n = len(ls)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    scores = np.where((j >= i) & (j - i < 80), (ls[:, None] + le[None, :]).astype(np.float32), np.float32(-1e9))
    flat, kept = scores.ravel(), []
    for index in np.argsort(-flat, kind="stable")[: min(20, n * n)]:
        a, b = rel[int(index) // n][0], rel[int(index) % n][1]
        if all(b <= k["start"] or a >= k["end"] for k in kept):
            kept.append(
                {"text": state[a:b], "start": a, "end": b, "probability": float(np.exp(np.float64(flat[index])))}
            )
        if len(kept) == 5:
            break
    return kept[:3]


def test_the_band_of_valid_pairs_chooses_what_the_whole_matrix_does():
    """Long states score only the i <= j < i + 80 band; ties (rounded scores) and tiny states included."""
    rng = np.random.default_rng(1)
    for t in range(300):
        n = int(rng.integers(1, 8)) if t % 3 == 0 else int(rng.integers(8, 250))
        x, y = rng.standard_normal(n), rng.standard_normal(n)
        if t % 2:
            x, y = np.round(x * 2) / 2, np.round(y * 2) / 2  # many exactly equal pair scores
        ls, le = log_softmax(x.astype(np.float32)), log_softmax(y.astype(np.float32))
        rel = [(k, k + 1) for k in range(n)]
        state = "abcdefghij" * (n // 10 + 1)
        assert best_spans(state, rel, ls, le) == _full_matrix_spans(state, rel, ls, le), t
