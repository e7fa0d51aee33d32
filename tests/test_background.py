"""tests/background.py: a command's whole output comes back (more than a pipe holds), a command past its timeout
is killed and says so, and a command nobody started at collection starts when its test asks for it."""

from __future__ import annotations

import sys

from tests import background


def chatty() -> background.Command:
    code = "import sys; sys.stdout.write('x' * 300_000); sys.stderr.write('done'); sys.exit(3)"
    return background.Command((sys.executable, "-c", code), background.environment(), ".", 60)


def sleepy() -> background.Command:
    return background.Command((sys.executable, "-c", "import time; time.sleep(30)"), background.environment(), ".", 1)


def test_the_whole_output_and_the_exit_code_come_back():
    done = background.result(chatty)  # not started at collection: started here
    assert done.returncode == 3 and len(done.stdout) == 300_000 and done.stderr == "done"
    assert background.result(chatty) is done  # run once


def test_a_command_past_its_timeout_is_killed_and_says_so():
    done = background.result(sleepy)
    assert done.returncode != 0 and "killed after 1 s" in done.stderr


def test_environment_changes_and_removals(monkeypatch):
    monkeypatch.setenv("BASAL_BACKGROUND_PROBE", "1")
    env = dict(background.environment(EXTRA="x", BASAL_BACKGROUND_PROBE=None))
    assert env["EXTRA"] == "x" and "BASAL_BACKGROUND_PROBE" not in env
