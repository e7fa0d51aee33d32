"""The replicas' engine series on the Ray front's /metrics, each with a `replica` label.

Every replica keeps its own `Metrics` (queue, batch, tokens, process). A small named actor, the hub, holds the
latest text of each: a replica pushes its rendered series every `PUSH_S`, and the front's collector reads them all
at scrape time and adds them to its own, labelled by replica. A deployment so shows the same engine series as one
process, whether the front started the replicas (`basal serve --ray`) or Ray's tooling did (`serve deploy`): both
find the hub by name. A replica that stops pushing (gone, replaced) drops out after `STALE_S`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

import ray
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

HUB_NAME, HUB_NAMESPACE = "basal-metrics-hub", "basal"
PUSH_S = 2.0  # how often a replica pushes (a scrape sees series at most this old)
STALE_S = 15.0  # a replica silent this long is left out
READ_TIMEOUT_S = 5.0


@ray.remote(num_cpus=0)
class MetricsHub:
    """The latest series text of each replica."""

    def __init__(self) -> None:
        self.texts: dict[str, tuple[float, str]] = {}

    def put(self, replica: str, text: str) -> None:
        self.texts[replica] = (time.monotonic(), text)

    def drop(self, replica: str) -> None:
        self.texts.pop(replica, None)

    def get(self) -> dict[str, str]:
        now = time.monotonic()
        self.texts = {r: (at, t) for r, (at, t) in self.texts.items() if now - at < STALE_S}
        return {r: t for r, (_, t) in self.texts.items()}


def hub():
    """The hub actor, started by whichever side asks first (detached: it outlives a front's restart)."""
    return MetricsHub.options(  # type: ignore[attr-defined]
        name=HUB_NAME, namespace=HUB_NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()


def start_pushing(replica: str, render: Callable[[], str], every_s: float = PUSH_S) -> threading.Event:
    """A replica's daemon thread that pushes `render()` to the hub; set the returned event to stop it."""
    stop = threading.Event()

    def run() -> None:
        target = hub()
        while not stop.is_set():
            try:
                target.put.remote(replica, render())
            except Exception as e:  # the hub is restarting, Ray is shutting down: try again next time
                log.debug("pushing metrics to the hub failed: %s", e)
                target = hub()
            stop.wait(every_s)
        with contextlib.suppress(Exception):  # Ray is going away with the replica
            target.drop.remote(replica)

    threading.Thread(target=run, name="basal-metrics-push", daemon=True).start()
    return stop


class ReplicaCollector(Collector):
    """The front's collector: every replica's families, with `replica` added to each sample's labels."""

    def __init__(self) -> None:
        self._hub = None

    def collect(self) -> Iterator[Metric]:
        try:
            self._hub = self._hub or hub()
            texts = ray.get(self._hub.get.remote(), timeout=READ_TIMEOUT_S)
        except Exception as e:  # the scrape still shows the front's own series
            log.warning("could not read the replicas' metrics: %s", e)
            self._hub = None
            return
        for replica, text in sorted(texts.items()):
            for family in text_string_to_metric_families(text):
                out = Metric(family.name, family.documentation, family.type, family.unit)
                for s in family.samples:
                    out.add_sample(s.name, {**s.labels, "replica": replica}, s.value, s.timestamp, s.exemplar)
                yield out

    def describe(self) -> list:
        return []  # computed at scrape time; nothing to check at registration
