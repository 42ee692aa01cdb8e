"""The x-delay bridge's messages, pure: the ``x-delay`` header, and the envelope.

Users of the delayed-message-exchange plugin publish to an exchange ``NAME`` with an
``x-delay`` header (milliseconds). The bridge takes every such message from an inbox
queue, sends it through rmqdelay's tiers to a destination of its own (stage 1), and when
it falls due publishes it to the delivery exchange ``DNAME`` with the routing key, body,
headers and properties it came with (stage 2). The original routing key, properties and
headers travel in an *envelope* in front of the body (:func:`wrap`), so that stage 2 can
send them exactly, whatever rmqdelay and the broker add on the way (attempt, due time,
``x-death``).

What the plugin did with an ``x-delay`` (``rabbit_delayed_message_utils:get_delay``):
integers are the delay; a float is truncated; a string is read as an integer; a delay
of 0 or less, or a header that is missing, routes the message at once; so does any
other type, and a delay over 2^32 - 1 ms; a string that is not an integer crashed the
route. The bridge follows it where that was sane (missing, zero or negative: at once;
floats truncated; integer strings read) and parks with a reason what was a publisher's
bug (a string that is no integer, a bool, a table, a timestamp...) or cannot be held (a
delay over ``max_delay``): never dropped, never delivered early. Delays between 2^32 - 1
ms (about 49.7 days) and ``max_delay`` are held for their whole delay, where the plugin
delivered them at once.

AMQP 1.0 clients (RabbitMQ 4's own, and the Tanzu Delayed Queue's users) ask with the
message annotations ``x-opt-delivery-delay`` (ms) and ``x-opt-delivery-time`` (Unix ms),
which RabbitMQ hands a 0-9-1 consumer as headers of the same names: the bridge reads
them as it reads ``x-delay``, rounding up, and with several takes the latest time
(:func:`read_delay`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from ..core.clock import (
    datetime_of_us,
    now_us,
    seconds_of_datetime,
    timedelta_of_ms,
    us_of_ms,
)
from ..core.durations import format_ms
from ..core.publishing.templates import new_message_id
from ..core.wire import encode_properties
from ..errors import InvalidMessageError

__all__ = [
    "CONTENT_TYPE",
    "DELAY_HEADERS",
    "PLUGIN_MAX_DELAY_MS",
    "PROPERTY_NAMES",
    "X_DELAY",
    "X_OPT_DELIVERY_DELAY",
    "X_OPT_DELIVERY_TIME",
    "Carried",
    "Inbound",
    "Restored",
    "carry",
    "read_delay",
    "unwrap",
    "wrap",
]

X_DELAY = "x-delay"
X_OPT_DELIVERY_DELAY = "x-opt-delivery-delay"
X_OPT_DELIVERY_TIME = "x-opt-delivery-time"
DELAY_HEADERS = (X_OPT_DELIVERY_TIME, X_OPT_DELIVERY_DELAY, X_DELAY)
"""What the bridge reads a due time from (an AMQP 1.0 client's message annotations
reach it as headers of the same names) and takes off the delivered copy."""
CONTENT_TYPE = "application/x-rmqdelay-bridge"
"""A bridged copy's: its body is the envelope, then the original body (:func:`wrap`)."""
_MAGIC = b"rmqdb\x01"
PLUGIN_MAX_DELAY_MS = 2**32 - 1
"""The plugin's longest delay (an Erlang timer); it delivered longer ones at once."""

PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)
"""Basic's properties besides ``headers``, as :func:`rmqdelay.core.wire.encode_properties`
names them: the envelope keeps those a message came with."""

_INTEGER = re.compile(r"^[+-]?[0-9]+$")


# --------------------------------------------------------------------------- x-delay


@dataclass(frozen=True)
class Inbound:
    """What stage 1 does with a message: hold it ``delay_ms`` (0: now), or park it."""

    delay_ms: int | None
    reason: str = ""

    @property
    def parked(self) -> bool:
        return self.delay_ms is None


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _milliseconds(name: str, value: object, *, up: bool) -> int | str:
    """A header's whole number of milliseconds, or why it is none. ``up``: a fraction
    rounds up (never early); ``x-delay`` truncates it, as the plugin did."""
    if isinstance(value, bool):
        pass
    elif isinstance(value, int):
        return value
    elif isinstance(value, (float, Decimal)):
        if not (math.isfinite(value) if isinstance(value, float) else value.is_finite()):
            return f"{name} {value} is not a finite number of milliseconds"
        return math.ceil(value) if up else math.trunc(value)
    elif isinstance(value, (str, bytes, bytearray)):
        text = value if isinstance(value, str) else bytes(value).decode("ascii", "replace")
        if _INTEGER.fullmatch(text):
            return int(text)
        plugin = " (the plugin refused such a message)" if name == X_DELAY else ""
        return f"{name} {_shown(value)} is not a whole number of milliseconds{plugin}"
    return f"{name} {_shown(value)} ({type(value).__name__}) is not a number of milliseconds"


def _due_in(value: object, received_us: int) -> int | str:
    """``x-opt-delivery-time`` as milliseconds from ``received_us``, rounded up: Unix ms,
    or a timestamp. An AMQP 1.0 timestamp reaches 0-9-1 in whole seconds (RabbitMQ's
    ``mc_amqpl`` drops the milliseconds), so a timestamp is taken at the end of its
    second: up to 999 ms late, never early."""
    if isinstance(value, datetime):
        at_ms: int | str = seconds_of_datetime(value) * 1000 + 999
    else:
        at_ms = _milliseconds(X_OPT_DELIVERY_TIME, value, up=True)
    if isinstance(at_ms, str):
        return at_ms
    return -((received_us - us_of_ms(at_ms)) // 1000)


def read_delay(
    headers: Mapping[str, Any] | None, max_delay_ms: int, received_us: int | None = None
) -> Inbound:
    """The delay a message's headers ask for, from ``received_us`` (now if None).

    ``x-delay`` the plugin's way where that was sane (see the module docstring);
    ``x-opt-delivery-delay`` (ms) and ``x-opt-delivery-time`` (Unix ms), the AMQP 1.0
    annotations, the same way but rounded up. With several, the latest time they name:
    the message is early for none of them. One that cannot be read, or asks for more
    than ``max_delay``, parks the message with the reason, naming the header.
    """
    if not headers:
        return Inbound(0)  # the plugin routed a message without x-delay at once
    delays = []
    for name in DELAY_HEADERS:
        if name not in headers:
            continue
        value = headers[name]
        timed = name == X_OPT_DELIVERY_TIME
        if timed:
            ms = _due_in(value, now_us() if received_us is None else received_us)
        else:
            ms = _milliseconds(name, value, up=name != X_DELAY)
        if isinstance(ms, str):
            return Inbound(None, ms)
        if ms > max_delay_ms:
            asked = f"{ms} ms ({format_ms(ms)})"
            if timed:
                asked = f"{_shown(value)} ({format_ms(ms)} away)"
            return Inbound(
                None,
                f"{name} {asked} is over max_delay {format_ms(max_delay_ms)}: "
                "raise max_delay in the bridge's settings",
            )
        delays.append(ms)
    return Inbound(max([0, *delays]))  # 0 or less, or none: at once, as the plugin did


# --------------------------------------------------------------------------- envelope


def _short(field: str, text: str) -> bytes:
    data = text.encode()
    if len(data) > 255:
        raise InvalidMessageError(field, f"is {len(data)} bytes, over AMQP's 255")
    return bytes((len(data),)) + data


def wrap(
    exchange: str,
    routing_key: str,
    properties: Mapping[str, Any],
    message_id: str,
    body: bytes,
) -> bytes:
    """The body of a bridged copy: the envelope, then the original body.

    The envelope holds where the message came from and its properties as stage 2 will
    send them, encoded once here (:func:`rmqdelay.core.wire.encode_properties`): those of
    :data:`PROPERTY_NAMES` it came with, its ``headers`` but ``x-delay``, and
    ``message_id`` (its own, or the one the bridge gave it)::

        b"rmqdb" 0x01 | exchange | routing key | user id ("" for none)  (each: length
        octet, UTF-8) | properties (32-bit length, bytes) | the original body

    In the body, not in headers: the copy's headers are then the usual message's, which
    both rmqdelay's publisher and its journal encode fastest; a table of tables in the
    headers cost the bridge half of its time per message. Raises InvalidMessageError for
    a value AMQP cannot carry (none that a broker delivered).
    """
    headers = properties.get("headers") or {}
    kept = {k: v for k, v in headers.items() if k not in DELAY_HEADERS}
    props: dict[str, Any] = {
        k: properties[k] for k in PROPERTY_NAMES if properties.get(k) is not None
    }
    props["message_id"] = message_id
    props["headers"] = kept or None
    encoded = encode_properties(props)
    user = props.get("user_id")
    return b"".join(
        (
            _MAGIC,
            _short("exchange", exchange),
            _short("routing key", routing_key),
            _short("user_id", "" if user is None else str(user)),
            len(encoded).to_bytes(4, "big"),
            encoded,
            body,
        )
    )


@dataclass(frozen=True)
class Restored:
    """The message as stage 2 publishes it to ``DNAME``."""

    exchange: str
    routing_key: str
    properties: bytes
    """The content header's property list, as :func:`wrap` encoded it."""
    message_id: str
    user_id: str | None
    body: bytes


def unwrap(data: bytes, message_id: str) -> Restored:
    """The original message from a bridged copy's body; ValueError if it is none.

    ``message_id`` is the copy's: the original's, or the one stage 1 gave it, which
    ``scheduled list`` and ``cancel`` show and the properties carry (aiormq matches a
    returned message to its publish by its id, and an unroutable one must come back to
    be parked).
    """
    if not data.startswith(_MAGIC):
        raise ValueError("not a message the x-delay bridge scheduled (its body has no envelope)")
    try:
        at = len(_MAGIC)
        texts = []
        for _ in range(3):
            size = data[at]
            texts.append(data[at + 1 : at + 1 + size].decode())
            at += 1 + size
        size = int.from_bytes(data[at : at + 4], "big")
        at += 4
        if at + size > len(data):
            raise IndexError
        properties = data[at : at + size]
    except (IndexError, UnicodeDecodeError):
        raise ValueError("the x-delay bridge's envelope is cut short or garbled") from None
    exchange, routing_key, user = texts
    return Restored(exchange, routing_key, properties, message_id, user or None, data[at + size :])


# --------------------------------------------------------------------------- stage 1


@dataclass(frozen=True)
class Carried:
    """One inbox message as stage 1 sends it on: the copy's body (None when even the
    envelope cannot be made), a publish request for the tiers, or a reason to park it."""

    message_id: str
    body: bytes | None
    request: dict[str, Any] | None
    reason: str = ""


def carry(
    destination: str,
    max_delay_ms: int,
    exchange: str,
    routing_key: str,
    properties: Mapping[str, Any],
    body: bytes,
    *,
    received_us: int | None = None,
    inbound: Inbound | None = None,
) -> Carried:
    """What stage 1 does with one message delivered from the inbox (``properties`` under
    :data:`PROPERTY_NAMES`, plus ``headers``): read its ``x-delay``, give it an id if it
    has none, wrap it, and make the request ``publish_many`` takes (the usual message:
    the copy's own content type, no headers).

    ``received_us``: when the delivery arrived. The delay counts from there (the due time
    is ``at=`` it plus ``x-delay``), not from when its batch is sent: a message that
    waited for the batch before it is not late by that wait. ``inbound``: what
    :func:`read_delay` made of its headers, when the caller read them already.
    """
    given = properties.get("message_id")
    message_id = given if isinstance(given, str) and given else new_message_id()
    if inbound is None:
        inbound = read_delay(properties.get("headers"), max_delay_ms, received_us)
    try:
        wrapped = wrap(exchange, routing_key, properties, message_id, body)
    except InvalidMessageError as exc:
        return Carried(message_id, None, None, f"cannot be carried: {exc}")
    if inbound.delay_ms is None:
        return Carried(message_id, wrapped, None, inbound.reason)
    request: dict[str, Any] = {
        "destination": destination,
        "body": wrapped,
        "message_id": message_id,
        "content_type": CONTENT_TYPE,
    }
    if received_us is None:
        request["delay"] = timedelta_of_ms(inbound.delay_ms)
    else:
        request["at"] = datetime_of_us(received_us + us_of_ms(inbound.delay_ms))
    return Carried(message_id, wrapped, request)
