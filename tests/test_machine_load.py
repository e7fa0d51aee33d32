"""Benchmarks record how busy the machine was: a busy process is seen, and the warning says so."""

from __future__ import annotations

import subprocess
import sys

from basal.benchsuite.machine_load import MachineLoad, measure


def test_a_spinning_process_is_seen_as_busy():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        load = measure(sample_s=0.5)
    finally:
        spinner.kill()
        spinner.wait()
    shares = {p["pid"]: p["core_share"] for p in load.busy_processes}
    assert spinner.pid in shares and shares[spinner.pid] > 0.2
    assert load.busy and "other busy processes" in load.warning()


def test_a_quiet_machine_gives_no_warning():
    quiet = MachineLoad(load_1m=0.1, cores=2, busy_processes=[])
    assert not quiet.busy and quiet.warning() is None
    assert MachineLoad(load_1m=3.0, cores=2).warning().startswith("the machine was busy (load average 3.00")
