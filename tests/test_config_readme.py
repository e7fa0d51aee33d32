"""The configuration pages' YAML examples hold every configuration key, and each of them is a valid configuration.

The examples live in docs/configuration.md (every key but `ray:`, then a models example and limits) and
docs/ray.md (the `ray:` section).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from basal.serve.config import ServeConfig, parse_config
from basal.serve.config_keys import key_tree

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = [DOCS / "configuration.md", DOCS / "ray.md"]


def _keys(data: object, prefix: str = "") -> set[str]:
    out: set[str] = set()
    items = data if isinstance(data, list) else [data]
    for item in items:
        if isinstance(item, dict):
            for k, v in item.items():
                out.add(prefix + k)
                out |= _keys(v, f"{prefix}{k}.")
    return out


def _schema_keys(tree: dict, prefix: str = "") -> set[str]:
    return {prefix + k for k in tree} | {x for k, sub in tree.items() for x in _schema_keys(sub, f"{prefix}{k}.")}


def _config_blocks() -> list[dict]:
    """Every ```yaml block of the pages whose keys are configuration keys (all of them, today), in page order."""
    texts = [page.read_text(encoding="utf-8") for page in PAGES]
    blocks = [yaml.safe_load(b) for text in texts for b in re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)]
    top = set(key_tree(ServeConfig))
    return [b for b in blocks if isinstance(b, dict) and set(b) <= top]


def test_the_documented_yaml_holds_every_key_and_parses(monkeypatch):
    monkeypatch.delenv("BASAL_ADDR", raising=False)
    blocks = _config_blocks()
    assert len(blocks) >= 3  # every key, limits, ray
    for block in blocks:
        parse_config(block, "docs")
    schema = _schema_keys(key_tree(ServeConfig))
    found = set().union(*(_keys(b) for b in blocks))
    assert found == schema, f"missing in the docs: {sorted(schema - found)}; unknown: {sorted(found - schema)}"
    serving = blocks[0]  # configuration.md's "Every key" example: every key but the ray: section
    assert _keys(serving) == {k for k in schema if not k.startswith("ray")}


def test_the_key_tree_follows_the_structs():
    tree = key_tree(ServeConfig)
    assert "name" in tree["models"] and "max_questions" in tree["limits"]
    assert set(tree["ray"]["autoscaling"]) == {"min_replicas", "max_replicas", "target_ongoing_requests"}
