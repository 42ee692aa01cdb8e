"""Parking a message as a worker parks one, for the tests of the parked messages' pages."""

from __future__ import annotations

import pika

from rmqdelay import Settings
from rmqdelay.core.handling.parking import PARKED_DESTINATION, PARKED_REASON

__all__ = ["park"]


def park(
    settings: Settings,
    destination: str,
    message_id: str,
    body: bytes = b"parked",
    reason: str = "handler gave up",
) -> None:
    """Put one message in the parking queue of ``settings``, confirmed, naming
    ``destination`` and ``reason`` in the headers a worker sets when it parks one."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.urls[0]))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        properties = pika.BasicProperties(
            message_id=message_id,
            headers={PARKED_DESTINATION: destination, PARKED_REASON: reason},
        )
        channel.basic_publish(settings.layout.parking, "", body, properties, mandatory=True)
    finally:
        connection.close()
