"""What a start imports: nothing its command does not use (each import is paid at every start of every replica)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from litestar import Litestar

from basal.api.app import MsgspecLitestar

ROOT = Path(__file__).resolve().parents[1]


def _modules_after(code: str, tmp_path: Path) -> dict:
    """Run `code` in a fresh interpreter (this checkout, a private BASAL_HOME) and read the JSON it prints last."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BASAL_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_command_line_reads_yaml_only_for_a_configuration_file(tmp_path):
    """`basal decide` parses its flags without PyYAML; reading a configuration file imports it then."""
    config = tmp_path / "basal.yaml"
    config.write_text("max_inflight: 7\n")
    seen = _modules_after(
        "import json, sys\n"
        "from basal.cli import build_parser\n"
        "build_parser().parse_args(['decide', 'examples/request.json'])\n"
        "before = 'yaml' in sys.modules\n"
        "from basal.serve.config import load_config\n"
        f"limit = load_config({str(config)!r}).max_inflight\n"
        "print(json.dumps({'before': before, 'after': 'yaml' in sys.modules, 'limit': limit}))",
        tmp_path,
    )
    assert seen == {"before": False, "after": True, "limit": 7}


@pytest.mark.skipif(importlib.util.find_spec("pydantic") is None, reason="pydantic is not installed here")
def test_the_app_leaves_out_litestars_pydantic_and_attrs_plugins(tmp_path):
    """Litestar adds them whenever pydantic and attrs are installed; basal's types are msgspec Structs."""
    seen = _modules_after(
        "import json, sys\n"
        "from basal.api.app import create_app\n"
        "from basal.serve.config import ModelConfig, ServeConfig\n"
        "from basal.serve.server import pending_engines\n"
        "engines, _ = pending_engines(ServeConfig(models=[ModelConfig(path='demo')]))\n"
        "app = create_app(engines)\n"
        "print(json.dumps({'modules': [m for m in ('pydantic', 'attrs') if m in sys.modules],\n"
        "                  'plugins': sorted(type(p).__name__ for p in app.plugins)}))",
        tmp_path,
    )
    assert seen["modules"] == [] and "MsgspecDIPlugin" in seen["plugins"]
    assert not [p for p in seen["plugins"] if "Pydantic" in p or "Attrs" in p], seen["plugins"]


def test_the_override_still_names_litestars_method():
    """If Litestar renames the method, the override would silently stop applying: this fails first."""
    assert "_get_default_plugins" in vars(Litestar) and "_get_default_plugins" in vars(MsgspecLitestar)
