"""Passive checks: does a queue exist, and how many messages are ready in it? Does an
exchange exist?

A failed passive declare makes the broker close its channel (404 missing, 403
refused), so each check opens a throwaway channel, never the caller's. One helper per
client library, both bounded by ``timeout`` (pika's only on rmqdelay's fast path,
:mod:`.pika_private`); needs no configure permission.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Any

import pika
import pika.exceptions

from ..errors import AccessRefusedError
from . import pika_private

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

__all__ = [
    "exchange_exists",
    "exchange_exists_async",
    "queue_exists",
    "queue_exists_async",
    "ready_messages",
    "ready_messages_async",
]


def ready_messages(connection: pika.BlockingConnection, queue: str, timeout: float) -> int | None:
    """Messages ready in ``queue``, None when it does not exist; AccessRefusedError on 403.

    Bounded by ``timeout`` on the fast path; pika's public path waits for the answer.
    """
    return _passive(connection, queue, timeout, exchange=False)


def _passive(
    connection: pika.BlockingConnection, name: str, timeout: float, *, exchange: bool
) -> int | None:
    """A passive declare of a queue (its ready count) or an exchange (0); None on 404."""
    if not pika_private.usable(connection):
        try:
            channel = connection.channel()
            if exchange:
                channel.exchange_declare(name, passive=True)
                count = 0
            else:
                count = channel.queue_declare(name, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker as exc:
            _refused(name, exc)
            return None
        channel.close()
        return int(count)
    impl = pika_private.open_channel(connection, timeout)
    answers: list[Any] = []
    closed: list[Any] = []
    impl.add_on_close_callback(lambda _channel, reason: closed.append(reason))
    if exchange:
        impl.exchange_declare(name, passive=True, callback=answers.append)
    else:
        impl.queue_declare(name, passive=True, callback=answers.append)
    what = f"checking {'exchange' if exchange else 'queue'} {name!r}"
    pika_private.wait_until(connection, lambda: bool(answers or closed), timeout, what)
    if answers:
        impl.close()  # its CloseOk comes with later I/O: nothing to wait for
        return 0 if exchange else int(answers[0].method.message_count)
    _refused(name, closed[0])
    return None


def _refused(queue: str, reason: BaseException) -> None:
    """Return for a missing queue (404); raise AccessRefusedError (403), or ``reason``."""
    code, text = getattr(reason, "reply_code", None), getattr(reason, "reply_text", "")
    if code == 404:
        return
    if code == 403:
        raise AccessRefusedError(queue, str(text))
    raise reason


def queue_exists(connection: pika.BlockingConnection, queue: str, timeout: float) -> bool:
    """Whether ``queue`` exists (a passive declare on a channel of its own)."""
    return ready_messages(connection, queue, timeout) is not None


_CHECKS: weakref.WeakKeyDictionary[AbstractConnection, asyncio.Lock] = weakref.WeakKeyDictionary()


def _checking(connection: AbstractConnection) -> asyncio.Lock:
    """One passive check at a time per connection. A 404 closes the check's channel, and
    aiormq frees its number when the broker's Channel.Close arrives, before its CloseOk
    is queued: a channel opened meanwhile may take the number and send Channel.Open
    first ("second 'channel.open' seen"). Once a check has raised, its CloseOk is queued,
    so the next check's Channel.Open goes after it. (A held marker's check is a 404 for
    every destination not held: many concurrent publishes met this at once.)"""
    lock = _CHECKS.get(connection)
    if lock is None:
        lock = _CHECKS[connection] = asyncio.Lock()
    return lock


async def _declare(connection: AbstractConnection, queue: str) -> int | None:
    import aiormq

    async with _checking(connection):
        channel = await connection.channel(publisher_confirms=False)
        try:
            declared = await channel.declare_queue(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return None
        except aiormq.exceptions.ChannelAccessRefused as exc:
            raise AccessRefusedError(queue, str(exc.args[-1] if exc.args else exc)) from None
        await channel.close()
    result = declared.declaration_result
    return int(result.message_count or 0) if result is not None else 0


async def ready_messages_async(
    connection: AbstractConnection, queue: str, timeout: float
) -> int | None:
    """Messages ready in ``queue``, None when it does not exist; AccessRefusedError on 403."""
    try:
        return await asyncio.wait_for(_declare(connection, queue), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(
            f"no answer from the broker within {timeout:g}s (checking queue {queue!r})"
        ) from None


async def queue_exists_async(connection: AbstractConnection, queue: str, timeout: float) -> bool:
    """Whether ``queue`` exists (a passive declare on a channel of its own)."""
    return await ready_messages_async(connection, queue, timeout) is not None


def exchange_exists(
    connection: pika.BlockingConnection, exchange: str, timeout: float = 30.0
) -> bool:
    """Whether ``exchange`` exists (a passive declare on a channel of its own);
    AccessRefusedError on 403."""
    return _passive(connection, exchange, timeout, exchange=True) is not None


async def exchange_exists_async(
    connection: AbstractConnection, exchange: str, timeout: float = 30.0
) -> bool:
    """Whether ``exchange`` exists (a passive declare on a channel of its own);
    AccessRefusedError on 403."""

    import aiormq

    async def check() -> bool:
        async with _checking(connection):
            channel = await connection.channel(publisher_confirms=False)
            try:
                await channel.get_exchange(exchange, ensure=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                return False
            except aiormq.exceptions.ChannelAccessRefused as exc:
                detail = str(exc.args[-1] if exc.args else exc)
                raise AccessRefusedError(exchange, detail) from None
            await channel.close()
            return True

    try:
        return await asyncio.wait_for(check(), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(
            f"no answer from the broker within {timeout:g}s (checking exchange {exchange!r})"
        ) from None
