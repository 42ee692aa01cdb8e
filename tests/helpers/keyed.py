"""Keyed publishes from racing processes, reschedule records, and the journal folded, for
the keys tests on the worker's side."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aio_pika

from rmqdelay import AsyncPublisher, Settings
from rmqdelay.amqp.journal import run_journal_async
from rmqdelay.core import journal_flows
from rmqdelay.core.clock import datetime_of_ms, now_ms
from rmqdelay.core.keys import KeyBook

Mode = Literal["ignore", "replace"]


@dataclass(frozen=True)
class Sent:
    message_id: str
    key: str
    due_ms: int
    recorded_at_ms: int


async def publish_keyed(
    publisher: AsyncPublisher,
    destination: str,
    body: Any,
    *,
    key: str,
    mode: Mode,
    due_ms: int,
    message_id: str | None = None,
) -> Sent:
    """A keyed publish due at ``due_ms`` (``message_id`` given: the same copy again)."""
    message_id = message_id or str(uuid.uuid4())
    result = await publisher.publish(
        destination,
        body,
        at=datetime_of_ms(due_ms),
        message_id=message_id,
        key=key,
        on_conflict=mode,
    )
    assert result.key == key
    return Sent(message_id, key, due_ms, now_ms())


def settings_of(url: str, prefix: str, name: str) -> Settings:
    return Settings(url=url, prefix=prefix, max_delay="1h", connection_name=name)


async def _publish_share(
    url: str,
    prefix: str,
    destination: str,
    mode: Mode,
    keys: Sequence[str],
    due_ms: int,
    seed: int,
    resend_share: float,
) -> list[tuple[str, str, int]]:
    settings = settings_of(url, prefix, f"{prefix}-pub-{seed}")
    rng = random.Random(seed)
    sent: list[tuple[str, str, int]] = []
    async with AsyncPublisher(settings) as publisher:

        async def one(key: str) -> None:
            due = due_ms + rng.randrange(0, 1000)
            done = await publish_keyed(
                publisher,
                destination,
                {"key": key},
                key=key,
                mode=mode,
                due_ms=due,
            )
            sent.append((done.message_id, key, due))
            if rng.random() < resend_share:  # at least once: the same copy again
                await publish_keyed(
                    publisher,
                    destination,
                    {"key": key},
                    key=key,
                    mode=mode,
                    due_ms=due,
                    message_id=done.message_id,
                )
                sent.append((done.message_id, key, due))

        for start in range(0, len(keys), 25):
            await asyncio.gather(*(one(k) for k in keys[start : start + 25]))
    return sent


def publish_share(args: tuple[Any, ...]) -> list[tuple[str, str, int]]:
    """One process's share of a race: its keys published (and some sent twice)."""
    return asyncio.run(_publish_share(*args))


def race(
    url: str,
    prefix: str,
    destination: str,
    mode: Mode,
    key_names: Sequence[str],
    publishes: int,
    processes: int,
    due_ms: int,
    resend_share: float = 0.1,
) -> list[tuple[str, str, int]]:
    """``publishes`` keyed publishes over ``key_names`` from ``processes`` processes at
    once; every (id, key, due) sent, resends included."""
    per = publishes // processes
    shares = []
    for p in range(processes):
        keys = [key_names[(p * per + i) % len(key_names)] for i in range(per)]
        random.Random(p).shuffle(keys)
        shares.append((url, prefix, destination, mode, keys, due_ms, p, resend_share))
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        results = pool.map(publish_share, shares)
    return [item for share in results for item in share]


async def read_book(settings: Settings) -> KeyBook:
    """The journal folded as every reader folds it."""
    book = KeyBook()
    connection = await aio_pika.connect(settings.url.get_secret_value())
    try:
        records = await run_journal_async(journal_flows.read(settings.layout), connection)
    finally:
        await connection.close()
    return book.extend(records)
