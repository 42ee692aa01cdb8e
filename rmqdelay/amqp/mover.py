"""``rmqdelay move``: every message waiting in one cluster's tiers and work queues, taken
and published to another cluster at its own due time, confirmed there before it is
acked here (:mod:`rmqdelay.core.journal.moving` decides what goes).

A batch is consumed from one queue (unacked), its messages published to the new cluster
with ``publish_many`` (each confirmed, with its journal record), then the batch is acked
here. A move cut off at any point loses nothing: what was not acked goes back to its
queue, and the next run finds the copies the new cluster's journal holds already and
only acks them here. Parked messages stay (``rmqdelay parked replay`` on the old cluster
first, if they should go too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pika

from ..core.clock import now_ms
from ..core.journal.moving import MoveReport, Moving, decide, request_of
from ..core.journal.reading import load
from ..core.journal.recurring import RecurringSchedule
from ..core.journal.rules import read_occurrence
from ..core.messages import carried_properties
from ..errors import BatchPublishError, PublishError, RecurringError
from ..settings import Settings
from .blocking import close_connection
from .connections import connect_blocking
from .journal import read_once
from .publisher import Publisher
from .topology_manager import TopologyManager

__all__ = ["Mover"]

BATCH = 500
"""Messages taken from a queue, published there and acked here at a time."""
PASSES = 3
"""Passes over the queues at most, each after one that took something."""
IDLE_S = 0.5
"""A queue that gives nothing for this long is done (what comes later is due later)."""


class Mover:
    """Moves the prefix's waiting messages from ``old`` to ``new`` (the same layout)."""

    def __init__(self, old: Settings, new: Settings) -> None:
        self.old, self.new = old, new
        self.report = MoveReport()
        self._applied: set[str] = set()
        self._seen: set[str] = set()
        """Destinations of the messages taken."""
        self._schedules: dict[str, RecurringSchedule] = {}

    def queues(self) -> Iterator[str]:
        """The tiers, longest first (what leaves one goes to a shorter one, taken
        after), then the work queues: those the management API lists, and those of every
        destination met (without the API, a destination none of whose messages waited
        in the tiers keeps what is due in its work queue: its workers handle that)."""
        layout = self.old.layout
        yield from (t.queue for t in sorted(layout.tiers, key=lambda t: -t.ttl_ms))
        with TopologyManager(self.old) as manager:
            listed = set(manager.discover_destinations())
        yield from (layout.work_queue(d) for d in sorted(listed | self._seen))

    def waiting(self) -> int:
        """What the old cluster's queues hold now (a dry run's count)."""
        count = 0
        connection = connect_blocking(self.old, "move")
        try:
            for queue in self.queues():
                channel = connection.channel()
                with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                    count += channel.queue_declare(queue, passive=True).method.message_count
                    channel.close()
        finally:
            close_connection(connection, self.old.confirm_timeout)
        return count

    def run(self, progress: Callable[[int], None] | None = None) -> MoveReport:
        with TopologyManager(self.new) as manager:  # the journal there, to read and write
            manager.apply([])
        old_view = read_once(self.old, load(self.old.layout, timeout=60, clock=now_ms)).state.view
        there = read_once(
            self.new, load(self.new.layout, copies=True, bodies=False, timeout=60, clock=now_ms)
        ).state.view
        copies: dict[str, set[int]] = {}
        for message_id, due in there.copies:
            copies.setdefault(message_id, set()).add(due)
        with Publisher(self.old) as publisher:
            self._schedules = {s.name: s for s in publisher.list_recurring()}
        connection = connect_blocking(self.old, "move")
        try:
            with Publisher(self.new) as target:
                for _ in range(PASSES):  # again: what flowed into a queue once it was done
                    before = self.report.taken
                    for queue in self.queues():
                        for batch in self._batches(connection, queue):
                            self._move(target, batch, old_view, copies)
                            if progress is not None:
                                progress(self.report.moved + self.report.already)
                    if self.report.taken == before:
                        break
                there_now = {s.name for s in target.list_recurring()}
        finally:
            close_connection(connection, self.old.confirm_timeout)
        carried = there_now | set(self.report.recurring)
        self.report.left += [
            f"recurring schedule {name!r}: no occurrence waiting, add it there again"
            for name, s in self._schedules.items()
            if name not in carried and s.state != "removed"
        ]
        return self.report

    def _batches(self, connection: pika.BlockingConnection, queue: str) -> Iterator[list[Any]]:
        """The queue's messages in batches: as many as it held when asked (those that
        flow in meanwhile come from longer tiers, taken before), or until it is idle."""
        channel = connection.channel()
        try:
            ready = channel.queue_declare(queue, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker:
            return  # not declared on the old cluster: nothing waits there
        if not ready:
            channel.close()
            return
        channel.basic_qos(prefetch_count=BATCH)
        batch: list[Any] = []
        taken = 0
        for method, properties, body in channel.consume(queue, inactivity_timeout=IDLE_S):
            if method is not None:
                batch.append((channel, method, properties, body))
                taken += 1
            done = method is None or taken >= ready
            if batch and (done or len(batch) >= BATCH):
                yield batch
                batch = []
            if done:
                break
        channel.cancel()
        channel.close()

    def _move(
        self, target: Publisher, batch: list[Any], old_view: Any, copies: dict[str, set[int]]
    ) -> None:
        now = now_ms()
        plans: list[tuple[Any, Moving]] = []
        requests = []
        pausing: set[str] = set()  # paused schedules whose occurrence this batch moves
        for item in batch:
            _channel, _method, properties, body = item
            headers = dict(properties.headers or {})
            moving = decide(old_view, copies, headers, properties.message_id or "", now)
            if moving.action == "recurring":
                # it moves as it is, at its own time, already due or not: its headers
                # carry its schedule's rule and chain, which the new cluster's journal
                # learns from its record, and a worker there chains the next one
                schedule = self._schedule_of(headers)
                if schedule is not None:
                    if schedule.state == "paused":
                        pausing.add(schedule.name)
                    if schedule.name not in self.report.recurring:
                        self.report.recurring.append(schedule.name)
                moving = replace(moving, action="move")
            if moving.action == "move":
                carried = carried_properties(properties)
                requests.append(request_of(moving, body, headers, carried))
            plans.append((item, moving))
        self._apply({r["destination"] for r in requests})
        failed: set[str] = set()
        if requests:
            try:
                target.publish_many(requests)
            except BatchPublishError as exc:
                failed = set(exc.failures)
                first = next(iter(exc.failures.values()))
        for (channel, method, _properties, _body), moving in plans:
            if moving.message_id in failed:
                channel.basic_nack(method.delivery_tag, requeue=True)
                continue
            channel.basic_ack(method.delivery_tag)
            copies.setdefault(moving.message_id, set()).add(moving.due_ms)
            self._seen.add(moving.destination)
            self.report.count(moving)
        for name in sorted(pausing):  # known there now, from its occurrence's record
            target.pause_recurring(name)
        if failed:  # stop: nothing is lost, and a second run moves them
            raise PublishError(
                f"{len(failed)} message(s) were not confirmed by the new cluster ({first}); "
                "they stay on this one: run `rmqdelay move` again"
            )

    def _apply(self, destinations: set[str]) -> None:
        """Declare the new cluster's topology for destinations met for the first time."""
        new = destinations - self._applied
        if new:
            with TopologyManager(self.new) as manager:
                manager.apply(sorted(new))
            self._applied |= new

    def _schedule_of(self, headers: dict[str, Any]) -> RecurringSchedule | None:
        """The schedule of an occurrence, as the old cluster's journal tells it (None:
        unknown, or removed)."""
        try:
            occurrence = read_occurrence(headers)
        except RecurringError:
            return None
        schedule = None if occurrence is None else self._schedules.get(occurrence.name)
        return None if schedule is None or schedule.state == "removed" else schedule
