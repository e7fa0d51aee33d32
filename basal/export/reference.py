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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from basal.core.decision.act import NeedsDeferAction, choose_action
from basal.core.decision.distribution import Distribution, calibrate, certain, distribution, unpermute
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
from basal.core.request.extensions import ActSpec, may_fail_after_run, needs_defer_error
from basal.core.request.plan import DecisionRequest, Question

EXACT = 1e-12  # float64 host math of the export
UPSTREAM = 1e-6  # upstream_answer was computed in float32
RUN_SHARED = 1e-4  # the server's batched float32 run against the exporter's batch-1 run of the same prompts


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

    def check_file(self, path: Path, manifests: bool = False) -> Report:
        """Check every record of `path`; with `manifests` (no model directory) each record is calibrated with the
        temperatures of its own model's manifest beside the export (`manifest_temperatures`)."""
        for n, record in _records(path):
            self.report.records += 1
            if manifests:
                request = record.get("request")
                model = request.get("model") if isinstance(request, dict) else None
                self.temperatures = manifest_temperatures(path, model if isinstance(model, str) else None)
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
            self._check_error_after_run(plan, rec, expected_error, where)
            return
        questions = {q.name: q for q in plan.questions if q.needs_model}
        items = rec.get("items", [])
        if not items and "upstream_answer" not in rec:
            r.skip("record without items or answer (request inputs only)")
            return
        answer = answer_systemone if systemone else answer_basal
        answers = rec.get("upstream_answer", rec.get("answer")) or {}
        extension = any("evidence" in a for a in answers.get("answers", {}).values())
        if extension or plan.facts_limit is not None or any(q.kind in ("multi", "act") for q in plan.questions):
            self.check_extension_request(plan, rec["request"], items, answers, where, answer)
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

    def _check_error_after_run(self, plan: DecisionRequest, rec: dict[str, Any], expected_error: Any, where: str):
        """An export's error for a request basal accepts: upstream raises some errors only while it builds the
        answers in question order, after the run (a multi bound that is not an integer; an act refusal without a
        defer action, which the act item's run decides where the record has it and thresholds are known)."""
        r = self.report
        items = {it.get("name"): it for it in rec.get("items", [])}
        for q in plan.questions:
            if q.deferred_error is None and may_fail_after_run(q.spec):
                refusal = self._act_refusal(plan, q, items.get(q.name), f"{where}/{q.name}")
                if refusal is False:
                    continue  # this act answers: upstream failed later
                if refusal is not None:
                    same = _same_error(refusal, expected_error)
                    r.check("upstream error", same, where, f"basal: {refusal.upstream!r}, upstream: {expected_error!r}")
                    return
            if q.deferred_error is not None:
                same = _same_error(q.deferred_error, expected_error)
                r.check(
                    "upstream error", same, where, f"basal: {q.deferred_error.upstream!r}, upstream: {expected_error!r}"
                )
                return
            if may_fail_after_run(q.spec):
                r.skip("act refusal after the run: needs the act item's logits and CALIBRATION.json thresholds")
                return
        r.check("upstream error", False, where, f"the export has an error ({expected_error}), basal accepts it")

    def _act_refusal(self, plan: DecisionRequest, q: Question, it: dict[str, Any] | None, w: str):
        """The after-the-run refusal of an act without a defer action, from the item's run: the error, False when
        the act answers, None when the record or the checker lacks what decides it."""
        if self.thresholds is None or not it or "orders" not in it or it.get("state_text") != q.item.state_text:
            return None
        dist = self.check_orders(q.item, it, w, str(it.get("type", q.item.type)))
        served = self._served(q.item, it, dist, w) if dist is not None else None
        if served is None:
            return None
        spec = q.spec
        assert isinstance(spec, ActSpec)
        p = {k: float(v) for k, v in zip(q.item.keys, served.p_cal, strict=True)}
        calibrated = bool(self.temperatures) if self.temperatures is not None else True
        try:
            choose_action(p, spec, self.thresholds, calibrated)
        except NeedsDeferAction as e:
            return needs_defer_error(q.name, plan.dialect, str(e))
        return False

    def check_facts_state(self, rec: dict[str, Any], where: str) -> None:
        """A ``facts: "auto"`` request: every item's state text is the injected state rebuilt from the request
        (a basal export), or the state without its facts block (upstream's exporter works before the server
        injects it); anything else, a wrong facts block included, is a mismatch.

        Checked on its own so that it runs even where the rest of the record cannot be rebuilt yet; a failing
        injection is compared with ``upstream_error`` by the request check (`parse_basal` raises it).
        """
        request = rec["request"]
        if not isinstance(request, dict) or request.get("facts") != "auto" or "state" not in request:
            return
        raw = text_of(request["state"])
        try:
            text = inject(raw)
        except FactsError:
            return
        for it in rec.get("items", []):
            if "state_text" not in it:  # upstream's multi item: its branches carry no state
                continue
            want = it["state_text"]
            self.report.check(
                "facts state text", want in (text, raw), f"{where}/{it.get('name')}", _first_difference(text, str(want))
            )

    def check_extension_request(
        self,
        plan: DecisionRequest,
        request: dict[str, Any],
        items: list[dict],
        expected: dict,
        where: str,
        answer: Callable,
    ):
        """A request with multi / act / facts / evidence: two views in one record.

        ``items`` are the exporter's view: upstream's exporter works before the server's extension handling (the
        state without the facts block, act items calibrated with temperature 1.0, a multi question as one item
        with its ``branches`` and no logits); a basal export has one item per readout (``NAME#label`` per multi
        label) of the served prompts. Each item is rebuilt and checked against itself; basal's served computation
        (act calibrated with its base type's temperature, the branch prompts, the injected state) is then compared
        with ``upstream_answer`` wherever the record carries what it needs, and each thing it does not carry is
        reported by name and reason.
        """
        r = self.report
        raw_state = text_of(request["state"]) if "state" in request else None
        by_name = {it.get("name"): it for it in items}
        wanted = [name for q in plan.questions if q.needs_model for name in self._item_names(q, by_name)]
        names_ok = wanted == [it.get("name") for it in items]
        r.check("question names", names_ok, where, f"{wanted} vs {[it.get('name') for it in items]}")
        if not names_ok:
            return
        served: dict[str, list[Distribution]] = {}
        unchecked: dict[str, str] = {}  # question -> why its served distribution is not in the record
        for q in plan.questions:
            w = f"{where}/{q.name}"
            if not q.needs_model:  # one option: p = 1 without the model
                served[q.name] = [certain()]
                continue
            if q.branches and q.name in by_name:  # upstream's multi item: branch prompts, no logits
                unchecked[q.name] = self._check_multi_item(q, by_name[q.name], w)
                continue
            dists = []
            for item in q.asked:
                it = by_name[item.name if item.name in by_name else q.name]
                wi = f"{where}/{it.get('name')}"
                view, facts = self._exporter_view(item, it, raw_state, request, wi)
                self._check_item_fields(view, it, wi)
                if "letter_error" in it:
                    unchecked[q.name] = "the item has no logits (upstream: letters are not single tokens)"
                    break
                dist = self.check_orders(view, it, wi, str(it.get("type", view.type)))
                if dist is None:
                    unchecked[q.name] = "its item differs"
                    break
                if facts:
                    unchecked[q.name] = "facts: the record's logits are of the prompts without the facts block"
                    break
                dist = self._served(item, it, dist, wi)
                if dist is None:
                    unchecked[q.name] = f"act: no calibration temperature for its base type {item.type!r}"
                    break
                dists.append(dist)
            else:
                served[q.name] = dists
        for q in plan.questions:
            want = expected.get("answers", {}).get(q.name)
            if want is None:
                continue
            w = f"{where}/{q.name}"
            if q.name in served:
                self._check_any_answer(q, served[q.name], want, items, w, answer, plan.facts_limit)
            elif q.kind == "multi" and isinstance(want.get("probabilities"), dict):
                self.report.skip(f"multi answer probabilities: not checkable ({unchecked[q.name]})")
                self._check_multi_decision(q, want, w)
            else:
                self.report.skip(f"{q.kind} answer: not checkable ({unchecked[q.name]})")
                self._check_answer_shape(q, want, plan.facts_limit, items, w)
        self._check_usage(plan, items, expected.get("usage", {}), served, where)

    def _item_names(self, q: Question, by_name: dict[str, dict]) -> list[str]:
        """The record's item names of a question: its own name, or one per multi label in a basal export."""
        if q.branches and q.name not in by_name:
            return [b.name for b in q.branches]
        return [q.name]

    def _exporter_view(
        self, item: Item, it: dict[str, Any], raw_state: str | None, request: dict[str, Any], w: str
    ) -> tuple[Item, bool]:
        """The item the exporter rebuilt: basal's served item, or with ``facts: "auto"`` the same item on the
        state without the facts block (upstream's exporter works before the server injects it). Any other state
        text, a wrong facts block included, is a mismatch (``facts state text``)."""
        if request.get("facts") != "auto" or raw_state is None or item.state_text == raw_state:
            return item, False
        if it.get("state_text") == raw_state:  # checked against the injected state by check_facts_state
            return replace(item, state_text=raw_state), True
        return item, False

    def _served(self, item: Item, it: dict[str, Any], dist: Distribution, w: str) -> Distribution | None:
        """The distribution basal serves for the item, calibrated with the temperature of the item's base type
        (an upstream act item carries the exporter's 1.0); None where that temperature is unknown.

        Where the record carries ``probs_run_shared`` (each order's probabilities from the run the server
        answered, batched as served) they are averaged and calibrated by basal's decision math, so the answer is
        compared with the server's own float32 run; else the item's letter logits are used."""
        recorded = float(it["temperature"])
        if self.temperatures is not None:
            temperature = float(self.temperatures.get(item.type, 1.0))
        elif str(it.get("type", item.type)) == item.type:
            temperature = recorded
        else:
            return None
        orders = it["orders"]
        if not all("probs_run_shared" in o for o in orders):
            same = temperature == recorded
            return dist if same else distribution([o["letter_logits"] for o in orders], item.orders, temperature)
        probs = [np.asarray(o["probs_run_shared"], dtype=np.float64) for o in orders]
        for p, mine in zip(probs, dist.probs, strict=True):
            self.report.check("probs_run_shared", _close(p, mine, RUN_SHARED), w, _maxdiff(p, mine))
        p_avg = sum(unpermute(p, perm) for p, perm in zip(probs, item.orders, strict=True)) / len(probs)
        return Distribution(probs, p_avg, calibrate(p_avg, temperature))

    def _check_multi_item(self, q: Question, it: dict[str, Any], w: str) -> str:
        """Upstream's multi item: keys, language and every branch's question text and yes/no options. An item
        without a `branches` list (the exporter's single yes/no view of the question) has no branch prompts to
        check: a named skip. -> why the served probabilities are not checkable."""
        r = self.report
        single = not isinstance(it.get("branches"), list)
        if not single or "keys" in it:
            r.check("keys", list(q.item.keys) == it.get("keys"), w, f"{q.item.keys} vs {it.get('keys')}")
        if not single or "lang" in it:
            r.check("language", q.item.lang == it.get("lang"), w, f"{q.item.lang} vs {it.get('lang')}")
        if "state_text" in it:
            r.check("state text", q.item.state_text == it["state_text"], w)
        if single:
            r.skip("multi branches: the item is the exporter's single yes/no view (no `branches` list)")
            return "multi: the record's item has no branches"
        branches = it["branches"]
        if r.check("multi branches", len(branches) == len(q.branches), w):
            for b, (question, options) in zip(q.branches, branches, strict=True):
                r.check("multi branch text", b.question_text == question, w, f"{b.question_text!r} vs {question!r}")
                r.check("multi branch options", list(b.options) == options, w, f"{list(b.options)} vs {options}")
        return "multi: the record carries no branch logits"

    def _check_multi_decision(self, q: Question, want: dict[str, Any], w: str) -> None:
        """The selection, threshold and set confidence basal derives from upstream's own branch probabilities."""
        p = want["probabilities"]
        r = self.report
        if not r.check("multi labels", list(p) == list(q.item.keys), w, f"{list(p)} vs {list(q.item.keys)}"):
            return
        dists = [Distribution([], np.array([p[k], 1 - p[k]]), np.array([p[k], 1 - p[k]])) for k in q.item.keys]
        have = msgspec.to_builtins(answer_multi(q, dists))
        have_text, want_text = (json.dumps(a, ensure_ascii=False)[:300] for a in (have, want))
        r.check("multi decision", _same_answer(have, want), w, f"basal {have_text} vs upstream {want_text}")

    def _check_answer_shape(
        self, q: Question, want: dict[str, Any], facts_limit: int | None, items: list, w: str
    ) -> None:
        """An answer whose numbers cannot be recomputed: its type, its keys and its evidence spans."""
        r = self.report
        keys = list(want.get("probabilities", {}))
        r.check("answer type", want.get("type") == q.kind, w, f"{want.get('type')} vs {q.kind}")
        r.check("answer keys", keys == list(q.item.keys), w, f"{keys} vs {list(q.item.keys)}")
        if "evidence" in want:
            item = next((it for it in items if it.get("name") == q.name), {})
            self.check_evidence(q.item.state_text, want["evidence"], item.get("evidence"), facts_limit, w)

    def _check_usage(
        self, plan: DecisionRequest, items: list, usage: dict[str, Any], served: dict[str, list], where: str
    ) -> None:
        """``usage``: questions and branches always; input tokens from the record's token ids where they are the
        served prompts', else by tokenizing basal's served prompts with ``--model``, else a named skip."""
        r = self.report
        if "questions" in usage:
            n = len(plan.questions)
            r.check("usage.questions", n == usage["questions"], where, f"{n} vs {usage['questions']}")
        if "branches" in usage:
            branches = sum(q.branch_count for q in plan.questions)
            r.check("usage.branches", branches == usage["branches"], where, f"{branches} vs {usage['branches']}")
        if "input_tokens" not in usage:
            return
        want = usage["input_tokens"]
        orders = [o for it in items for o in it.get("orders", [])]
        if len(served) == len(plan.questions) and all("input_ids" in o for o in orders):
            tokens = sum(len(o["input_ids"]) for o in orders)
        elif self.model is not None:
            bos, tok = self.model.bos, self.model.tokenizer
            prompts = [item.prompt(perm, bos) for q in plan.questions for item in q.asked for perm in item.orders]
            tokens = sum(len(tok.encode(p)) for p in prompts)
        else:
            r.skip("usage.input_tokens: served prompts (facts block, multi branches) are tokenized only with --model")
            return
        r.check("usage.input_tokens", tokens == want, where, f"{tokens} vs {want}")

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

    def check_orders(self, item: Item, rec: dict[str, Any], where: str, calibrated_as: str | None = None):
        """Prompts, permutations (and token ids with a model) of every order; then the distribution, with the
        temperature the exporter used for `calibrated_as` (default: the item's type)."""
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
            expected_t = float(self.temperatures.get(calibrated_as or item.type, 1.0))
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


def _same_error(error: RequestError, expected: Any) -> bool:
    """basal's refusal against an export's error: upstream's ``Kind: message`` string, or basal's status and body."""
    if isinstance(expected, dict):
        return (error.status, error.body) == (expected.get("status"), expected.get("body"))
    return error.upstream == expected


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


def manifest_temperatures(export: Path, model: str | None = None) -> dict[str, float] | None:
    """Calibration temperatures from the manifest of `model`'s export: basal's first line, else the manifest beside
    the export that names `model` (``manifest-1.5-mini.json`` beside ``manifest.json``), else ``manifest.json``."""
    manifests = export_manifests(export)
    if "" in manifests:
        return manifests[""]
    if model is not None and model in manifests:
        return manifests[model]
    return manifests.get("manifest.json")


def export_manifests(export: Path) -> dict[str, dict[str, float]]:
    """Temperatures of every manifest that can describe `export`, keyed "" (basal's own first line), by the model
    directory's name and by file name (``manifest*.json`` beside the export)."""
    with open(export, encoding="utf-8") as f:
        head = f.readline()
    try:
        first = json.loads(head) if head.strip() else None
    except json.JSONDecodeError:
        first = None
    if isinstance(first, dict) and set(first) == {"manifest"}:
        temps = _temperatures_of(first["manifest"])
        return {"": temps} if temps else {}
    found: dict[str, dict[str, float]] = {}
    for path in sorted(export.parent.glob("manifest*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        temps = _temperatures_of(data) if isinstance(data, dict) else None
        if not temps:
            continue
        found[path.name] = temps
        model = data.get("model") if isinstance(data.get("model"), dict) else {}
        for name in (model.get("name"), model.get("path"), model.get("repository")):
            if isinstance(name, str) and name:
                found.setdefault(Path(name).name, temps)
    return found


def _temperatures_of(manifest: dict[str, Any]) -> dict[str, float] | None:
    temps = (manifest.get("calibration") or {}).get("temperatures")
    return {k: float(v) for k, v in temps.items()} if isinstance(temps, dict) and temps else None
