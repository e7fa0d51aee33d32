"""`basal check-reference`: rebuild an upstream reference export and compare (docs/contract.md §5).

Two record kinds (one JSON object per line):

* System One requests — ``request`` plus the upstream ``to_items`` view per question (``items``: keys, options,
  language, state/question text, per option order the prompt, token ids, letter ids and letter logits,
  ``p_avg``/``p_cal``) and the upstream answer (``upstream_answer``) or its error (``upstream_error``).
* bench items — ``state``, ``question``, ``options`` (texts as shown), ``type``, ``lang``, ``orders``, ...

Every prompt is rebuilt from the record's own inputs with basal's contract code; from the export's letter
logits the distribution (to 1e-12) and the full upstream answer (to 1e-6: upstream computed it in float32) are
recomputed, and the packing of each question alone (prefix length, packed length, readout columns) is rebuilt
from the exported token ids. With a model directory, token ids and letter ids are compared too.

A basal export (`basal export`) reads the same way: its manifest line is skipped, its ``answer`` / ``error``
stand for ``upstream_answer`` / ``upstream_error``, and a ``"dialect": "systemone"`` record is parsed and
answered in that dialect.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from basal.core.decision.act import NeedsDeferAction, choose_action
from basal.core.decision.distribution import Distribution, calibrate, certain, distribution
from basal.core.decision.evidence import best_spans
from basal.core.decision.large_choice import DEFAULT_STRATEGY, STRATEGIES, LargeChoice, groups, is_large, prompt_count
from basal.core.decision.respond import answer_basal, answer_multi, answer_systemone
from basal.core.errors import RequestError
from basal.core.facts import FactsError, inject
from basal.core.model.model_dir import ModelDir
from basal.core.model.prompt import Item, lang_of, option_orders
from basal.core.model.render import text_of
from basal.core.packing.tree import pack_fields
from basal.core.request.dialects import parse_basal, parse_systemone
from basal.core.request.extensions import ActSpec
from basal.core.request.plan import Question

EXACT = 1e-12  # float64 host math of the export
UPSTREAM = 1e-6  # upstream_answer was computed in float32


@dataclass
class Report:
    """Counts per check (passed / failed) and what was skipped, with reasons."""

    passed: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    mismatches: list[str] = field(default_factory=list)
    records: int = 0

    def check(self, name: str, ok: bool, where: str, detail: str = "") -> bool:
        if ok:
            self.passed[name] += 1
        else:
            self.failed[name] += 1
            self.mismatches.append(f"{where}: {name} differs{': ' + detail if detail else ''}")
        return ok

    def skip(self, reason: str) -> None:
        self.skipped[reason] += 1

    @property
    def ok(self) -> bool:
        return not self.failed

    def table(self) -> str:
        names = sorted(set(self.passed) | set(self.failed))
        width = max([len(n) for n in names] + [5])
        lines = [f"{'check':<{width}}  {'match':>7}  {'differ':>7}", f"{'-' * width}  {'-' * 7}  {'-' * 7}"]
        lines += [f"{n:<{width}}  {self.passed[n]:>7}  {self.failed[n]:>7}" for n in names]
        lines += [f"skipped: {n} × {reason}" for reason, n in sorted(self.skipped.items())]
        verdict = "all match" if self.ok else f"{sum(self.failed.values())} MISMATCHES"
        lines.append(f"{self.records} records: {verdict}")
        return "\n".join(lines)


def _close(a: Any, b: Any, tol: float) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= tol))


def _maxdiff(a: Any, b: Any) -> str:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return f"max |Δ| = {np.max(np.abs(a - b)):.3g}" if a.shape == b.shape else f"shapes {a.shape} vs {b.shape}"


class ReferenceChecker:
    def __init__(
        self,
        model: ModelDir | None = None,
        temperatures: dict[str, float] | None = None,
        thresholds: dict[str, Any] | None = None,
    ):
        self.model = model
        self.thresholds = thresholds if thresholds is not None else (model.calibration.thresholds if model else None)
        self.temperatures = (
            temperatures if temperatures is not None else (model.calibration.temperatures if model else None)
        )
        self.report = Report()

    # -- records --------------------------------------------------------------------------------------------

    def check_file(self, path: Path) -> Report:
        for n, record in _records(path):
            self.report.records += 1
            where = f"{path.name}:{n} {record.get('id') or record.get('index')}"
            if is_large_choice_record(record):
                check_large_choice(self, record, where)
            elif "request" in record:
                self.check_request(record, where)
            elif "options" in record and "question" in record:
                self.check_bench(record, where)
            else:
                self.report.check("record kind", False, where, "neither a System One request nor a bench item")
        return self.report

    def check_bench(self, rec: dict[str, Any], where: str) -> None:
        r = self.report
        options = tuple(rec["options"])
        state, question = rec["state"], rec["question"]
        lang = lang_of(state + question)
        r.check("language", lang == rec["lang"], where, f"{lang} vs {rec['lang']}")
        qtype = rec.get("type", "choice")
        item = Item(
            str(rec.get("id")), qtype, tuple(str(i) for i in range(len(options))), options, lang, state, question
        )
        dist = self.check_orders(item, rec, where)
        if dist is not None:
            r.check(
                "argmax", dist.argmax == rec["argmax_cal"] and int(np.argmax(dist.p_avg)) == rec["argmax_avg"], where
            )

    def check_request(self, rec: dict[str, Any], where: str) -> None:
        r = self.report
        self.check_facts_state(rec, where)
        systemone = rec.get("dialect") == "systemone"  # a basal export of a System One request
        expected_error = rec.get("upstream_error") or rec.get("to_items_error") or rec.get("error")
        try:
            if systemone:
                plan = parse_systemone(rec["request"], lambda _model: "reference", serves_evidence=lambda _model: True)
            else:
                plan = parse_basal(rec["request"], lambda _model: "reference", check_evidence=False)
        except RequestError as e:
            if e.upstream and e.upstream.startswith("unsupported:"):
                r.skip("request uses a basal-1.5 extension (multi/act/facts/evidence) that basal does not support yet")
                return
            if isinstance(expected_error, dict):  # basal's own error record: status and body
                same = (e.status, e.body) == (expected_error.get("status"), expected_error.get("body"))
                r.check("error", same, where, f"basal: {e.status} {e.body}, export: {expected_error}")
                return
            r.check(
                "upstream error",
                expected_error is not None and e.upstream == expected_error,
                where,
                f"basal: {e.upstream!r}, upstream: {expected_error!r}",
            )
            return
        if expected_error is not None:
            r.check("upstream error", False, where, f"the export has an error ({expected_error}), basal accepts it")
            return
        questions = {q.name: q for q in plan.questions if q.needs_model}
        items = rec.get("items", [])
        if not items and "upstream_answer" not in rec:
            r.skip("record without items or answer (request inputs only)")
            return
        answer = answer_systemone if systemone else answer_basal
        answers = rec.get("upstream_answer", rec.get("answer")) or {}
        extension = any("evidence" in a for a in answers.get("answers", {}).values())
        if extension or any(q.kind in ("multi", "act") for q in plan.questions):
            self.check_extension_request(plan.questions, items, answers, where, answer, plan.facts_limit)
            return
        r.check(
            "question names",
            list(questions) == [it["name"] for it in items],
            where,
            f"{list(questions)} vs {[it['name'] for it in items]}",
        )
        dists = {}
        for it in items:
            q = questions.get(it["name"])
            if q is None:
                continue
            w = f"{where}/{it['name']}"
            r.check("keys", list(q.item.keys) == it["keys"], w, f"{q.item.keys} vs {it['keys']}")
            r.check("options", list(q.item.options) == it["options"], w, f"{q.item.options} vs {it['options']}")
            r.check("language", q.item.lang == it["lang"], w, f"{q.item.lang} vs {it['lang']}")
            r.check("state text", q.item.state_text == it["state_text"], w)
            r.check(
                "question text",
                q.item.question_text == it["question_text"],
                w,
                f"{q.item.question_text!r} vs {it['question_text']!r}",
            )
            if "letter_error" in it:
                r.skip("item without logits (upstream: letters are not single tokens)")
                continue
            dists[q.name] = self.check_orders(q.item, it, w)
        expected_answer = rec.get("upstream_answer", rec.get("answer"))
        if expected_answer is not None and all(d is not None for d in dists.values()):
            answer = answer_systemone if systemone else answer_basal
            self.check_answer(plan.questions, dists, items, expected_answer, where, answer)

    def check_facts_state(self, rec: dict[str, Any], where: str) -> None:
        """A ``facts: "auto"`` request: every item's state text is the injected state rebuilt from the request.

        Checked on its own so that it runs even where the rest of the record cannot be rebuilt yet; a failing
        injection is compared with ``upstream_error`` by the request check (`parse_basal` raises it).
        """
        request = rec["request"]
        if not isinstance(request, dict) or request.get("facts") != "auto" or "state" not in request:
            return
        try:
            text = inject(text_of(request["state"]))
        except FactsError:
            return
        for it in rec.get("items", []):
            want = it.get("state_text")
            self.report.check(
                "facts state text", want == text, f"{where}/{it.get('name')}", _first_difference(text, str(want))
            )

    def check_extension_request(
        self,
        questions: tuple[Question, ...],
        items: list[dict],
        expected: dict,
        where: str,
        answer: Callable,
        facts_limit: int | None = None,
    ):
        """A request with multi/act questions: the export's items are the readouts in order (one per multi label,
        named ``NAME`` or ``NAME#label``); each is rebuilt and checked, then the answers are recomputed."""
        r = self.report
        asked = [(q, item) for q in questions for item in q.asked]
        names_ok = len(asked) == len(items) and all(
            it["name"] in (item.name, q.name) for (q, item), it in zip(asked, items, strict=False)
        )
        if not r.check(
            "question names", names_ok, where, f"{[i.name for _, i in asked]} vs {[it['name'] for it in items]}"
        ):
            return
        dists: dict[str, list] = {q.name: [] for q in questions}
        for (q, item), it in zip(asked, items, strict=True):
            w = f"{where}/{it['name']}"
            self._check_item_fields(item, it, w)
            dists[q.name].append(self.check_orders(item, it, w))
        if expected and all(d is not None for ds in dists.values() for d in ds):
            for q in questions:
                want = expected.get("answers", {}).get(q.name)
                if want is not None:
                    self._check_any_answer(q, dists[q.name], want, items, f"{where}/{q.name}", answer, facts_limit)
            usage = expected.get("usage", {})
            if "branches" in usage:
                branches = sum(q.branch_count for q in questions)
                r.check("usage.branches", branches == usage["branches"], where, f"{branches} vs {usage['branches']}")
            if "input_tokens" in usage and all("input_ids" in o for it in items for o in it.get("orders", [])):
                tokens = sum(len(o["input_ids"]) for it in items for o in it["orders"])
                r.check("usage.input_tokens", tokens == usage["input_tokens"], where)

    def check_evidence(
        self, state: str, spans: Any, inputs: dict[str, Any] | None, facts_limit: int | None, w: str
    ) -> None:
        """Upstream's evidence spans. Always: at most 3, each `state[start:end] == text` inside the state (and before
        the facts block). With the head's inputs in the record's item (``evidence``: ``rel``, ``ls``, ``le``, as
        the evidence vectors carry them): the spans are chosen again and compared (offsets and texts exact,
        probabilities to 1e-6). Without them the choice is reported as not checkable: the hidden states that
        decide it are not in an export."""
        r = self.report
        end = len(state) if facts_limit is None else facts_limit
        shape_ok = isinstance(spans, list) and len(spans) <= 3 and all(_span_in(s, state, end) for s in spans)
        r.check("evidence spans", shape_ok, w, f"{json.dumps(spans, ensure_ascii=False)[:300]}")
        if not isinstance(inputs, dict) or not all(k in inputs for k in ("rel", "ls", "le")):
            r.skip("evidence span choice: not checkable (the record carries no pointer-head scores)")
            return
        limit = inputs.get("limit", facts_limit)
        rel = [tuple(x) for x in inputs["rel"]]
        ls, le = np.asarray(inputs["ls"], dtype=np.float32), np.asarray(inputs["le"], dtype=np.float32)
        have = best_spans(state, rel, ls, le, limit)
        same = (
            isinstance(spans, list)
            and len(have) == len(spans)
            and all(
                (h["text"], h["start"], h["end"]) == (s.get("text"), s.get("start"), s.get("end"))
                and abs(float(h["probability"]) - float(s.get("probability", -1))) <= 1e-6
                for h, s in zip(have, spans, strict=False)
            )
        )
        r.check("evidence span choice", same, w, f"basal {have} vs upstream {spans}"[:400])

    def _check_item_fields(self, item: Item, it: dict[str, Any], w: str) -> None:
        r = self.report
        r.check("keys", list(item.keys) == it["keys"], w, f"{item.keys} vs {it['keys']}")
        r.check("options", list(item.options) == it["options"], w, f"{item.options} vs {it['options']}")
        r.check("language", item.lang == it["lang"], w, f"{item.lang} vs {it['lang']}")
        r.check("state text", item.state_text == it["state_text"], w)
        r.check(
            "question text",
            item.question_text == it["question_text"],
            w,
            f"{item.question_text!r} vs {it['question_text']!r}",
        )

    def _check_any_answer(
        self,
        q: Question,
        dists: list,
        want: dict[str, Any],
        items: list,
        w: str,
        answer: Callable,
        facts_limit: int | None = None,
    ) -> None:
        """One upstream answer of any type: decisions exact, numbers to float32 precision; evidence spans as far
        as the record allows (`check_evidence`)."""
        r = self.report
        want = dict(want)
        spans = want.pop("evidence", None)
        if spans is not None:
            item = next((it for it in items if it.get("name") == q.name), {})
            self.check_evidence(q.item.state_text, spans, item.get("evidence"), facts_limit, w)
        if q.kind == "multi":
            have = msgspec.to_builtins(answer_multi(q, dists))
        elif q.kind == "act":
            have = self._act_answer(q, dists[0], want, items)
            if have is None:
                r.check("upstream answer", False, w, "basal refuses it: max_error needs a defer action")
                return
        else:
            have = msgspec.to_builtins(answer(q, dists[0]))
        have_text, want_text = (json.dumps(a, ensure_ascii=False)[:300] for a in (have, want))
        r.check("upstream answer", _same_answer(have, want), w, f"basal {have_text} vs upstream {want_text}")

    def _act_answer(self, q: Question, dist, want: dict[str, Any], items: list) -> dict[str, Any] | None:
        """The act answer from the export's distribution (None: refused for want of a defer action). Without
        CALIBRATION.json thresholds the refusal part of `want` is not checkable: it is taken out and the action
        before the refusal is compared instead."""
        if self.temperatures is not None:
            calibrated = bool(self.temperatures)
        else:
            calibrated = any(float(it["temperature"]) != 1.0 for it in items)
        spec = q.spec
        assert isinstance(spec, ActSpec)
        thresholds = self.thresholds
        if thresholds is None and spec.max_error_key is not None:
            self.report.skip("act refusal (no CALIBRATION.json thresholds: pass --model)")
            refused = want.pop("refused", None)
            want.pop("max_error", None)
            if refused is not None:
                want["action"] = refused
        p = {k: float(v) for k, v in zip(q.item.keys, dist.p_cal, strict=True)}
        try:
            have = msgspec.to_builtins(choose_action(p, spec, thresholds or {}, calibrated))
        except NeedsDeferAction:
            return None
        if thresholds is None:
            have.pop("max_error", None)
        return have

    # -- per question ---------------------------------------------------------------------------------------

    def check_orders(self, item: Item, rec: dict[str, Any], where: str):
        """Prompts, permutations (and token ids with a model) of every order; then the distribution."""
        r = self.report
        orders = rec["orders"]
        perms = option_orders(len(item.options))
        if not r.check(
            "permutations", [o["perm"] for o in orders] == perms, where, f"{[o['perm'] for o in orders]} vs {perms}"
        ):
            return None
        for o, perm in zip(orders, perms, strict=True):
            prompt = item.prompt(perm, self.model.bos if self.model else "<s>")
            r.check("prompt text", prompt == o["prompt"], where, _first_difference(prompt, o["prompt"]))
            if self.model is not None:
                tok = self.model.tokenizer
                ids = tok.encode(o["prompt"])
                r.check("token ids", ids == o["input_ids"], where, f"{len(ids)} vs {len(o['input_ids'])} tokens")
                r.check("letter ids", tok.letter_ids(len(perm)) == o["letter_ids"], where)
        if "pack" in rec and all("input_ids" in o for o in orders):
            fields = pack_fields([o["input_ids"] for o in orders])
            r.check("packing", fields == rec["pack"], where, f"{fields} vs {rec['pack']}")
        temperature = float(rec["temperature"])
        if self.temperatures is not None:
            expected_t = float(self.temperatures.get(item.type, 1.0))
            r.check("temperature", expected_t == temperature, where, f"{temperature} vs {expected_t}")
        dist = distribution([o["letter_logits"] for o in orders], perms, temperature)
        for o, p in zip(orders, dist.probs, strict=True):
            r.check("probs", _close(p, o["probs"], EXACT), where, _maxdiff(p, o["probs"]))
        r.check("p_avg", _close(dist.p_avg, rec["p_avg"], EXACT), where, _maxdiff(dist.p_avg, rec["p_avg"]))
        r.check("p_cal", _close(dist.p_cal, rec["p_cal"], EXACT), where, _maxdiff(dist.p_cal, rec["p_cal"]))
        return dist

    def check_answer(
        self, questions: tuple[Question, ...], dists, items, expected: dict[str, Any], where: str, answer=answer_basal
    ):
        r = self.report
        got = {q.name: msgspec.to_builtins(answer(q, dists.get(q.name) or certain())) for q in questions}
        for name, want in expected.get("answers", {}).items():
            w = f"{where}/{name}"
            have = got.get(name)
            if have is None:
                r.check("answer", False, w, "no answer from basal")
                continue
            same_fields = list(have) == list(want)
            exact_ok = all(have[k] == want[k] for k in ("type", "choice", "legend") if k in want)
            numbers_ok = all(_close(have[k], want[k], UPSTREAM) for k in ("noul", "score", "confidence") if k in want)
            probs_ok = list(have.get("probabilities", {})) == list(want.get("probabilities", {})) and _close(
                list(have.get("probabilities", {}).values()), list(want.get("probabilities", {}).values()), UPSTREAM
            )
            r.check(
                "upstream answer",
                same_fields and exact_ok and numbers_ok and probs_ok,
                w,
                f"basal {json.dumps(have, ensure_ascii=False)[:300]} vs upstream "
                f"{json.dumps(want, ensure_ascii=False)[:300]}",
            )
        usage = expected.get("usage", {})
        if "input_tokens" in usage:
            tokens = sum(len(o["input_ids"]) for it in items for o in it.get("orders", []))
            r.check(
                "usage.input_tokens", tokens == usage["input_tokens"], where, f"{tokens} vs {usage['input_tokens']}"
            )
        if "questions" in usage:
            r.check("usage.questions", len(questions) == usage["questions"], where)


def _same_answer(have: Any, want: Any, key: str = "") -> bool:
    """Same keys in the same order, strings/lists exact, numbers within float32 precision (costs are rounded)."""
    if isinstance(want, dict):
        return (
            isinstance(have, dict)
            and list(have) == list(want)
            and all(_same_answer(have[k], want[k], k if key != "expected_costs" else key) for k in want)
        )
    if isinstance(want, bool) or not isinstance(want, int | float):
        return have == want
    if isinstance(have, bool) or not isinstance(have, int | float):
        return False
    tol = UPSTREAM * max(1.0, abs(want)) + (UPSTREAM if key == "expected_costs" else 0.0)
    return abs(have - want) <= tol


def is_large_choice_record(rec: dict[str, Any]) -> bool:
    """A record of the grouped 11..255 strategy (basal-rs, TypeSafe dialect): a request with a choice of more than
    10 options that no upstream refused, or a recorded pipeline (group and final-round distributions)."""
    if rec.get("kind") == "large_choice_pipeline":
        return True
    if (
        rec.get("kind") == "request_error"
        or "upstream_error" in rec
        or "to_items_error" in rec
        or "error" in rec  # a basal export of a refused request: checked as a refusal
        or not isinstance(rec.get("request"), dict)
    ):
        return False
    questions = rec["request"].get("questions")
    return isinstance(questions, dict) and any(
        isinstance(q, dict) and q.get("type", "choice") == "choice" and len(q.get("criteria") or ()) > 10
        for q in questions.values()
    )


def check_large_choice(checker: ReferenceChecker, rec: dict[str, Any], where: str) -> None:
    """A large-choice record (docs/extensions.md §7): the plan, groups and prompt count from the request; with the
    recorded group and final-round distributions also the fit, the finalists and the TypeSafe answer."""
    r = checker.report
    strategy = rec.get("strategy", DEFAULT_STRATEGY)
    if not r.check("large-choice strategy", strategy in STRATEGIES, where, f"unknown strategy {strategy!r}"):
        return
    expected = rec.get("expected") or {}
    if "request" in rec:
        try:
            plan = parse_systemone(rec["request"], lambda model: model)
        except RequestError as e:
            r.check("large-choice plan", False, where, f"basal refuses it: {e.body}")
            return
        large = [q for q in plan.questions if is_large(q.item)]
        r.check("large-choice plan", bool(large), where, "no choice with 11..255 options")
    else:
        keys = tuple(f"o{i}" for i in range(rec["n"]))
        large = [Question("choice", Item("q", "choice", keys, keys, "en", "", ""))]
    for q in large:
        n = len(q.item.options)
        if "prompts" in expected:
            count = prompt_count(n, strategy)
            r.check("large-choice prompts", count == expected["prompts"], where, f"{count} vs {expected['prompts']}")
        recorded = rec.get("first_round") or {}
        if "groups" in recorded:
            r.check("large-choice groups", groups(n) == recorded["groups"], where)
        if "p_avg" in recorded and "final_round_p_avg" in rec:
            _check_large_choice_fit(checker, q, rec, strategy, where)
        elif "finalists" in expected or "choice" in expected:
            r.skip("large choice: finalists and probabilities need the group distributions (not in the record)")


def _check_large_choice_fit(
    checker: ReferenceChecker, q: Question, rec: dict[str, Any], strategy: str, where: str
) -> None:
    r, expected = checker.report, rec.get("expected") or {}
    tol = float(rec.get("tolerance", 1e-9))
    lc = LargeChoice(q.item, strategy)
    lc.take_first_round(rec["first_round"]["p_avg"])
    if "first_fit" in expected:
        r.check("large-choice first fit", _close(lc.first_fit, expected["first_fit"], tol), where)
    if "finalists" in expected:
        r.check("large-choice finalists", lc.finalists == expected["finalists"], where)
    joint = lc.take_final_round(rec["final_round_p_avg"])
    if "joint" in expected:
        r.check("large-choice joint", _close(joint, expected["joint"], tol), where, _maxdiff(joint, expected["joint"]))
    temperature = float(rec.get("temperature_choice", 1.0))
    if checker.temperatures is not None and "choice" in checker.temperatures:
        want_t = float(checker.temperatures["choice"])
        r.check("temperature", want_t == temperature, where, f"{temperature} vs {want_t}")
    p_cal = calibrate(joint, temperature)
    if "p_cal" in expected:
        r.check("large-choice p_cal", _close(p_cal, expected["p_cal"], tol), where, _maxdiff(p_cal, expected["p_cal"]))
    want = expected.get("answer_typesafe")
    if want is not None:
        have = msgspec.to_builtins(answer_systemone(q, Distribution([], joint, p_cal)))
        ok = (
            have["choice"] == want["choice"]
            and list(have["probabilities"]) == list(want["probabilities"])
            and _close(list(have["probabilities"].values()), list(want["probabilities"].values()), tol)
            and abs(have["confidence"] - want["confidence"]) <= tol
        )
        r.check("large-choice answer", ok, where, f"{json.dumps(have)[:300]} vs {json.dumps(want)[:300]}")


def _span_in(span: Any, state: str, end: int) -> bool:
    """An upstream span: the text at its offsets, inside the state before `end`."""
    if not isinstance(span, dict) or not all(isinstance(span.get(k), int) for k in ("start", "end")):
        return False
    start, stop = span["start"], span["end"]  # start > stop is possible (a masked pair: text "")
    return 0 <= start < end and stop <= end and state[start:stop] == span.get("text")


def _first_difference(a: str, b: str) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"at char {n}: {a[max(0, n - 20) : n + 20]!r} vs {b[max(0, n - 20) : n + 20]!r}"


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                record = json.loads(line)
                if not (n == 1 and isinstance(record, dict) and set(record) == {"manifest"}):  # basal's manifest
                    yield n, record


def manifest_temperatures(export: Path) -> dict[str, float] | None:
    """Calibration temperatures from the manifest: basal's first line, or the ``manifest.json`` beside an export."""
    with open(export, encoding="utf-8") as f:
        head = f.readline()
    try:
        first = json.loads(head) if head.strip() else None
    except json.JSONDecodeError:
        first = None
    if isinstance(first, dict) and set(first) == {"manifest"}:
        data = first["manifest"]
    elif (export.parent / "manifest.json").is_file():
        data = json.loads((export.parent / "manifest.json").read_text(encoding="utf-8"))
    else:
        return None
    temps = data.get("calibration", {}).get("temperatures")
    return {k: float(v) for k, v in temps.items()} if temps else None
