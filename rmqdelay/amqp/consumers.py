"""Consumers the broker cancels or cuts off, as aiormq shows them, on every version allowed.

RabbitMQ 4.3 cancels a quorum queue's consumer that holds a message past the consumer
timeout (``basic.cancel``) and takes back every message that consumer held; the channel
stays open, and a late ack of those messages is ignored (measured on 4.3.6). aiormq 7
calls the channel's ``on_consumer_cancel_callbacks`` and answers the broker; aiormq 6.8
and 6.9 only drop the tag from the channel's ``consumers`` and tell no one. So whether a
consumer still consumes is read from that mapping (:func:`consuming`), and the callback,
where there is one, only wakes the worker sooner (:func:`on_broker_cancel`).

RabbitMQ 3.10 to 4.2 close the whole channel instead (:func:`is_consumer_timeout`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import aiormq
from aio_pika.abc import AbstractConnection

__all__ = ["broker_version", "consuming", "is_consumer_timeout", "on_broker_cancel"]


def consuming(channel: Any, tag: str) -> bool:
    """Whether the aiormq ``channel`` still has consumer ``tag`` (neither the broker nor
    the worker cancelled it)."""
    consumers = getattr(channel, "consumers", None)
    return consumers is None or tag in consumers  # unknown: never treat it as cancelled


def on_broker_cancel(channel: Any, callback: Callable[[], None]) -> bool:
    """Call ``callback`` when the broker cancels a consumer of the aiormq ``channel``;
    False when this aiormq cannot tell (6.8, 6.9): the worker polls instead."""
    callbacks = getattr(channel, "on_consumer_cancel_callbacks", None)
    if callbacks is None:
        return False
    callbacks.add(lambda _frame: callback())
    return True


def is_consumer_timeout(error: BaseException | None) -> bool:
    """A channel RabbitMQ 3.10 to 4.2 closed because a delivery was not acknowledged
    within the consumer timeout (``PRECONDITION_FAILED - delivery acknowledgement on
    channel N timed out``)."""
    return isinstance(error, aiormq.exceptions.ChannelPreconditionFailed) and (
        "delivery acknowledgement" in str(error)
    )


def broker_version(connection: AbstractConnection) -> tuple[int, ...] | None:
    """The broker's version from the connection's server properties, e.g. ``(4, 3, 6)``."""
    transport = getattr(connection, "transport", None)
    properties = getattr(getattr(transport, "connection", None), "server_properties", None)
    version = (properties or {}).get("version")
    if isinstance(version, bytes):
        version = version.decode("utf-8", "replace")
    if not isinstance(version, str):
        return None
    parts = re.findall(r"\d+", version)[:3]
    return tuple(int(p) for p in parts) or None
