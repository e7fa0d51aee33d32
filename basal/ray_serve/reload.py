"""A changed calibration served by every Ray replica without a restart: SIGHUP to the front, as to `basal serve`.

A signal reaches one process, and the front cannot address the replicas one by one (Ray's router picks one per
call), so a small named actor, the reload hub, holds a generation number, found by name as the metrics hub is:

    kill -HUP <front>   the front bumps the generation
    every replica       polls it every `POLL_S`; on a new one it reads its model's calibration again exactly as
                        one process does on SIGHUP (`basal.serve.reload.reload_calibrations`: one assignment,
                        nothing dropped, a bad file leaves the served one in place) and reports what happened
    every front         polls it too; on a new one it waits until every running replica has reported (at most
                        `WAIT_S`), asks a replica of each model for its facts again (`/v1/models`, `max_error`'s
                        thresholds as announced) and empties its answer cache when a calibration changed

A replica reads the file on its own node, so the path must be there (a shared model directory, or the same file
copied to each node). A replica started later (autoscaling, a replacement) reads the file when it starts.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable

import ray

log = logging.getLogger("basal")

HUB_NAME, HUB_NAMESPACE = "basal-reload-hub", "basal"
POLL_S = 1.0  # how often replicas and fronts look at the generation
WAIT_S = 30.0  # how long a front waits for every replica to report before it reads the models' facts anyway
CALL_TIMEOUT_S = 10.0


@ray.remote(num_cpus=0)
class ReloadHub:
    """The reload generation, and what each replica reported for the last one it ran."""

    def __init__(self) -> None:
        self.generation = 0
        # replica -> (its application, the generation it last ran, model -> outcome)
        self.reports: dict[str, tuple[str, int, dict[str, str]]] = {}

    def bump(self) -> int:
        self.generation += 1
        return self.generation

    def current(self) -> int:
        return self.generation

    def report(self, replica: str, app: str, generation: int, outcome: dict[str, str]) -> None:
        self.reports[replica] = (app, generation, outcome)

    def drop(self, replica: str) -> None:
        self.reports.pop(replica, None)

    def reported(self, generation: int) -> dict[str, tuple[str, dict[str, str]]]:
        """Replicas that have run `generation` (or a later one): their application and outcomes."""
        return {r: (app, outcome) for r, (app, g, outcome) in self.reports.items() if g >= generation}


def hub():
    """The hub actor, started by whichever side asks first (detached: it outlives a front's restart)."""
    return ReloadHub.options(  # type: ignore[attr-defined]
        name=HUB_NAME, namespace=HUB_NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()


def generation() -> int:
    return int(ray.get(hub().current.remote(), timeout=CALL_TIMEOUT_S))


def request_reload() -> int:
    """Ask every replica of every model to read its calibration again (what SIGHUP to a Ray front does)."""
    g = int(ray.get(hub().bump.remote(), timeout=CALL_TIMEOUT_S))
    log.info("calibration reload %d asked of every replica", g)
    return g


def reload_on_sighup() -> None:
    """SIGHUP -> `request_reload` on a thread of its own (a handler must return at once; main thread only)."""

    def handler(_signum: int, _frame: object) -> None:
        threading.Thread(target=_logged(request_reload), name="basal-reload", daemon=True).start()

    if threading.current_thread() is not threading.main_thread():
        log.info("not on the main thread: SIGHUP does not reload calibrations through this front")
        return
    signal.signal(signal.SIGHUP, handler)


def replica_watch(replica: str, app: str, seen: int, reload: Callable[[], dict[str, str]]) -> threading.Event:
    """A replica's daemon thread: `reload()` on each new generation after `seen` (read before the model loaded,
    so a bump during the load is run too), its outcome reported to the hub. Set the returned event to stop it."""
    stop = threading.Event()

    def run() -> None:
        target, done = hub(), seen
        with contextlib.suppress(Exception):
            target.report.remote(replica, app, done, {})  # counted as current from the start
        while not stop.wait(POLL_S):
            try:
                g = int(ray.get(target.current.remote(), timeout=CALL_TIMEOUT_S))
                done = min(done, g)  # a hub started again (the cluster's head restarted) counts from 0
                if g > done:
                    outcome = reload()
                    target.report.remote(replica, app, g, outcome)
                    done = g
            except Exception as e:  # the hub is restarting, Ray is going away: look again next time
                log.debug("looking for a calibration reload failed: %s", e)
                target = hub()
        with contextlib.suppress(Exception):
            target.drop.remote(replica)

    threading.Thread(target=run, name="basal-reload-watch", daemon=True).start()
    return stop


def front_watch(
    running: Callable[[], dict[str, int]],
    refresh: Callable[[], list[str]],
    on_change: Callable[[], None],
    wait_s: float = WAIT_S,
) -> threading.Event:
    """A front's daemon thread: on each new generation, wait until every running replica of its applications
    (`running()`: application -> replicas running) has reported, then `refresh()` (-> the models whose announced
    calibration changed) and `on_change()` if any changed or a replica changed one. Set the returned event to stop
    it."""
    stop = threading.Event()
    seen = [generation()]  # a reload asked before this front started is not followed (its facts are fresh)

    def run() -> None:
        while not stop.wait(POLL_S):
            try:
                g = generation()
                seen[0] = min(seen[0], g)  # a hub started again counts from 0
                if g > seen[0]:
                    follow(g)
                    seen[0] = g
            except Exception as e:  # Ray is going away, a replica is restarting: look again next time
                log.warning("following a calibration reload failed: %s", e)

    def follow(g: int) -> None:
        reports = _wait_for_reports(g, running, wait_s, stop)
        changed = refresh()
        for replica, outcome in sorted(reports.items()):
            for model, what in outcome.items():
                level = logging.ERROR if what.startswith("error") else logging.INFO
                log.log(level, "calibration reload %d: replica %s, %s: %s", g, replica, model, what)
        if changed or any("changed" in o.values() for o in reports.values()):
            on_change()
        log.info("calibration reload %d done: %s", g, ", ".join(changed) or "no announced calibration changed")

    threading.Thread(target=run, name="basal-reload-front", daemon=True).start()
    return stop


def _wait_for_reports(
    g: int, running: Callable[[], dict[str, int]], wait_s: float, stop: threading.Event
) -> dict[str, dict[str, str]]:
    """replica -> its outcomes, once every running replica of the front's applications has run generation `g` (or
    `wait_s` has passed: then a warning says how many had)."""
    deadline = time.monotonic() + wait_s
    target = hub()
    while True:
        apps = running()
        found = ray.get(target.reported.remote(g), timeout=CALL_TIMEOUT_S)
        reports = {r: outcome for r, (app, outcome) in found.items() if app in apps}
        missing = {app: n - sum(a == app for a, _ in found.values()) for app, n in apps.items()}
        if all(m <= 0 for m in missing.values()) or stop.is_set():
            return reports
        if time.monotonic() >= deadline:
            log.warning(
                "calibration reload %d: %d running replica(s) had not reported within %.0f s; reading the models' "
                "facts anyway",
                g,
                sum(m for m in missing.values() if m > 0),
                wait_s,
            )
            return reports
        stop.wait(POLL_S / 4)


def _logged(fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except Exception as e:
            log.error("calibration reload not asked: %s", e)

    return run
