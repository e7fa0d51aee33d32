"""`basal compare A.jsonl B.jsonl`: two exports of the same request file, record by record.

Records are matched by id (bench items without one by index), items within a record by name and position.
Reported: prompts / token ids / letter ids / packing identical, letter logits bitwise identical (orders and
values), max and p99 |Δ letter logit|, max total variation of ``p_cal``, decisions (argmax of ``p_cal``) with
every flip and its margins, answers identical (``usage.latency_ms`` aside), and requests that fail in one
export only. Works on basal exports and upstream exports alike (one format, docs/contract.md §5).

Policies (the exit status): ``decisions`` (default) — same records, same inputs, same errors, same decisions;
``tolerance`` (``max_logit_diff``) — and every |Δ letter logit| ≤ the tolerance; ``bitwise`` — and every letter
logit the same bits, every answer identical. Exports of different models (by the model hashes in their
manifests) are refused unless ``allow_different_models``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from basal.export.format import ExportFile, ExportFileError, read_export, without_latency

SHOW = 10  # examples listed per kind of difference


class DifferentModels(ExportFileError):
    """The two exports were made with different models (their manifests' hashes differ)."""


def _bits(values: list[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).astype(np.float32).view(np.uint32)


@dataclass
class Comparison:
    a: dict[str, Any]
    b: dict[str, Any]
    policy: str
    max_logit_diff: float | None
    model: dict[str, Any]
    in_both: int = 0
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    unmatched_items: list[str] = field(default_factory=list)
    items: int = 0
    inputs_identical: int = 0
    inputs_differing: list[str] = field(default_factory=list)
    orders: int = 0
    orders_bitwise: int = 0
    values: int = 0
    values_differing: int = 0
    max_abs_diff: float = 0.0
    p99_abs_diff: float = 0.0
    max_tv: float = 0.0
    decisions: int = 0
    flips: list[dict[str, Any]] = field(default_factory=list)
    answers: int = 0
    answers_differing: list[str] = field(default_factory=list)
    errors_both: int = 0
    errors_differing: list[str] = field(default_factory=list)
    failed_one_side: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    compute_differences: list[str] = field(default_factory=list)  # what may explain differing bits

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "model": self.model,
            "compute_differences": self.compute_differences,
            "records": {"in_both": self.in_both, "only_in_a": self.only_a, "only_in_b": self.only_b},
            "inputs": {
                "items": self.items,
                "identical": self.inputs_identical,
                "differing": self.inputs_differing,
                "unmatched_items": self.unmatched_items,
            },
            "logits": {
                "orders": self.orders,
                "orders_bitwise_identical": self.orders_bitwise,
                "values": self.values,
                "values_differing": self.values_differing,
                "max_abs_diff": self.max_abs_diff,
                "p99_abs_diff": self.p99_abs_diff,
            },
            "p_cal": {"max_total_variation": self.max_tv},
            "decisions": {
                "compared": self.decisions,
                "identical": self.decisions - len(self.flips),
                "flips": self.flips,
            },
            "answers": {
                "compared": self.answers,
                "identical": self.answers - len(self.answers_differing),
                "differing": self.answers_differing,
            },
            "errors": {
                "in_both": self.errors_both,
                "differing": self.errors_differing,
                "failed_in_one_export_only": self.failed_one_side,
            },
            "policy": {"name": self.policy, "max_logit_diff": self.max_logit_diff, "ok": self.ok},
            "failures": self.failures,
        }

    def table(self) -> str:
        def side(name: str, s: dict[str, Any]) -> str:
            backend = s.get("backend") or {}
            how = " ".join(str(backend.get(k)) for k in ("name", "device", "dtype") if backend.get(k))
            return f"{name}: {s['path']}  {how or '(no manifest)'}  {s.get('batching') or ''}".rstrip()

        rows = [
            ("records in both", f"{self.in_both}  (only in A: {len(self.only_a)}, only in B: {len(self.only_b)})"),
            ("prompts and token ids identical", f"{self.inputs_identical}/{self.items} items"),
            ("letter logits bitwise identical", f"{self.orders_bitwise}/{self.orders} orders"),
            ("letter logit values differing", f"{self.values_differing}/{self.values}"),
            ("max |Δ letter logit|", f"{self.max_abs_diff:.3g}"),
            ("p99 |Δ letter logit|", f"{self.p99_abs_diff:.3g}"),
            ("max total variation of p_cal", f"{self.max_tv:.3g}"),
            ("decisions identical", f"{self.decisions - len(self.flips)}/{self.decisions}"),
            ("answers identical", f"{self.answers - len(self.answers_differing)}/{self.answers}"),
            ("requests failing in both / one only", f"{self.errors_both} / {len(self.failed_one_side)}"),
        ]
        width = max(len(r[0]) for r in rows)
        lines = [side("A", self.a), side("B", self.b), f"model: {self.model['note']}"]
        if self.compute_differences:
            lines.append("how the two were computed differs (this can explain differing bits):")
            lines += [f"  {d}" for d in self.compute_differences[:SHOW]]
            if len(self.compute_differences) > SHOW:
                lines.append(f"  ... and {len(self.compute_differences) - SHOW} more")
        lines.append("")
        lines += [f"{name:<{width}}  {value}" for name, value in rows]
        for flip in self.flips[:SHOW]:
            lines.append(
                f"  flip {flip['id']}/{flip['item']}: A {flip['a']} (margin {flip['margin_a']:.3g}), "
                f"B {flip['b']} (margin {flip['margin_b']:.3g})"
            )
        for kind, found in (
            ("inputs differ", self.inputs_differing),
            ("answer differs", self.answers_differing),
            ("error differs", self.errors_differing),
            ("fails in one export only", self.failed_one_side),
            ("item in one export only", self.unmatched_items),
        ):
            lines += [f"  {kind}: {x}" for x in found[:SHOW]]
            if len(found) > SHOW:
                lines.append(f"  {kind}: ... and {len(found) - SHOW} more")
        policy = self.policy + (f" (max |Δ logit| {self.max_logit_diff:g})" if self.policy == "tolerance" else "")
        lines.append("")
        lines.append(f"policy {policy}: " + ("PASS" if self.ok else "FAIL"))
        lines += [f"  - {f}" for f in self.failures]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------


def _describe(f: ExportFile) -> dict[str, Any]:
    m = f.manifest or {}
    backend = m.get("backend") if isinstance(m.get("backend"), dict) else {}
    return {
        "path": str(f.path),
        "records": len(f.records),
        "backend": {k: backend.get(k) for k in ("name", "device", "device_name", "dtype", "mode") if k in backend},
        "batching": m.get("batching"),
        "model": (m.get("model") or {}).get("name") or (m.get("model") or {}).get("repository"),
        "date": m.get("date"),
    }


def compute_differences(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """Where the manifests' backends say they computed differently: name, device, dtype, device name, batching,
    and the `compute` facts the torch backend records (threads, GEMM row chunks per shape, the attention tile
    GEMMs' rows, compiled CPU kernels), plus the torch/MLX/Triton versions. One "key: A vs B" line each."""

    def facts(m: dict[str, Any] | None) -> dict[str, Any]:
        m = m or {}
        backend = m.get("backend") if isinstance(m.get("backend"), dict) else {}
        versions = m.get("versions") if isinstance(m.get("versions"), dict) else {}
        flat = {k: v for k, v in backend.items() if k != "compute"}
        flat["batching"] = m.get("batching")
        flat |= {f"versions.{k}": versions.get(k) for k in ("torch", "mlx", "triton") if k in versions}
        flat |= _flatten("compute", backend.get("compute") or {})
        return flat

    fa, fb = facts(a), facts(b)
    return [
        f"{k}: {fa.get(k, '(absent)')} vs {fb.get(k, '(absent)')}"
        for k in sorted(fa.keys() | fb.keys())
        if fa.get(k) != fb.get(k)
    ]


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out |= _flatten(f"{prefix}.{k}", v)
        return out
    return {prefix: value}


def model_identity(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any]:
    """Same model? From the SHA-256 hashes both manifests hold (None: cannot tell)."""
    ma, mb = (a or {}).get("model"), (b or {}).get("model")
    if not isinstance(ma, dict) or not isinstance(mb, dict):
        which = " and ".join(n for n, m in (("A", ma), ("B", mb)) if not isinstance(m, dict))
        return {"same": None, "note": f"not checked: no model section in the manifest of {which}"}
    hashes = {k: (ma[k], mb[k]) for k in ma.keys() & mb.keys() if k.endswith("_sha256")}
    files_a, files_b = ma.get("files") or {}, mb.get("files") or {}
    hashes |= {f"files/{k}": (files_a[k], files_b[k]) for k in files_a.keys() & files_b.keys()}
    if not hashes:
        return {"same": None, "note": "not checked: the manifests have no model hashes in common"}
    differ = sorted(k for k, (x, y) in hashes.items() if x != y)
    if differ:
        return {"same": False, "note": f"DIFFERENT models ({', '.join(differ)} differ)", "differing": differ}
    return {"same": True, "note": f"same model ({len(hashes)} hashes agree)"}


def _view(record: dict[str, Any]) -> tuple[list[tuple[str, dict[str, Any]]], Any, Any]:
    """(items keyed by name#occurrence, answer, error) of a request record or a bench item."""
    if "request" in record or "items" in record:
        items = [(str(it.get("name")), it) for it in record.get("items") or []]
        answer = record.get("answer", record.get("upstream_answer"))
        error = record.get("error", record.get("upstream_error"))
    else:
        items = [("", record)] if "orders" in record else []
        answer, error = None, record.get("error")
    seen: dict[str, int] = {}
    keyed = []
    for name, it in items:
        seen[name] = seen.get(name, 0) + 1
        keyed.append((name if seen[name] == 1 else f"{name}#{seen[name]}", it))
    return keyed, answer, error


def _same_error(x: Any, y: Any) -> bool:
    """basal's error object vs another, or vs upstream's error string (``"ValueError: ..."``)."""
    if isinstance(x, dict) and isinstance(y, dict):
        return (x.get("status"), x.get("body")) == (y.get("status"), y.get("body"))
    if isinstance(x, str) and isinstance(y, str):
        return x == y
    named = x if isinstance(x, dict) else y
    text = y if isinstance(x, dict) else x
    return named.get("upstream") == text


def _inputs_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    oa, ob = a.get("orders") or [], b.get("orders") or []
    if len(oa) != len(ob):
        return f"{len(oa)} vs {len(ob)} option orders"
    for name in ("perm", "prompt", "input_ids", "letter_ids"):
        if any(x.get(name) != y.get(name) for x, y in zip(oa, ob, strict=True)):
            return name
    if a.get("pack") != b.get("pack"):
        return "pack"
    if a.get("keys", []) != b.get("keys", []):
        return "keys"
    return None


def compare_exports(
    a: ExportFile,
    b: ExportFile,
    bitwise: bool = False,
    max_logit_diff: float | None = None,
    allow_different_models: bool = False,
) -> Comparison:
    identity = model_identity(a.manifest, b.manifest)
    if identity["same"] is False and not allow_different_models:
        raise DifferentModels(
            f"{a.path} and {b.path} were made with different models ({', '.join(identity['differing'])} differ "
            "in their manifests); compare exports of one model, or pass --allow-different-models to compare anyway"
        )
    policy = "bitwise" if bitwise else ("tolerance" if max_logit_diff is not None else "decisions")
    c = Comparison(_describe(a), _describe(b), policy, max_logit_diff, identity)
    c.compute_differences = compute_differences(a.manifest, b.manifest)
    c.only_a = [k for k in a.records if k not in b.records]
    c.only_b = [k for k in b.records if k not in a.records]
    diffs: list[np.ndarray] = []
    for key, ra in a.records.items():
        rb = b.records.get(key)
        if rb is None:
            continue
        c.in_both += 1
        items_a, answer_a, error_a = _view(ra)
        items_b, answer_b, error_b = _view(rb)
        if error_a is not None or error_b is not None:
            if error_a is None or error_b is None:
                c.failed_one_side.append(f"{key} (fails in {'A' if error_a is not None else 'B'})")
            else:
                c.errors_both += 1
                if not _same_error(error_a, error_b):
                    c.errors_differing.append(key)
            continue
        by_name_b = dict(items_b)
        c.unmatched_items += [f"{key}/{n} (A only)" for n, _ in items_a if n not in by_name_b]
        c.unmatched_items += [f"{key}/{n} (B only)" for n, _ in items_b if n not in dict(items_a)]
        for name, ia in items_a:
            ib = by_name_b.get(name)
            if ib is not None:
                _compare_item(c, key, name, ia, ib, diffs)
        if answer_a is not None and answer_b is not None:
            c.answers += 1
            if without_latency(answer_a) != without_latency(answer_b):
                c.answers_differing.append(key)
    if diffs:
        every = np.concatenate(diffs)
        c.max_abs_diff = float(every.max())
        c.p99_abs_diff = float(np.percentile(every, 99))
    c.failures = _policy_failures(c)
    return c


def _compare_item(
    c: Comparison, key: str, name: str, ia: dict[str, Any], ib: dict[str, Any], diffs: list[np.ndarray]
) -> None:
    where = f"{key}/{name}" if name else key
    c.items += 1
    difference = _inputs_difference(ia, ib)
    if difference is None:
        c.inputs_identical += 1
    else:
        c.inputs_differing.append(f"{where} ({difference})")
    for oa, ob in zip(ia.get("orders") or [], ib.get("orders") or [], strict=False):
        la, lb = oa.get("letter_logits"), ob.get("letter_logits")
        if la is None or lb is None:
            continue
        c.orders += 1
        if len(la) != len(lb):
            continue
        ba, bb = _bits(la), _bits(lb)
        differ = ba != bb
        c.values += len(la)
        c.values_differing += int(differ.sum())
        c.orders_bitwise += not differ.any()
        delta = np.abs(ba.view(np.float32).astype(np.float64) - bb.view(np.float32).astype(np.float64))
        diffs.append(np.where(differ, np.nan_to_num(delta, nan=np.inf), 0.0))
    pa, pb = ia.get("p_cal"), ib.get("p_cal")
    if pa is None or pb is None or len(pa) != len(pb):
        return
    pa, pb = np.asarray(pa, dtype=np.float64), np.asarray(pb, dtype=np.float64)
    c.decisions += 1
    c.max_tv = max(c.max_tv, float(0.5 * np.abs(pa - pb).sum()))
    top_a, top_b = int(np.argmax(pa)), int(np.argmax(pb))
    if top_a != top_b:
        keys = ia.get("keys") or [str(i) for i in range(len(pa))]
        c.flips.append(
            {
                "id": key,
                "item": name,
                "a": keys[top_a],
                "b": keys[top_b],
                "margin_a": float(pa[top_a] - pa[top_b]),
                "margin_b": float(pb[top_b] - pb[top_a]),
            }
        )


def _policy_failures(c: Comparison) -> list[str]:
    out = []
    if not c.in_both:
        out.append("the exports have no record ids in common")
    for name, missing in (("A", c.only_a), ("B", c.only_b)):
        if missing:
            out.append(f"{len(missing)} records only in {name}: {', '.join(missing[:SHOW])}")
    if c.unmatched_items:
        out.append(f"{len(c.unmatched_items)} items in one export only")
    if c.inputs_differing:
        out.append(f"{len(c.inputs_differing)} items differ in prompts, token ids, letter ids or packing")
    if c.failed_one_side:
        out.append(f"{len(c.failed_one_side)} requests fail in one export only: {', '.join(c.failed_one_side[:SHOW])}")
    if c.errors_differing:
        out.append(f"{len(c.errors_differing)} requests fail differently")
    if c.flips:
        out.append(f"{len(c.flips)} decisions differ")
    if c.policy == "tolerance" and c.max_abs_diff > c.max_logit_diff:
        out.append(f"max |Δ letter logit| {c.max_abs_diff:.3g} > {c.max_logit_diff:g}")
    if c.policy == "bitwise":
        if c.values_differing:
            out.append(
                f"{c.values_differing} of {c.values} letter logits differ in their bits "
                f"({c.orders - c.orders_bitwise} of {c.orders} orders)"
            )
        if c.orders != c.orders_bitwise and not c.values_differing:
            out.append(f"{c.orders - c.orders_bitwise} orders have letter logits of different lengths")
        if c.answers_differing:
            out.append(f"{len(c.answers_differing)} answers differ")
    return out


def compare_files(
    a: str | Path,
    b: str | Path,
    bitwise: bool = False,
    max_logit_diff: float | None = None,
    allow_different_models: bool = False,
) -> Comparison:
    """Read and compare two export files; `ExportFileError` (or `DifferentModels`) if they cannot be compared."""
    return compare_exports(read_export(a), read_export(b), bitwise, max_logit_diff, allow_different_models)


def dumps(c: Comparison) -> str:
    return json.dumps(c.to_json(), ensure_ascii=False, indent=1)
