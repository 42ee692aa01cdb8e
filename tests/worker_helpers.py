"""Helpers for the worker tests: settings with topology, polling, and queue inspection."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import aio_pika

from rmqdelay import Settings
from rmqdelay.amqp.topology_manager import TopologyManager
from rmqdelay.core.context import Context


def make_settings(
    amqp_url: str, prefix: str, destinations: Iterable[str], **extra: Any
) -> Settings:
    """Settings for this test's prefix, with the topology applied for ``destinations``."""
    options: dict[str, Any] = {"max_delay": "1h", "connection_name": prefix, **extra}
    settings = Settings(url=amqp_url, prefix=prefix, **options)
    with TopologyManager(settings) as manager:
        manager.apply(list(destinations))
    return settings


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
    connection = await aio_pika.connect(settings.url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        result = declared.declaration_result
        return int(result.message_count or 0)
    finally:
        await connection.close()


async def drain(settings: Settings, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Take every ready message off ``queue`` (acked) and return them."""
    connection = await aio_pika.connect(settings.url)
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
