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
from rmqdelay.core.clock import datetime_of_ms, now_ms
from rmqdelay.core.journal import flows as journal_flows
from rmqdelay.core.journal.keys import KeyBook

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
    rendezvous: Start,
    seed: int,
    resend_share: float,
) -> list[tuple[str, str, int]]:
    settings = settings_of(url, prefix, f"{prefix}-pub-{seed}")
    rng = random.Random(seed)
    sent: list[tuple[str, str, int]] = []
    async with AsyncPublisher(settings) as publisher:
        rendezvous.ready.put(seed)  # connected: the due time is set once every share is
        if not await asyncio.to_thread(rendezvous.go.wait, START_WAIT_S):
            raise TimeoutError(f"share {seed}: no due time within {START_WAIT_S} s")
        due_ms = int(rendezvous.due["ms"])

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


START_WAIT_S = 120.0
"""How long a racing process waits for the others to connect (a loaded CI machine
spawns and imports slowly)."""


@dataclass(frozen=True)
class Start:
    """The racing processes' rendezvous: each says it is connected on ``ready``; the due
    time is then set in ``due`` and ``go`` let them all publish at once."""

    ready: Any
    go: Any
    due: Any


def race(
    url: str,
    prefix: str,
    destination: str,
    mode: Mode,
    key_names: Sequence[str],
    publishes: int,
    processes: int,
    due_in_ms: int,
    resend_share: float = 0.1,
) -> tuple[list[tuple[str, str, int]], int]:
    """``publishes`` keyed publishes over ``key_names`` from ``processes`` processes at
    once, due ``due_in_ms`` (and up to a second more) after every process is connected:
    every (id, key, due) sent, resends included, and the first due time. The time the
    processes take to start is not taken from the publishes' time before they are due."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(processes) as pool:
        start = Start(manager.Queue(), manager.Event(), manager.dict())
        per = publishes // processes
        shares = []
        for p in range(processes):
            keys = [key_names[(p * per + i) % len(key_names)] for i in range(per)]
            random.Random(p).shuffle(keys)
            shares.append((url, prefix, destination, mode, keys, start, p, resend_share))
        running = pool.map_async(publish_share, shares)
        for _ in range(processes):
            start.ready.get(timeout=START_WAIT_S)
        due_ms = now_ms() + due_in_ms
        start.due["ms"] = due_ms
        start.go.set()
        results = running.get(timeout=START_WAIT_S + due_in_ms / 1000)
    return [item for share in results for item in share], due_ms


async def read_book(settings: Settings) -> KeyBook:
    """The journal folded as every reader folds it."""
    book = KeyBook()
    connection = await aio_pika.connect(settings.url.get_secret_value())
    try:
        records = await run_journal_async(journal_flows.read(settings.layout), connection)
    finally:
        await connection.close()
    return book.extend(records)
