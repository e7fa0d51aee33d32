"""Every flag of every subcommand says what it does, and what it is when not given."""

from __future__ import annotations

import argparse

from basal.cli import build_parser
from basal.core.request.limits import Limits
from basal.serve.config import ModelConfig, ServeConfig
from basal.serve.config_keys import default_of, fields
from basal.serve.flags import LIMIT_HELP, MODEL_FLAGS, SERVER_FLAGS, SWITCHES, shown_default


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_flag_has_help_and_every_value_flag_a_default():
    missing = []
    for command, parser in _subcommands().items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            text = action.help or ""
            flag = f"{command} {'/'.join(action.option_strings) or action.dest}"
            if not text.strip():
                missing.append(f"{flag}: no help")
            takes_value = action.option_strings and action.nargs != 0 and not action.required
            if takes_value and "default" not in text:
                missing.append(f"{flag}: no default shown")
    assert missing == []


def test_serve_help_shows_the_schema_defaults():
    serve = _subcommands()["serve"]
    helps = {a.dest: a.help for a in serve._actions}
    for struct, keys in ((ServeConfig, (*SERVER_FLAGS, *SWITCHES)), (ModelConfig, MODEL_FLAGS), (Limits, LIMIT_HELP)):
        for key in keys:
            default = default_of(struct, key)
            if default is not None:
                assert f"(default {shown_default(default)})" in helps[key], key
    assert set(LIMIT_HELP) == set(fields(Limits))  # a new limit gets a flag with help
    choices = {a.dest: a.choices for a in serve._actions}
    assert choices["dtype"] == ["bf16", "f16", "f32"] and choices["schedule"] == ["fifo", "hrrn"]


def test_every_subcommand_describes_itself_and_is_documented():
    """`basal CMD --help` opens with a description, and docs/operations.md's command table lists every CMD."""
    from pathlib import Path

    table = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    undescribed = [name for name, parser in _subcommands().items() if len((parser.description or "").split()) < 8]
    assert undescribed == []
    undocumented = [name for name in _subcommands() if f"| `basal {name}" not in table]
    assert undocumented == []
