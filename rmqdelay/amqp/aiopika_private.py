"""Every reach into aio-pika's private make-up, in one place: building a delivery's message.

``aio_pika.IncomingMessage(delivered)`` sets its two dozen slots one by one through
``Message.__setattr__``, a Python-level lock check per attribute: about half of the
constructor's time, and the worker builds one per delivery (bench/README.md, "What limits
the figures"). :func:`incoming_message` runs the very same ``__init__`` on an instance of a
subclass whose ``__setattr__`` is ``object``'s (a new message is never locked while it is
built), then makes it a plain ``IncomingMessage``: the same object, lock included, at about
half the cost.

That needs ``IncomingMessage`` to keep its attributes in slots (no ``__dict__``), which is
checked when this module is imported, on a sample delivery built both ways. When the check
fails, or ``RMQDELAY_CLIENT_FAST=0`` asks for it, the public constructor is used.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, cast

from aio_pika import IncomingMessage
from aiormq.abc import DeliveredMessage
from pamqp import commands
from pamqp.header import ContentHeader

from .publishing import client_fast

__all__ = ["PROBLEM", "incoming_message", "self_check"]

log = logging.getLogger("rmqdelay.worker")


class _Building(IncomingMessage):
    """An ``IncomingMessage`` while its ``__init__`` runs: attributes set without the lock
    check. Never seen outside :func:`incoming_message`."""

    __slots__ = ()
    __setattr__ = object.__setattr__  # type: ignore[assignment]


def _fast(delivered: DeliveredMessage, no_ack: bool = False) -> IncomingMessage:
    message = _Building.__new__(_Building)
    IncomingMessage.__init__(message, delivered, no_ack=no_ack)
    message.__class__ = IncomingMessage  # type: ignore[assignment]
    return message


def _slots(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        for name in getattr(klass, "__slots__", ()):
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"
            names.append(name)
    return names


def _sample(**properties: Any) -> DeliveredMessage:
    deliver = commands.Basic.Deliver(
        consumer_tag="ctag", delivery_tag=7, redelivered=True, exchange="x", routing_key="k"
    )
    header = ContentHeader(0, 3, commands.Basic.Properties(**properties))
    return DeliveredMessage(delivery=deliver, header=header, body=b"abc", channel=cast(Any, None))


def self_check() -> str:
    """What stops :func:`incoming_message` from building messages itself: empty when
    nothing does (the same slots, the same values, as the public constructor gives)."""
    if "__dict__" in dir(IncomingMessage) or "__dict__" in _slots(IncomingMessage):
        return "aio_pika.IncomingMessage keeps a __dict__"
    samples = (
        _sample(),
        _sample(
            message_id="m",
            delivery_mode=2,
            headers={"a": 1},
            content_type="application/json",
            correlation_id="c",
            expiration="1000",
            timestamp=datetime(2026, 11, 25, 12, tzinfo=timezone.utc),
            priority=3,
            app_id="app",
        ),
    )
    try:
        for delivered in samples:
            for no_ack in (False, True):
                built, public = _fast(delivered, no_ack), IncomingMessage(delivered, no_ack=no_ack)
                if type(built) is not IncomingMessage:
                    return "a built message is not an aio_pika.IncomingMessage"
                for name in _slots(IncomingMessage):
                    if getattr(built, name, _MISSING) != getattr(public, name, _MISSING):
                        return f"aio_pika.IncomingMessage's {name} differs when built here"
    except Exception as exc:  # a constructor or a class this module does not know
        return f"aio_pika.IncomingMessage cannot be built here ({type(exc).__name__}: {exc})"
    return ""


_MISSING = object()
PROBLEM = self_check()
"""Why :func:`incoming_message` uses the public constructor in this process, or empty."""
if PROBLEM:
    log.warning("%s: building each delivery's message through its constructor", PROBLEM)


def incoming_message() -> Callable[[DeliveredMessage], IncomingMessage]:
    """What builds ``aio_pika.IncomingMessage(delivered, no_ack=False)`` for a consumer
    (asked once per consumer: ``RMQDELAY_CLIENT_FAST`` is read now, not per delivery)."""
    if PROBLEM or not client_fast():
        return IncomingMessage
    return _fast
