"""The overview's facts: the tiers and queues (``rmqdelay status``), the stuck hops with
their age, the broker's nodes and the journal's leader, and the workers' metrics."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..core.journal.records import journal_name
from ..core.status import ParkedBreakdown, PastDueWatch, Status, StuckTier, stuck_tiers
from ..settings import Settings, mask_url

__all__ = ["Broker", "WorkerHealth", "broker_facts", "worker_health"]

STUCK_AFTER_S = 60.0
"""A tier holding past-time messages this long counts as stuck (``status --check``'s
default)."""


@dataclass(frozen=True)
class Broker:
    nodes: list[dict[str, Any]]
    """Each node's name and whether it runs; empty when the API cannot list them."""
    journal_leader: str | None
    problem: str | None = None


@dataclass(frozen=True)
class WorkerHealth:
    url: str
    """Masked: no password."""
    up: bool
    problem: str | None = None
    lateness_s: dict[str, float] = field(default_factory=dict)
    """Per destination, the mean lateness of the messages handled so far."""
    handled: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


PARKED_PEEK = 1000
"""Parked messages read to count them per destination (``status --parked-by-destination``)."""
PARKED_PEEK_EVERY_S = 30.0
"""How often they are read: every read returns them all to the queue (and marks them
redelivered), too much for every 5 s refresh of every open overview."""


class StatusWatch:
    """``rmqdelay status`` each refresh, with each tier's past-time age kept from one
    refresh to the next (:class:`PastDueWatch`), and the parked messages counted per
    destination every :data:`PARKED_PEEK_EVERY_S`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._watch = PastDueWatch()
        self._lock = threading.Lock()
        self._parked: tuple[float, ParkedBreakdown | None] | None = None

    def parked_changed(self) -> None:
        """A replay or a purge ran: the next snapshot counts the parked messages again."""
        with self._lock:
            self._parked = None

    def snapshot(self) -> tuple[Status, list[StuckTier]]:
        from ..amqp.status import gather_status

        with self._lock:
            last = self._parked
        peek = last is None or time.monotonic() - last[0] > PARKED_PEEK_EVERY_S
        status = gather_status(
            self.settings, journal_oldest=False, parked_peek=PARKED_PEEK if peek else None
        )
        with self._lock:
            if peek:
                self._parked = (time.monotonic(), status.parked_by_destination)
            elif last is not None:
                status = replace(status, parked_by_destination=last[1])
            status = self._watch.observe(status, time.monotonic())
        return status, stuck_tiers(status, STUCK_AFTER_S)


def broker_facts(settings: Settings) -> Broker:
    """The nodes and the journal's leader, from the management API; what was not had
    is said in ``problem``."""
    from ..amqp.management import ManagementApi

    api = ManagementApi.for_settings(settings)
    problem = api.problem
    if problem is not None:
        return Broker([], None, mask_url(problem))
    try:
        nodes = [
            {"name": str(n.get("name")), "running": bool(n.get("running"))}
            for n in api.get("nodes?columns=name,running")
            if isinstance(n, dict)
        ]
    except urllib.error.HTTPError as exc:
        if exc.code not in (401, 403):
            raise
        nodes = []
        problem = "this user may not list the nodes (it needs the monitoring tag)"
    leader = None
    if settings.layout.journal:
        name = journal_name(settings.layout)
        for q in api.queues(settings.layout.prefix + "."):
            if q.get("name") == name:
                found = q.get("leader") or q.get("node")
                leader = str(found) if found else None
    return Broker(nodes, leader, problem)


def worker_health(url: str, timeout: float = 2.0) -> WorkerHealth:
    """A worker's ``--metrics-port`` page: up or not, its lateness and its counts."""
    from prometheus_client.parser import text_string_to_metric_families

    shown = mask_url(url)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            text = answer.read().decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        return WorkerHealth(shown, False, mask_url(f"{type(exc).__name__}: {exc}"))
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    handled: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            destination = sample.labels.get("destination", "")
            if sample.name == "rmqdelay_lateness_seconds_sum":
                sums[destination] = sample.value
            elif sample.name == "rmqdelay_lateness_seconds_count":
                counts[destination] = sample.value
            elif sample.name == "rmqdelay_messages_total":
                handled[destination] = handled.get(destination, 0.0) + sample.value
    lateness = {d: sums.get(d, 0.0) / n for d, n in counts.items() if n}
    return WorkerHealth(shown, True, None, lateness, handled)
