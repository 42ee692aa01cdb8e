"""Gathering ``rmqdelay status``: one management API call, or one passive declare a queue.

Neither reads a message (but the journal's first one, and the parked ones when asked
for per-destination counts), so the time does not grow with what is waiting; neither
needs configure permission.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from typing import Any
from urllib.parse import quote

import pika
import pika.exceptions

from ..core.handling.parking import read_parked
from ..core.journal import reading
from ..core.journal.checkpoint import Mark, Pointer
from ..core.journal.records import decode_records, journal_name
from ..core.journal.steps import JournalStep, Read, StreamMessage
from ..core.layout import Layout
from ..core.status import ParkedBreakdown, QueueCounts, Status, build_status, count_parked
from ..errors import AccessRefusedError
from ..settings import Settings
from .connections import connect_blocking
from .management import ManagementApi
from .passive import exchange_exists
from .streams import BlockingStream, peek_last
from .topology_manager import TopologyManager

__all__ = ["MAX_PARKED_PEEK", "gather_status", "peek_parked"]

_COLUMNS = "name,type,messages,messages_ready,messages_unacknowledged,messages_dlx,consumers"
_PAGE_SIZE = 500  # the API's largest page
MAX_PARKED_PEEK = 65_535
"""The largest prefetch AMQP allows: the peek holds every message it read unacked."""


def _from_management(api: ManagementApi, prefix: str) -> dict[str, QueueCounts]:
    """The prefix's queues only, these columns only: the API filters by name when paging."""
    vhost = quote(api.vhost, safe="")
    name = quote(f"^{re.escape(prefix)}\\.", safe="")
    counts: dict[str, QueueCounts] = {}
    page, pages = 1, 1
    while page <= pages:
        found: dict[str, Any] = api.get(
            f"queues/{vhost}?columns={_COLUMNS}&name={name}&use_regex=true"
            f"&pagination=true&page={page}&page_size={_PAGE_SIZE}"
        )
        for q in found["items"]:
            counts[str(q["name"])] = _queue_counts(q)
        pages = int(found.get("page_count") or 0)
        page += 1
    return counts


def _queue_counts(q: dict[str, Any]) -> QueueCounts:
    """One queue of the API's listing.

    A quorum queue's ``messages`` counts, on RabbitMQ 3.10.8 (measured), the expired
    messages its dead-letter worker still holds (``messages_dlx``) as well: those are
    past their time, so ``messages`` here is ready + unacked, which excludes them on every
    version. ``messages_dlx`` is absent for other queue types, and for any queue the API
    has no statistics for yet (the first seconds after it is declared): unknown, not 0.
    Nothing here tells a message's age: neither 3.10.8 nor 4.0.5 reports
    ``head_message_timestamp`` for a quorum queue (see ``PastDueWatch``).
    """
    ready = int(q.get("messages_ready") or 0)
    unacked = int(q.get("messages_unacknowledged") or 0)
    messages = int(q.get("messages") or 0)
    dlx = q.get("messages_dlx")
    if q.get("type") == "quorum" and "messages_ready" in q:
        messages = ready + unacked
    return QueueCounts(
        messages=messages,
        ready=ready,
        unacked=unacked,
        consumers=int(q.get("consumers") or 0),
        past_due=None if dlx is None else int(dlx),
    )


def _from_amqp(
    connection: pika.BlockingConnection, names: list[str], streams: set[str]
) -> dict[str, QueueCounts]:
    counts = {}
    channel = connection.channel()
    for name in names:
        try:
            ok = channel.queue_declare(name, passive=True).method
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
            channel = connection.channel()  # a failed passive check closes the channel
            continue
        ready = int(ok.message_count)
        messages = None if name in streams else ready
        counts[name] = QueueCounts(messages, ready=ready, consumers=int(ok.consumer_count))
    if channel.is_open:
        channel.close()
    return counts


def _oldest_record_ms(settings: Settings, stream: str) -> int | None:
    """When the journal's first record was written: one message read from its start
    (a connection of its own, as every stream read has).

    A stream that holds anything hands its first chunk over at once; over AMQP an empty
    one looks the same as a full one, and costs this wait.
    """
    first: list[int | None] = []

    def take(message: StreamMessage) -> bool:
        records = decode_records(message.body)
        first.append(min((r.recorded_at_ms for r in records), default=None))
        return True

    reader = BlockingStream(lambda: connect_blocking(settings, "status"))
    try:
        reader.read(Read(stream, "first", take, timeout=0.5))
    finally:
        reader.close()
    return first[0] if first else None


def _latest_checkpoint(connection: pika.BlockingConnection, layout: Layout) -> Pointer | None:
    """The latest checkpoint, as the checkpoint stream's last message names it (one
    message, on the status connection); None when there is none."""

    def do(step: JournalStep) -> object:
        assert isinstance(step, Read)  # latest() appends nothing
        return peek_last(connection, step)

    found = reading.run(reading.latest(layout, 2.0), do)
    return found.latest if isinstance(found, Mark) else None


def peek_parked(
    connection: pika.BlockingConnection, layout: Layout, limit: int, *, idle: float = 1.0
) -> ParkedBreakdown | None:
    """Count up to ``limit`` parked messages per destination, removing none.

    A consumer without acks, its prefetch the limit, so the broker sends them all at
    once; closing the channel puts every one back. It reads the messages, so it costs
    O(parked): only on request. Each read counts as a return toward a quorum queue's
    delivery limit: the parking queue declares the largest (``PARKING_DELIVERY_LIMIT``),
    as RabbitMQ 4.0 would otherwise drop a message at its 21st read; one declared before
    that needs a policy (see the README's RabbitMQ versions). None when there is no
    parking queue.
    """
    limit = max(1, min(limit, MAX_PARKED_PEEK))
    channel = connection.channel()
    try:
        try:
            total = int(channel.queue_declare(layout.parking, passive=True).method.message_count)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                return None
            raise
        wanted = min(total, limit)
        destinations: list[str | None] = []

        def on_message(_ch: Any, method: Any, props: pika.BasicProperties, _body: bytes) -> None:
            destinations.append(read_parked(props.headers, props.message_id, layout).destination)

        if wanted:
            channel.basic_qos(prefetch_count=limit)
            channel.basic_consume(layout.parking, on_message, auto_ack=False)
            last, seen = time.monotonic(), 0
            while len(destinations) < wanted and time.monotonic() - last < idle:
                connection.process_data_events(time_limit=0.05)
                if len(destinations) > seen:
                    last, seen = time.monotonic(), len(destinations)
        return count_parked(destinations, total)
    finally:
        if channel.is_open:
            channel.close()  # every message read goes back, none was acked


def _held(
    manager: TopologyManager,
    connection: pika.BlockingConnection,
    destinations: list[str],
    api: bool,
) -> list[str] | None:
    """The destinations whose held marker exists: one listing of the API's exchanges, or
    a passive check each; None when neither can tell (a refused check)."""
    layout = manager.layout
    if api:
        try:
            found = manager.management.exchanges(layout.held_marker(""))
            marked = {layout.held_of(str(e.get("name", ""))) for e in found}
            return [d for d in destinations if d in marked]
        except (OSError, ValueError):
            pass
    quiet = logging.getLogger("pika.channel")  # it logs each 404 as a warning
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return [d for d in destinations if exchange_exists(connection, layout.held_marker(d))]
    except AccessRefusedError:
        return None
    finally:
        quiet.setLevel(level)


def gather_status(
    settings: Settings,
    destinations: list[str] | None = None,
    *,
    use_management: bool = True,
    journal_oldest: bool = True,
    parked_peek: int | None = None,
) -> Status:
    """The snapshot; the management API when it answers, else passive declares.

    ``journal_oldest`` reads the journal's first record (a connection of its own);
    ``parked_peek`` reads up to that many parked messages to count them per destination.
    """
    layout = settings.layout
    wanted = list(dict.fromkeys([*settings.destinations, *(destinations or [])]))
    connection = connect_blocking(settings, "status")
    try:
        # the manager's check also refuses an API that belongs to another broker
        manager = TopologyManager(settings, connection=connection)
        counts = None
        if use_management and manager.management_problem is None:
            try:
                counts = _from_management(manager.management, layout.prefix)
            except (OSError, ValueError, KeyError):  # an HTTP error, e.g. a 500 mid-change
                counts = None
        if counts is not None:
            found = sorted(d for name in counts if (d := layout.destination_of(name)))
            wanted = list(dict.fromkeys([*wanted, *found]))
            source = "management API"
        else:
            names = [t.queue for t in layout.tiers]
            names += [layout.work_queue(d) for d in wanted] + [layout.parking]
            if layout.journal:
                names.append(journal_name(layout))
            streams = {journal_name(layout)} if layout.journal else set()
            counts = _from_amqp(connection, names, streams)
            source = "AMQP"
        oldest = None
        journal = counts.get(journal_name(layout)) if layout.journal else None
        # an empty stream would keep the read waiting for its timeout: skip it when known
        if journal_oldest and journal is not None and journal.messages != 0:
            oldest = _oldest_record_ms(settings, journal_name(layout))
        checkpoint = _latest_checkpoint(connection, layout) if journal is not None else None
        held = _held(manager, connection, wanted, source == "management API")
        status = build_status(
            layout,
            counts,
            wanted,
            source,
            journal_oldest_ms=oldest,
            checkpoint=checkpoint,
            held=held,
        )
        if parked_peek is not None and status.parked is not None:
            breakdown = peek_parked(connection, layout, parked_peek)
            status = dataclasses.replace(status, parked_by_destination=breakdown)
        return status
    finally:
        connection.close()
