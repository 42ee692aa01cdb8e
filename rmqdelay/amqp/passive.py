"""Passive checks: does a queue exist, and how many messages are ready in it?

A failed passive declare makes the broker close its channel (404 missing, 403
refused), so each check opens a throwaway channel, never the caller's. One helper per
client library, both bounded by ``timeout``; needs no configure permission.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pika

from ..errors import AccessRefusedError
from .blocking import open_channel, wait_until

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

__all__ = ["queue_exists", "queue_exists_async", "ready_messages", "ready_messages_async"]


def ready_messages(connection: pika.BlockingConnection, queue: str, timeout: float) -> int | None:
    """Messages ready in ``queue``, None when it does not exist; AccessRefusedError on 403."""
    channel = open_channel(connection, timeout)
    impl: Any = channel._impl  # type: ignore[attr-defined]  # BlockingChannel's waits are unbounded
    answers: list[Any] = []
    closed: list[Any] = []
    impl.add_on_close_callback(lambda _channel, reason: closed.append(reason))
    impl.queue_declare(queue, passive=True, callback=answers.append)
    wait_until(connection, lambda: bool(answers or closed), timeout, f"checking queue {queue!r}")
    if answers:
        impl.close()  # its CloseOk comes with later I/O: nothing to wait for
        return int(answers[0].method.message_count)
    code, text = getattr(closed[0], "reply_code", None), getattr(closed[0], "reply_text", "")
    if code == 404:
        return None
    if code == 403:
        raise AccessRefusedError(queue, str(text))
    raise closed[0]


def queue_exists(connection: pika.BlockingConnection, queue: str, timeout: float) -> bool:
    """Whether ``queue`` exists (a passive declare on a channel of its own)."""
    return ready_messages(connection, queue, timeout) is not None


async def _declare(connection: AbstractConnection, queue: str) -> int | None:
    import aiormq

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
    import asyncio

    try:
        return await asyncio.wait_for(_declare(connection, queue), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(
            f"no answer from the broker within {timeout:g}s (checking queue {queue!r})"
        ) from None


async def queue_exists_async(connection: AbstractConnection, queue: str, timeout: float) -> bool:
    """Whether ``queue`` exists (a passive declare on a channel of its own)."""
    return await ready_messages_async(connection, queue, timeout) is not None
