"""How busy the machine was while a benchmark ran, so a reader can tell a slow machine from a slow engine.

Reads `/proc` (Linux; elsewhere only the load average, where the OS has one): the 1-minute load average, and the
other processes that used a noticeable share of a core during a short sample. A benchmark records this before and
after each suite and warns when the machine was busy.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

BUSY_CORE_SHARE = 0.2  # another process using more than this share of a core counts as busy
BUSY_LOAD_PER_CORE = 0.5  # a 1-minute load average above this per core (before the benchmark starts) is busy


@dataclass
class MachineLoad:
    load_1m: float | None  # 1-minute load average, None where the OS has none
    cores: int
    busy_processes: list[dict[str, object]] = field(default_factory=list)  # [{pid, name, core_share}]

    @property
    def busy(self) -> bool:
        per_core = (self.load_1m or 0.0) / max(self.cores, 1)
        return per_core > BUSY_LOAD_PER_CORE or bool(self.busy_processes)

    def warning(self) -> str | None:
        if not self.busy:
            return None
        others = ", ".join(f"{p['name']} ({p['core_share']:.0%} of a core)" for p in self.busy_processes[:5])
        return (
            f"the machine was busy (load average {self.load_1m:.2f} on {self.cores} cores"
            + (f"; other busy processes: {others}" if others else "")
            + "): absolute times are not comparable, the ratios measured in the same run still are"
        )

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "busy": self.busy}


def _cpu_ticks() -> dict[int, tuple[str, int]]:
    """pid -> (command name, user + system clock ticks) of every process that can be read."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry.name)] = (name, int(fields[11]) + int(fields[12]))  # utime, stime
    return out


def measure(sample_s: float = 0.5, exclude: set[int] | None = None) -> MachineLoad:
    """The load average now, and the processes other than this one (and `exclude`) busy during `sample_s`."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    cores = os.cpu_count() or 1
    if not Path("/proc/self/stat").exists():
        return MachineLoad(load, cores)
    skip = {os.getpid(), *(exclude or set())}
    before = _cpu_ticks()
    time.sleep(sample_s)
    after = _cpu_ticks()
    hz = os.sysconf("SC_CLK_TCK")
    busy = []
    for pid, (name, ticks) in after.items():
        if pid in skip or pid not in before:
            continue
        share = (ticks - before[pid][1]) / hz / sample_s
        if share > BUSY_CORE_SHARE:
            busy.append({"pid": pid, "name": name, "core_share": round(share, 2)})
    busy.sort(key=lambda p: -float(p["core_share"]))  # type: ignore[arg-type]
    return MachineLoad(load, cores, busy)
