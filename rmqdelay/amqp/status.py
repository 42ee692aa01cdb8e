"""Gathering ``rmqdelay status``: one management API call, or one passive declare a queue.

Neither reads a message (but the journal's first one), so the time does not grow with
what is waiting; neither needs configure permission.
"""

from __future__ import annotations

import pika
import pika.exceptions

from ..core.journal import decode_records, journal_name
from ..core.status import QueueCounts, Status, build_status
from ..errors import JournalError
from ..settings import Settings
from .connections import connect_blocking
from .journal import stream_bodies
from .management import ManagementApi
from .topology_manager import TopologyManager

__all__ = ["gather_status"]


def _from_management(api: ManagementApi, prefix: str) -> dict[str, QueueCounts]:
    counts = {}
    for q in api.queues(f"{prefix}."):
        counts[str(q["name"])] = QueueCounts(
            messages=int(q.get("messages") or 0),
            ready=int(q.get("messages_ready") or 0),
            unacked=int(q.get("messages_unacknowledged") or 0),
            consumers=int(q.get("consumers") or 0),
        )
    return counts


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


def _oldest_record_ms(connection: pika.BlockingConnection, stream: str) -> int | None:
    """When the journal's first record was written: one message read from its start."""
    bodies = stream_bodies(connection, stream, "first", timeout=1.0)
    try:
        records = decode_records(next(bodies))
    except JournalError:
        return None
    finally:
        bodies.close()
    return min((r.recorded_at_ms for r in records), default=None)


def gather_status(
    settings: Settings, destinations: list[str] | None = None, *, use_management: bool = True
) -> Status:
    """The snapshot; the management API when it answers, else passive declares."""
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
            except (OSError, ValueError):  # an HTTP error, e.g. a 500 while queues change
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
        if layout.journal and journal_name(layout) in counts:
            oldest = _oldest_record_ms(connection, journal_name(layout))
        return build_status(layout, counts, wanted, source, journal_oldest_ms=oldest)
    finally:
        connection.close()
