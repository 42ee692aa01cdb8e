"""Helpers for the worker tests: settings with topology, a test's worker and its calls,
polling, and queue inspection."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import aio_pika
import pika

from rmqdelay import AsyncPublisher, Settings, Worker
from rmqdelay.amqp.topology_manager import TopologyManager
from rmqdelay.worker.context import Context


def make_settings(
    amqp_url: str, prefix: str, destinations: Iterable[str], **extra: Any
) -> Settings:
    """Settings for this test's prefix, with the topology applied for ``destinations``."""
    options: dict[str, Any] = {"max_delay": "1h", "connection_name": prefix, **extra}
    settings = Settings(url=amqp_url, prefix=prefix, **options)
    with TopologyManager(settings) as manager:
        manager.apply(list(destinations))
    return settings


class SharedTopology:
    """One delay topology per test module (tiers, hop exchanges, parking, journal), under
    the module's prefix, that its tests share: each test brings destinations of its own.

    Declaring the tiers is what costs (every tier is a quorum queue, a Raft group of its
    own), so a module declares them once per layout it uses, not once per test. A test
    that changes the topology itself (apply, destroy, conflicts, deleted tiers) must
    take a prefix of its own instead.
    """

    def __init__(self, amqp_url: str, prefix: str) -> None:
        self.amqp_url = amqp_url
        self.prefix = prefix
        self._prefixes: dict[tuple[tuple[str, str], ...], str] = {}
        self._parking: set[str] = set()

    @property
    def prefixes(self) -> list[str]:
        """The prefixes in use: the module's, and one more per further layout."""
        return list(self._prefixes.values())

    def settings(
        self, destinations: Iterable[str], *, connection_name: str, **extra: Any
    ) -> Settings:
        """Settings like :func:`make_settings` gives, on the module's topology for this
        layout, with ``destinations`` applied (re-declaring what exists is a no-op).

        ``extra`` settings that shape the tiers (``queue_type``, ``max_delay``...) get a
        topology of their own; ``delivery_limit`` shapes only work queues and
        ``held_destinations`` only adds markers (``max_held`` only the worker), so they
        do not.
        """
        options: dict[str, Any] = {"max_delay": "1h", "connection_name": connection_name, **extra}
        settings = Settings(url=self.amqp_url, prefix=self.prefix, **options)
        # held destinations add a marker exchange each, not another shape of tiers
        ignored = {"url", "prefix", "connection_name", "delivery_limit"}
        ignored |= {"held_destinations", "max_held"}
        shape = {k: v for k, v in settings.as_dict().items() if k not in ignored}
        key = tuple(sorted((k, repr(v)) for k, v in shape.items()))
        if key not in self._prefixes:
            n = len(self._prefixes)
            self._prefixes[key] = self.prefix if n == 0 else f"{self.prefix}-{n}"
        settings = Settings(url=self.amqp_url, prefix=self._prefixes[key], **options)
        with TopologyManager(settings) as manager:
            manager.apply(list(destinations))
        self._parking.add(settings.layout.parking)
        return settings

    def purge_parking(self) -> None:
        """Empty the parking queues: a test sees only what it parked itself."""
        if not self._parking:
            return
        connection = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
        try:
            channel = connection.channel()
            for queue in sorted(self._parking):
                channel.queue_purge(queue)
        finally:
            connection.close()


@dataclass
class TestTopology:
    """A test's share of its module's :class:`SharedTopology`."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    shared: SharedTopology
    prefix: str
    """The test's own prefix: its connection names and users start with it."""

    def dest(self, name: str) -> str:
        """A destination name of this test's own, e.g. ``jobs-3fa2c1``."""
        return f"{name}-{self.prefix.rsplit('-', 1)[-1]}"

    def settings(self, destinations: Iterable[str], **extra: Any) -> Settings:
        """See :meth:`SharedTopology.settings`; connections are named after the test."""
        extra.setdefault("connection_name", self.prefix)
        return self.shared.settings(destinations, **extra)

    def worker(
        self, *names: str, options: Mapping[str, Any] | None = None, **extra: Any
    ) -> WorkerCase:
        """A worker on this test's destinations ``names`` (default ``jobs``; the case's
        ``dest`` is the first, :meth:`dest` names the others), with the topology declared
        for them; ``extra`` settings as :meth:`settings` takes them, ``options`` for the
        :class:`Worker` itself."""
        dests = [self.dest(name) for name in names or ("jobs",)]
        settings = self.settings(dests, **extra)
        return WorkerCase(dests[0], settings, Worker(settings, **(options or {})), Calls())


class WorkerCase(NamedTuple):
    """The opening of a worker test: ``dest, settings, app, calls = case``. Register the
    handlers on ``app``, then run it with :meth:`running`."""

    dest: str
    settings: Settings
    app: Worker
    calls: Calls

    @asynccontextmanager
    async def running(self, **options: Any) -> AsyncIterator[AsyncPublisher]:
        """A publisher on the test's settings, with the worker running (``options`` as
        :meth:`Worker.running` takes them) until the block ends; then the worker is
        stopped, so what it did not ack is back in its queue."""
        async with AsyncPublisher(self.settings) as publisher, self.app.running(**options):
            yield publisher


async def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = 0.02,
) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {text}")
        await asyncio.sleep(interval)


async def queue_depth(settings: Settings, queue: str) -> int:
    """Ready messages in ``queue`` (passive declare)."""
    connection = await aio_pika.connect(settings.url.get_secret_value())
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        result = declared.declaration_result
        return int(result.message_count or 0)
    finally:
        await connection.close()


async def drain(settings: Settings, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Take every ready message off ``queue`` (acked) and return them."""
    connection = await aio_pika.connect(settings.url.get_secret_value())
    taken = []
    try:
        channel = await connection.channel()
        q = await channel.declare_queue(queue, passive=True)
        while (message := await q.get(no_ack=True, fail=False)) is not None:
            taken.append(message)
    finally:
        await connection.close()
    return taken


def work_queue(settings: Settings, destination: str) -> str:
    return settings.layout.work_queue(destination)


def parking_queue(settings: Settings) -> str:
    return settings.layout.parking


@dataclass
class Call:
    """One call of a handler, as the handler saw it."""

    at: float  # time.time() when the handler started
    value: Any
    message_id: str
    attempt: int
    due_at: datetime | None
    lateness: timedelta | None
    redelivered: bool
    headers: dict[str, Any]


@dataclass
class Calls:
    """Thread-safe record of handler calls (sync handlers run in threads)."""

    items: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, value: Any, ctx: Context) -> Call:
        call = Call(
            time.time(),
            value,
            ctx.message_id,
            ctx.attempt,
            ctx.due_at,
            ctx.lateness,
            ctx.redelivered,
            dict(ctx.headers),
        )
        with self._lock:
            self.items.append(call)
        return call

    def __len__(self) -> int:
        with self._lock:
            return len(self.items)

    def of(self, message_id: str) -> list[Call]:
        with self._lock:
            return [c for c in self.items if c.message_id == message_id]
