"""Reading and writing the schedule journal stream, with pika and with aio-pika.

What a record holds and what a reader makes of the records is :mod:`rmqdelay.core.journal`.
A stream is read over AMQP 0-9-1 with the ``x-stream-offset`` consumer argument (a
timestamp here: the records of the last ``max_delay``), with manual acks and a prefetch,
as RabbitMQ requires for streams. A stream never says where it ends, so a reader first
appends a marker of its own, confirmed, and reads until the marker comes back.

aio-pika and aiormq are imported by the asyncio functions that use them: the sync side
(``rmqdelay publish``, ``cancel``, ``scheduled list``) does without them, and they cost
the start-up of every such command a good part of its time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pika
import pika.exceptions

from ..core.journal import (
    RECORDS_PER_WRITE,
    CancelResult,
    JournalRecord,
    ScheduleView,
    decode_records,
    encode_record,
    encode_records,
    journal_name,
    plan_cancels,
)
from ..core.layout import Layout
from ..errors import ConfigurationError, JournalError, TopologyError

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

__all__ = [
    "JournalTail",
    "append_records",
    "append_records_async",
    "cancel",
    "cancel_async",
    "journal_properties",
    "list_scheduled",
    "list_scheduled_async",
    "read_journal",
    "read_journal_async",
    "require_journal",
    "write_probe",
]

_PREFETCH = 2000
_ACK_EVERY = 500
JOURNAL_TYPE = "rmqdelay-journal"


def require_journal(layout: Layout, what: str) -> str:
    """The stream's name; a clear error when the settings turned the journal off."""
    if not layout.journal:
        raise ConfigurationError(
            f"{what} needs the schedule journal, which is off: set schedule_journal = true "
            "(RMQDELAY_SCHEDULE_JOURNAL=true) and run `rmqdelay topology apply`. It shows "
            "only what was published while the journal was on"
        )
    return journal_name(layout)


def journal_properties(record: JournalRecord) -> dict[str, Any]:
    """The AMQP properties of a record: persistent, typed, named by the message id."""
    return {
        "message_id": record.message_id,
        "type": JOURNAL_TYPE,
        "content_type": "application/json",
        "delivery_mode": 2,
    }


def _offset(since_ms: int) -> datetime:
    # AMQP timestamps are whole seconds: start one early rather than miss a record
    return datetime.fromtimestamp(max(0, since_ms // 1000 - 1), tz=timezone.utc)


def _marker() -> JournalRecord:
    return JournalRecord("marker", f"marker-{uuid.uuid4()}", recorded_at_ms=time.time_ns() // 10**6)


def _missing(name: str) -> TopologyError:
    return TopologyError(
        f"the schedule journal {name!r} does not exist: run `rmqdelay topology apply` "
        "(or set schedule_journal = false)"
    )


# ------------------------------------------------------------------ sync (pika)


def stream_bodies(
    connection: pika.BlockingConnection, name: str, offset: object, timeout: float
) -> Generator[bytes, None, None]:
    """The bodies of a stream from ``offset`` on, until the caller stops iterating.

    On a connection of its own, opened with ``connection``'s parameters and closed at
    the end: pika cancels a consumer by rejecting what it still buffers, and a stream
    answers a reject by closing the whole connection; closing the reader's own
    connection rejects nothing. Acks go in batches (a stream consumer needs them for
    credit); JournalError after ``timeout`` seconds without a message.
    """
    reader = pika.BlockingConnection(connection._impl.params)  # type: ignore[attr-defined]
    channel = reader.channel()
    waiting: list[tuple[int, bytes]] = []
    last_tag = 0
    try:
        channel.basic_qos(prefetch_count=_PREFETCH)
        channel.basic_consume(
            name,
            lambda _ch, method, _props, body: waiting.append((method.delivery_tag or 0, body)),
            arguments={"x-stream-offset": offset},
        )
        acked = 0
        while True:
            deadline = time.monotonic() + timeout
            while not waiting:
                if time.monotonic() > deadline:
                    raise JournalError(
                        f"the stream {name!r} gave nothing for {timeout:g}s; try again"
                    )
                reader.process_data_events(time_limit=0.05)
            batch = waiting[:]
            del waiting[:]
            for tag, body in batch:
                last_tag = tag
                yield body
            if last_tag - acked >= _ACK_EVERY:
                channel.basic_ack(last_tag, multiple=True)
                acked = last_tag
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            raise _missing(name) from None
        raise
    finally:
        # pika rejects what the consumer still buffers, the stream then closes the
        # connection: this one is the reader's alone, so that is fine
        with contextlib.suppress(pika.exceptions.AMQPError):
            reader.close()


def _read_sync(
    connection: pika.BlockingConnection, layout: Layout, since_ms: int, timeout: float
) -> Iterator[JournalRecord]:
    name = require_journal(layout, "reading the schedule")
    marker = _marker()
    channel = connection.channel()
    try:
        channel.confirm_delivery()
        channel.basic_publish(
            name,
            "",
            encode_record(marker),
            pika.BasicProperties(**journal_properties(marker)),
            mandatory=True,
        )
    except (pika.exceptions.UnroutableError, pika.exceptions.NackError):
        raise _missing(name) from None
    finally:
        if channel.is_open:
            channel.close()
    bodies = stream_bodies(connection, name, _offset(since_ms), timeout)
    try:
        for body in bodies:
            for record in decode_records(body):
                if record.kind != "marker":
                    yield record
                elif record.message_id == marker.message_id:
                    return
    finally:
        bodies.close()


def read_journal(
    connection: pika.BlockingConnection,
    layout: Layout,
    *,
    since_ms: int | None = None,
    timeout: float = 30.0,
    progress: Callable[[int], None] | None = None,
) -> list[JournalRecord]:
    """Every record from ``since_ms`` (default: now - max_delay) to now, in order."""
    start = since_ms if since_ms is not None else time.time_ns() // 10**6 - layout.max_delay_ms
    records: list[JournalRecord] = []
    for record in _read_sync(connection, layout, start, timeout):
        records.append(record)
        if progress is not None and len(records) % 1000 == 0:
            progress(len(records))
    return records


def _writes(records: list[JournalRecord]) -> list[tuple[bytes, JournalRecord]]:
    """Records grouped into stream messages: one round trip for a cancel of many ids."""
    step = RECORDS_PER_WRITE
    chunks = [records[i : i + step] for i in range(0, len(records), step)]
    return [(encode_records(chunk), chunk[0]) for chunk in chunks]


def _now_ms() -> int:
    return time.time_ns() // 10**6


def append_records(
    connection: pika.BlockingConnection, layout: Layout, records: list[JournalRecord]
) -> None:
    """Append records, a few hundred to a write, and wait for every confirm (a return
    means the stream is missing)."""
    name = require_journal(layout, "writing to the schedule journal")
    channel = connection.channel()
    try:
        channel.confirm_delivery()
        for body, first in _writes(records):
            properties = pika.BasicProperties(**journal_properties(first))
            channel.basic_publish(name, "", body, properties, mandatory=True)
    except (pika.exceptions.UnroutableError, pika.exceptions.NackError):
        raise _missing(name) from None
    finally:
        if channel.is_open:
            channel.close()


def list_scheduled(
    connection: pika.BlockingConnection,
    layout: Layout,
    *,
    destination: str | None = None,
    due_before_ms: int | None = None,
    limit: int | None = None,
    timeout: float = 30.0,
    progress: Callable[[int], None] | None = None,
) -> list[JournalRecord]:
    """Every copy still ahead and not cancelled, soonest first (while the journal was on).

    One id can wait as several copies, each its own record (a publish sent again after
    its confirm failed, a retry): each copy still ahead is listed, and a record that
    came late hides none (:class:`~rmqdelay.core.journal.ScheduleView`).
    """
    view = ScheduleView().extend(
        read_journal(connection, layout, timeout=timeout, progress=progress)
    )
    return view.pending(
        _now_ms(), destination=destination, due_before_ms=due_before_ms, limit=limit
    )


def cancel(
    connection: pika.BlockingConnection,
    layout: Layout,
    message_ids: list[str],
    *,
    timeout: float = 30.0,
) -> list[CancelResult]:
    """Tombstone every copy of each id; say for each: ``cancelled`` when any copy is
    still ahead (``cancelled_due_ms`` names them), ``too late`` when every copy is due
    already (no tombstone), ``unknown`` without a record."""
    view = ScheduleView().extend(read_journal(connection, layout, timeout=timeout))
    results, tombstones = plan_cancels(view, message_ids, _now_ms())
    if tombstones:
        append_records(connection, layout, tombstones)
    return results


# ------------------------------------------------------------------ asyncio (aio-pika)


async def _publish_records(
    channel: AbstractChannel, name: str, records: list[JournalRecord]
) -> None:
    import aio_pika
    import aiormq

    exchange = await channel.get_exchange(name, ensure=False)
    try:
        await asyncio.gather(
            *(
                exchange.publish(
                    aio_pika.Message(body, **journal_properties(first)),
                    routing_key="",
                    mandatory=True,
                )
                for body, first in _writes(records)
            )
        )
    except aiormq.exceptions.PublishError:
        raise _missing(name) from None


async def append_records_async(
    connection: AbstractConnection, layout: Layout, records: list[JournalRecord]
) -> None:
    """:func:`append_records` for asyncio code."""
    name = require_journal(layout, "writing to the schedule journal")
    async with connection.channel(publisher_confirms=True, on_return_raises=True) as channel:
        await _publish_records(channel, name, records)


async def write_probe(connection: AbstractConnection, layout: Layout) -> None:
    """Append a marker (readers skip it) and wait for its confirm: a stream confirms a
    write once a majority of its replicas have it, which a node cut off from the
    cluster's majority cannot get, though it still accepts connections."""
    await append_records_async(connection, layout, [_marker()])


class JournalTail:
    """Follow the journal from ``since_ms`` onwards, calling ``on_record`` for each record.

    ``caught_up`` is set once the reader's own marker came back: every record confirmed
    before :meth:`start` has been seen. A worker waits for it before it consumes, so a
    cancel confirmed before the worker started is honoured.
    """

    def __init__(
        self,
        connection: AbstractConnection,
        layout: Layout,
        on_record: Callable[[JournalRecord], None],
        *,
        since_ms: int | None = None,
    ) -> None:
        self.name = require_journal(layout, "following the schedule")
        self.connection = connection
        self.on_record = on_record
        self.since_ms = (
            since_ms if since_ms is not None else time.time_ns() // 10**6 - layout.max_delay_ms
        )
        self.caught_up = asyncio.Event()
        self.count = 0
        self._marker = _marker()
        self.channel: AbstractChannel | None = None
        self._unacked = 0

    async def start(self) -> JournalTail:
        import aiormq

        channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
        self.channel = channel
        await _publish_records(channel, self.name, [self._marker])
        await channel.set_qos(prefetch_count=_PREFETCH)
        try:
            queue = await channel.get_queue(self.name, ensure=False)
            await queue.consume(
                self._on_message, arguments={"x-stream-offset": _offset(self.since_ms)}
            )
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise _missing(self.name) from None
        return self

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self._unacked += 1
        # a stream consumer must ack to get more credit; one multiple ack per batch
        if self._unacked >= _ACK_EVERY or self.caught_up.is_set():
            await message.ack(multiple=True)
            self._unacked = 0
        for record in decode_records(message.body):
            if record.kind == "marker":
                if record.message_id == self._marker.message_id:
                    self.caught_up.set()
                continue
            self.count += 1
            self.on_record(record)

    async def close(self) -> None:
        if self.channel is not None and not self.channel.is_closed:
            await self.channel.close()


async def read_journal_async(
    connection: AbstractConnection,
    layout: Layout,
    *,
    since_ms: int | None = None,
    timeout: float = 30.0,
) -> list[JournalRecord]:
    """:func:`read_journal` for asyncio code."""
    records: list[JournalRecord] = []
    tail = JournalTail(connection, layout, records.append, since_ms=since_ms)
    try:
        await tail.start()
        await asyncio.wait_for(tail.caught_up.wait(), timeout)
    except asyncio.TimeoutError:
        raise JournalError(
            f"the schedule journal {tail.name!r} did not reach the reader's own marker within "
            f"{timeout:g}s; try again"
        ) from None
    finally:
        await tail.close()
    return records


async def list_scheduled_async(
    connection: AbstractConnection,
    layout: Layout,
    *,
    destination: str | None = None,
    due_before_ms: int | None = None,
    limit: int | None = None,
    timeout: float = 30.0,
) -> list[JournalRecord]:
    """:func:`list_scheduled` for asyncio code."""
    records = await read_journal_async(connection, layout, timeout=timeout)
    return (
        ScheduleView()
        .extend(records)
        .pending(_now_ms(), destination=destination, due_before_ms=due_before_ms, limit=limit)
    )


async def cancel_async(
    connection: AbstractConnection,
    layout: Layout,
    message_ids: list[str],
    *,
    timeout: float = 30.0,
) -> list[CancelResult]:
    """:func:`cancel` for asyncio code."""
    view = ScheduleView().extend(await read_journal_async(connection, layout, timeout=timeout))
    results, tombstones = plan_cancels(view, message_ids, _now_ms())
    if tombstones:
        await append_records_async(connection, layout, tombstones)
    return results
