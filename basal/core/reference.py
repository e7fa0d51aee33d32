"""`basal check-reference`: rebuild an upstream reference export and compare (basal-contract.md §6).

Two record kinds (one JSON object per line):

* System One requests — ``request`` plus the upstream ``to_items`` view per question (``items``: keys, options,
  language, state/question text, per option order the prompt, token ids, letter ids and letter logits,
  ``p_avg``/``p_cal``) and the upstream answer (``upstream_answer``) or its error (``upstream_error``).
* bench items — ``state``, ``question``, ``options`` (texts as shown), ``type``, ``lang``, ``orders``, ...

Every prompt is rebuilt from the record's own inputs with basal's contract code; from the export's letter
logits the distribution (to 1e-12) and the full upstream answer (to 1e-6: upstream computed it in float32) are
recomputed, and the packing of each question alone (prefix length, packed length, readout columns) is rebuilt
from the exported token ids. With a model directory, token ids and letter ids are compared too.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from basal.core.act import ActSpec, NeedsDeferAction, decide
from basal.core.contract import Question, parse_basal
from basal.core.decision import answer_basal, answer_multi, distribution
from basal.core.errors import RequestError
from basal.core.model_dir import ModelDir
from basal.core.prompt import Item, lang_of, option_orders
from basal.core.tree import pack_fields

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
            if "request" in record:
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
        try:
            plan = parse_basal(rec["request"], lambda _model: "reference", check_evidence=False)
        except RequestError as e:
            expected = rec.get("upstream_error") or rec.get("to_items_error")
            if e.upstream and e.upstream.startswith("unsupported:"):
                r.skip("request uses a basal-1.5 extension (multi/act/facts/evidence) that basal does not support yet")
                return
            r.check(
                "upstream error",
                expected is not None and e.upstream == expected,
                where,
                f"basal: {e.upstream!r}, upstream: {expected!r}",
            )
            return
        if "upstream_error" in rec:
            r.check("upstream error", False, where, f"upstream rejected it ({rec['upstream_error']}), basal accepts it")
            return
        questions = {q.name: q for q in plan.questions}
        items = rec.get("items", [])
        if not items and "upstream_answer" not in rec:
            r.skip("record without items or answer (request inputs only)")
            return
        answers = rec.get("upstream_answer", {}).get("answers", {})
        if any(q.kind in ("multi", "act") for q in plan.questions) or any("evidence" in a for a in answers.values()):
            self.check_extension_request(plan.questions, items, rec, where)
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
        if "upstream_answer" in rec and all(d is not None for d in dists.values()):
            self.check_answer(plan.questions, dists, items, rec["upstream_answer"], where)

    def check_extension_request(self, questions: tuple[Question, ...], items: list[dict], rec: dict, where: str):
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
        if "upstream_answer" in rec and all(d is not None for ds in dists.values() for d in ds):
            for q in questions:
                want = rec["upstream_answer"].get("answers", {}).get(q.name)
                if want is not None:
                    self._check_any_answer(q, dists[q.name], want, items, f"{where}/{q.name}")
            usage = rec["upstream_answer"].get("usage", {})
            if "branches" in usage:
                branches = sum(q.branch_count for q in questions)
                r.check("usage.branches", branches == usage["branches"], where, f"{branches} vs {usage['branches']}")
            if "input_tokens" in usage and all("input_ids" in o for it in items for o in it.get("orders", [])):
                tokens = sum(len(o["input_ids"]) for it in items for o in it["orders"])
                r.check("usage.input_tokens", tokens == usage["input_tokens"], where)

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

    def _check_any_answer(self, q: Question, dists: list, want: dict[str, Any], items: list, w: str) -> None:
        """One upstream answer of any type: decisions exact, numbers to float32 precision; evidence skipped."""
        r = self.report
        want = dict(want)
        if want.pop("evidence", None) is not None:
            r.skip("evidence spans (basal computes no evidence)")
        if q.kind == "multi":
            have = msgspec.to_builtins(answer_multi(q, dists))
        elif q.kind == "act":
            have = self._act_answer(q, dists[0], want, items)
            if have is None:
                r.check("upstream answer", False, w, "basal refuses it: max_error needs a defer action")
                return
        else:
            have = msgspec.to_builtins(answer_basal(q, dists[0]))
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
            have = msgspec.to_builtins(decide(p, spec, thresholds or {}, calibrated))
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

    def check_answer(self, questions: tuple[Question, ...], dists, items, expected: dict[str, Any], where: str):
        r = self.report
        got = {q.name: msgspec.to_builtins(answer_basal(q, dists[q.name])) for q in questions}
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
                list(have["probabilities"].values()), list(want["probabilities"].values()), UPSTREAM
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


def _first_difference(a: str, b: str) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"at char {n}: {a[max(0, n - 20) : n + 20]!r} vs {b[max(0, n - 20) : n + 20]!r}"


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                yield n, json.loads(line)


def manifest_temperatures(export: Path) -> dict[str, float] | None:
    """Calibration temperatures from the ``manifest.json`` beside an export, if there is one."""
    manifest = export.parent / "manifest.json"
    if not manifest.is_file():
        return None
    temps = json.loads(manifest.read_text(encoding="utf-8")).get("calibration", {}).get("temperatures")
    return {k: float(v) for k, v in temps.items()} if temps else None
