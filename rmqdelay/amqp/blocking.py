"""pika's blocking calls, bounded by a deadline where the fast path allows it.

pika's public BlockingConnection waits for the broker's answer for ever: opening a
channel, a passive declare, a close. The fast path (:mod:`.pika_private`) bounds each
wait by driving pika's I/O loop itself; when it is off (``RMQDELAY_CLIENT_FAST=0``, or
a pika it was not checked on) these helpers call pika's public API, whose waits end
only with an answer or the connection's end (its heartbeat, on a silent broker).
"""

from __future__ import annotations

import contextlib

import pika
import pika.exceptions

from . import pika_private

__all__ = ["close_connection", "poll_once"]


def poll_once(connection: pika.BlockingConnection) -> None:
    """Handle what has already arrived (a close, say) without waiting; raise why it closed."""
    if pika_private.usable(connection):
        pika_private.poll_once(connection)
    else:
        connection.process_data_events(0)


def close_connection(connection: pika.BlockingConnection, timeout: float) -> None:
    """Close, within ``timeout`` on the fast path. Never raises for a closed one."""
    if not connection.is_open:
        return
    if pika_private.usable(connection):
        pika_private.close_connection(connection, timeout)
        return
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        connection.close()
