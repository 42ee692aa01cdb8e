"""Waiting on pika's BlockingConnection with a deadline, every time.

pika's blocking calls wait for the broker's answer for ever: opening a channel, a
passive declare, a close. Its own timers (``call_later``) fire only inside
``process_data_events``, and its I/O loop keeps going while output is unsent, so a
broker that stops answering hangs the caller. These helpers drive the I/O loop
themselves until an answer, the connection's end, or the deadline. They use pika's
internals (``_impl``, ``_closed_result``) in this one module.
"""

from __future__ import annotations

import contextlib
import select
from collections.abc import Callable
from typing import Any

import pika
import pika.channel
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

__all__ = [
    "close_connection",
    "frame_max",
    "open_channel",
    "poll_once",
    "wait_until",
    "write_frames",
]


def _closed_error(connection: pika.BlockingConnection) -> BaseException | None:
    result: Any = connection._closed_result  # type: ignore[attr-defined]
    return result.value.error if result.ready else None


def wait_until(
    connection: pika.BlockingConnection, done: Callable[[], bool], timeout: float, what: str
) -> None:
    """Process I/O until ``done()``; raise why the connection closed, or TimeoutError."""
    impl: Any = connection._impl  # type: ignore[attr-defined]
    expired: list[bool] = []
    timer = impl.ioloop.call_later(timeout, lambda: expired.append(True))  # wakes the poll
    try:
        while not done() and not expired and _closed_error(connection) is None:
            impl.ioloop.poll()
            impl.ioloop.process_timeouts()
    finally:
        impl.ioloop.remove_timeout(timer)
    if done():
        return
    error = _closed_error(connection)
    if error is not None:
        raise error
    raise TimeoutError(f"no answer from the broker within {timeout:g}s ({what})")


def poll_once(connection: pika.BlockingConnection) -> None:
    """Handle what has already arrived (a close, say) without waiting; raise why it closed.

    ``process_data_events(0)`` would also wait for unsent output to drain. Nothing to
    read is the usual case, before every publish: one ``select`` on the socket answers it
    (a few µs) where a turn of pika's I/O loop costs tens (bench/README.md).
    """
    if not _readable(connection):
        return
    with contextlib.suppress(TimeoutError):
        wait_until(connection, lambda: False, 0, "polling")


def _readable(connection: pika.BlockingConnection) -> bool:
    """Whether the socket holds input; True when unsure (no socket found, TLS with bytes
    already decrypted and buffered, a closed socket): then the I/O loop is asked."""
    sock = getattr(getattr(connection._impl, "_transport", None), "_sock", None)  # type: ignore[attr-defined]
    if sock is None or sock.fileno() < 0:
        return True
    pending = getattr(sock, "pending", None)  # an ssl.SSLSocket
    if pending is not None and pending():
        return True
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


def frame_max(channel: pika.channel.Channel) -> int:
    """The frame size the connection agreed with the broker: where bodies are split."""
    return int(channel.connection.params.frame_max)


def write_frames(channel: pika.channel.Channel, data: bytes) -> None:
    """Queue frames already encoded (:func:`~rmqdelay.core.wire.encode_publish`) as one
    write: pika sends each frame it builds with a system call of its own."""
    channel._raise_if_not_open()  # type: ignore[attr-defined]  # as basic_publish does
    channel.connection._output_marshaled_frames([data])  # type: ignore[attr-defined]


def open_channel(connection: pika.BlockingConnection, timeout: float) -> BlockingChannel:
    """``connection.channel()`` with a deadline (pika waits for Channel.OpenOk for ever)."""
    opened: list[pika.channel.Channel] = []
    impl: pika.channel.Channel = connection._impl.channel(  # type: ignore[attr-defined]
        on_open_callback=opened.append
    )
    channel = BlockingChannel(impl, connection)
    impl._set_cookie(channel)  # type: ignore[attr-defined]  # as BlockingConnection.channel does
    wait_until(connection, lambda: bool(opened) or impl.is_closed, timeout, "opening a channel")
    if not opened:
        raise pika.exceptions.ChannelClosed(0, "the broker closed the channel as it opened")
    return channel


def close_connection(connection: pika.BlockingConnection, timeout: float) -> None:
    """Close with a deadline; past it, drop the socket. Never raises for a closed one."""
    if not connection.is_open:
        return
    impl: Any = connection._impl  # type: ignore[attr-defined]
    gone = (TimeoutError, pika.exceptions.AMQPError, OSError)
    try:
        impl.close(200, "Normal shutdown")  # closes its channels first, without waiting
        wait_until(connection, lambda: connection.is_closed, timeout, "closing the connection")
    except TimeoutError:
        impl._terminate_stream(pika.exceptions.ConnectionClosedByClient(200, "close timed out"))
        with contextlib.suppress(*gone):
            wait_until(connection, lambda: connection.is_closed, 1.0, "dropping the socket")
    except gone:
        pass  # it closed some other way: closed either way
