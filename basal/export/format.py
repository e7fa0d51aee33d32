"""The reference export format (docs/contract.md §5), written by `basal export` and read by `basal compare`.

An export is JSONL. basal writes a manifest as its first line (``{"manifest": {...}}``); upstream exports keep it
in a ``manifest.json`` beside the file. Then one record per input line, in input order:

* a request: ``id``, ``dialect``, ``request`` and per model question its ``items`` (name, type, keys, options,
  lang, state_text, question_text, ``orders`` with perm / prompt / input_ids / letter_ids / letter_logits / probs,
  ``pack``, p_avg, temperature, p_cal), then the full ``answer`` in the request's dialect — or its ``error``
  (``status``, ``body`` and, where upstream names it, ``upstream``). Upstream writes ``upstream_answer`` /
  ``upstream_error`` (a string) instead.
* a bench item: its inputs (state, question, options, type, ...), ``orders``, ``pack``, p_avg, argmax_avg,
  temperature, p_cal, argmax_cal.

Letter logits are float32 values written as the shortest decimal of the equal float64, so they read back to the
same bits. Probabilities are float64 host math. ``usage.latency_ms`` is written as 0: an export holds results,
not timings, so that the same command twice gives the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from basal.core.decision.distribution import Distribution, distribution
from basal.core.model.prompt import Item
from basal.core.packing.tree import pack_fields

FORMAT = "basal-export/1"


class ExportFileError(ValueError):
    """An export file that cannot be read or used; the message says which file, which line, and what to do."""


# ---------------------------------------------------------------------------------------------------------------
# Writing


def float32_values(logits: Sequence[float] | np.ndarray) -> list[float]:
    """float32 logits -> Python floats equal to them (their repr reads back to the same float32 bits)."""
    return [float(v) for v in np.asarray(logits, dtype=np.float32)]


def float64_values(p: Sequence[float] | np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(p, dtype=np.float64)]


def encode_line(record: dict[str, Any]) -> str:
    """One record as one JSONL line: keys in insertion order, UTF-8 text as is, nothing machine-dependent."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def item_fields(
    item: Item,
    bos: str,
    input_ids: Sequence[Sequence[int]],
    letter_ids: Sequence[int],
    letter_logits: Sequence[np.ndarray],
    temperature: float,
) -> tuple[dict[str, Any], Distribution]:
    """What the model computed for one question: ``orders``, ``pack``, ``p_avg``, ``temperature``, ``p_cal``."""
    k = len(item.options)
    perms = item.orders
    logits = [np.asarray(lg, dtype=np.float32)[:k] for lg in letter_logits]
    dist = distribution(logits, perms, temperature)
    orders = [
        {
            "perm": list(perm),
            "prompt": item.prompt(perm, bos),
            "input_ids": list(ids),
            "letter_ids": list(letter_ids[:k]),
            "letter_logits": float32_values(lg),
            "probs": float64_values(p),
        }
        for perm, ids, lg, p in zip(perms, input_ids, logits, dist.probs, strict=True)
    ]
    fields = {
        "orders": orders,
        "pack": pack_fields([list(ids) for ids in input_ids]),
        "p_avg": float64_values(dist.p_avg),
        "temperature": float(temperature),
        "p_cal": float64_values(dist.p_cal),
    }
    return fields, dist


def question_item(item: Item, fields: dict[str, Any]) -> dict[str, Any]:
    """One entry of a request record's ``items``: the question as the model sees it, then what it computed.

    A request holds one item per model question today. A question asked in several prompts (a basal-1.5
    extension: one per option, or several rounds) adds one item per prompt set, with its own fields beside
    ``name``; `basal compare` matches items by name and position, so such items need nothing else.
    """
    return {
        "name": item.name,
        "type": item.type,
        "keys": list(item.keys),
        "options": list(item.options),
        "lang": item.lang,
        "state_text": item.state_text,
        "question_text": item.question_text,
        **fields,
    }


def without_latency(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer with ``usage.latency_ms`` set to 0 (timings differ run to run; results must not)."""
    usage = answer.get("usage")
    if isinstance(usage, dict) and "latency_ms" in usage:
        answer = {**answer, "usage": {**usage, "latency_ms": 0.0}}
    if isinstance(usage, dict) and "cached_tokens" in usage:  # what the state cache held: history, not a result
        answer = {**answer, "usage": {k: v for k, v in answer["usage"].items() if k != "cached_tokens"}}
    return answer


# ---------------------------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class ExportFile:
    """An export read back: its manifest (None if it has none) and its records by key, in file order."""

    path: Path
    manifest: dict[str, Any] | None
    records: dict[str, dict[str, Any]]


def record_key(record: dict[str, Any]) -> str | None:
    """How records are matched across exports: ``id``, or ``#index`` for bench items without one."""
    if record.get("id") is not None:
        return str(record["id"])
    if record.get("index") is not None:
        return f"#{record['index']}"
    return None


def is_manifest_line(record: Any) -> bool:
    return isinstance(record, dict) and set(record) == {"manifest"}


def read_lines(path: Path) -> list[tuple[int, Any]]:
    """(line number, JSON value) of every non-empty line; a line that is not JSON is an `ExportFileError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ExportFileError(f"{path}: no such file") from e
    except UnicodeDecodeError as e:
        raise ExportFileError(f"{path}: not UTF-8 text ({e})") from e
    out = []
    lines = text.split("\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            cut = n == len(lines)  # the last line has no newline: the writer stopped in the middle of it
            hint = (
                "the file was cut short; an interrupted `basal export` continues when run again with the same arguments"
                if cut
                else "the file is damaged"
            )
            raise ExportFileError(f"{path}:{n}: not valid JSON ({e.msg}): {hint}") from e
    return out


def read_export(path: str | Path) -> ExportFile:
    """Read an export (basal's or upstream's). Records must be JSON objects with distinct keys."""
    path = Path(path)
    lines = read_lines(path)
    manifest = None
    if lines and is_manifest_line(lines[0][1]):
        manifest = lines.pop(0)[1]["manifest"]
    else:
        beside = path.parent / "manifest.json"  # the upstream layout
        if beside.is_file():
            try:
                manifest = json.loads(beside.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ExportFileError(f"{beside}: not valid JSON ({e.msg})") from e
    records: dict[str, dict[str, Any]] = {}
    first_line: dict[str, int] = {}
    for n, record in lines:
        if not isinstance(record, dict):
            raise ExportFileError(f"{path}:{n}: a record must be a JSON object")
        key = record_key(record)
        if key is None:
            raise ExportFileError(f"{path}:{n}: the record has neither an id nor an index to match it by")
        if key in records:
            raise ExportFileError(f"{path}:{n}: id {key!r} appears twice (first on line {first_line[key]})")
        records[key], first_line[key] = record, n
    announced = (manifest or {}).get("inputs", {}).get("count")
    if isinstance(announced, int) and len(records) < announced:
        raise ExportFileError(
            f"{path}: {len(records)} of the {announced} records its manifest announces; the export was interrupted "
            "— run the same `basal export` command again to finish it"
        )
    return ExportFile(path, manifest, records)
