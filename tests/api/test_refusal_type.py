"""The HTTP layer refuses with one type: every refusal is a `RequestError` built in `api/errors.py` and answered by
the app's one handler. Frozen from the source (no import runs): no module of `basal/api/` defines an exception type
of its own (but `ClientGone`, a client leaving, which is no refusal) or raises one of Litestar's; shown failing on
planted source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[2] / "basal" / "api"
NOT_A_REFUSAL = {"ClientGone"}


def _name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def other_refusal_types(source: str) -> list[str]:
    """What in `source` refuses with another type than `RequestError`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name not in NOT_A_REFUSAL:
            if any(_name(b).endswith(("Exception", "Error")) for b in node.bases):
                found.append(f"class {node.name}")
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            if _name(node.exc.func).endswith("Exception"):
                found.append(f"raise {_name(node.exc.func)}")
        elif isinstance(node, ast.ImportFrom) and node.module == "litestar.exceptions":
            found += [f"imports {a.name}" for a in node.names if a.name != "HTTPException"]  # handled, not raised
    return found


def test_every_refusal_of_the_http_layer_is_a_request_error():
    found = {str(p.relative_to(API)): other_refusal_types(p.read_text()) for p in sorted(API.rglob("*.py"))}
    assert {path: what for path, what in found.items() if what} == {}


@pytest.mark.parametrize(
    ("planted", "expected"),
    [
        ("class Refused(Exception):\n    pass\n", "class Refused"),
        ("from litestar.exceptions import NotFoundException\n", "imports NotFoundException"),
        ("def f():\n    raise PermissionDeniedException('no key')\n", "raise PermissionDeniedException"),
    ],
)
def test_another_refusal_type_is_caught(planted, expected):
    source = (API / "routes" / "batches.py").read_text() + "\n\n" + planted
    assert expected in other_refusal_types(source)
