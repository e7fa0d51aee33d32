"""The layout rules that the folders promise, read from the source (no import runs): which package may import which.

`violations(root)` lists every import that breaks a rule in the `basal` tree under `root`; tests/test_layout.py runs
it on the package and, as its negative control, on a copy with a wrong import planted.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.gpu.image_guard import IMAGE_LACKS  # what the GPU machine's image lacks

# basal/core/ reads request -> model -> engine -> packing -> decision; the folder order (what each may import):
CORE_ORDER: dict[str, frozenset[str]] = {
    "model": frozenset(),
    "facts": frozenset({"model"}),
    "request": frozenset({"model", "facts"}),
    "decision": frozenset({"model", "request"}),
    "packing": frozenset({"model"}),
    "engine": frozenset({"model", "facts", "request", "decision", "packing"}),
}
CORE_ROOT = frozenset({"errors", "home"})  # core's own base modules: every core folder may import them
OUTSIDE_CORE = (
    "basal.api",
    "basal.backends",
    "basal.batch",
    "basal.serve",
    "basal.export",
    "basal.ray_serve",
    "basal.benchsuite",
    "basal.cli",
    "basal.doctor",
    "basal.progress",
    "basal.observability",
    "basal.ownership",
)

# The whole package: what a package must never import (its own folder's rules above aside). The HTTP front never
# touches a backend (it asks the engines); a backend computes and knows nothing of HTTP, serving or the Batch API;
# the Batch API runs lines through a `Decide` function and imports nothing of the engine, so it runs the same bytes
# online and offline.
NEVER: dict[str, tuple[str, ...]] = {
    "basal.api": ("basal.backends",),
    "basal.backends": ("basal.api", "basal.serve", "basal.batch", "basal.ray_serve"),
    "basal.batch": ("basal.core", "basal.backends", "basal.api", "basal.serve", "basal.ray_serve", "basal.export"),
}
NEVER_EXCEPT: dict[str, tuple[str, ...]] = {  # plain base modules a rule above lets through
    "basal.batch": ("basal.core.errors", "basal.core.home"),
}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in a file, at any depth (function-level imports count too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from basal.core import model` imports basal.core.model
                yield node.lineno, f"{node.module}.{alias.name}"


def module_of(root: Path, path: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def violations(root: Path) -> list[str]:
    """Every broken rule in `root`/basal, as "file:line: what"."""
    out = []
    files = sorted((root / "basal").rglob("*.py"))
    graph: dict[str, set[str]] = {}
    for path in files:
        mod = module_of(root, path)
        graph[mod] = set()
        for line, imported in imports(path):
            graph[mod].add(imported)
            where = f"{path.relative_to(root)}:{line}"
            for package, never in NEVER.items():
                exempt = any(within(imported, ok) for ok in NEVER_EXCEPT.get(package, ()))
                if within(mod, package) and any(within(imported, n) for n in never) and not exempt:
                    out.append(f"{where}: {package.removeprefix('basal.')} imports {imported}")
            if mod.startswith("basal.core."):
                if imported.startswith(OUTSIDE_CORE):
                    out.append(f"{where}: core imports {imported}")
                    continue
                folder = mod.split(".")[2]
                if folder in CORE_ORDER and imported.startswith("basal.core."):
                    target = imported.split(".")[2]
                    if target != folder and target not in CORE_ROOT and target not in CORE_ORDER[folder]:
                        out.append(f"{where}: core/{folder} imports core/{target} ({imported})")
    out += [f"{m}: the GPU path reaches {bad}" for m, bad in gpu_closure_leaks(graph)]
    return out


def gpu_closure_leaks(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(GPU module, forbidden import) for every import the GPU path's modules reach through basal's own modules."""
    leaks = []
    for start in sorted(m for m in graph if m.startswith("basal.backends.cuda.gpu")):
        seen, todo = set(), [start]
        while todo:
            mod = todo.pop()
            if mod in seen:
                continue
            seen.add(mod)
            for imported in graph.get(mod, ()):
                if imported.split(".")[0] in IMAGE_LACKS:
                    leaks.append((start, f"{imported} (imported by {mod})"))
                for candidate in (imported, imported.rpartition(".")[0]):  # a module, or a name in one
                    if candidate in graph:
                        todo.append(candidate)
                        for parent in _parents(candidate):  # importing a module runs its packages' __init__
                            todo.append(parent)
    return leaks


def _parents(mod: str) -> list[str]:
    parts = mod.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]
