"""Message bodies and headers, independent of any client library."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict, cast

from ..errors import InvalidBodyError

__all__ = [
    "ATTEMPT",
    "CARRIED",
    "DESTINATION",
    "DUE_AT",
    "KEY",
    "PERSISTENT",
    "Body",
    "MessageProperties",
    "amqp_properties",
    "carried_properties",
    "clean_headers",
    "encode_body",
    "header_int",
    "jsonable",
]

DUE_AT = "rmqdelay-due-at"
DESTINATION = "rmqdelay-destination"
ATTEMPT = "rmqdelay-attempt"
KEY = "rmqdelay-key"
"""A keyed message's key, so a worker knows to ask the journal before handling it."""
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
BINARY = "application/octet-stream"

PERSISTENT = 2
"""AMQP's delivery mode for a message the broker writes to disk."""

if TYPE_CHECKING:
    from pydantic import BaseModel

Body: TypeAlias = "bytes | bytearray | memoryview | str | Mapping[str, Any] | list[Any] | BaseModel"
"""What ``publish`` takes: bytes (or a bytearray or memoryview, copied when published),
text, a JSON dict or list, or a pydantic model."""


class MessageProperties(TypedDict, total=False):
    """The AMQP properties ``publish`` takes besides the message id and headers.

    A message keeps all of them through retries, parking and replays (:data:`CARRIED`).
    """

    correlation_id: str | None
    content_type: str | None
    """Default: from the body's type."""
    content_encoding: str | None
    priority: int | None
    """0 to 255; only a queue declared with x-max-priority uses it."""
    reply_to: str | None
    type: str | None
    app_id: str | None


CARRIED: tuple[str, ...] = tuple(MessageProperties.__annotations__)
"""The names of :class:`MessageProperties`, as pika and aio-pika call them."""


def carried_properties(message: object) -> MessageProperties:
    """The carried properties of a received message (any object with those attributes).

    A retry or replay is a new publish, so everything the sender set must be copied
    over, or a handler on the next attempt would find, say, no ``reply_to``.
    """
    return cast(MessageProperties, {name: getattr(message, name, None) for name in CARRIED})


def amqp_properties(
    message_id: str,
    headers: Mapping[str, Any],
    carried: Mapping[str, Any],
    timestamp: object = None,
) -> dict[str, Any]:
    """Every AMQP property of a message rmqdelay sends, as plain values: the one place.

    Names are pika's and aio-pika's (``type``, not pamqp's ``message_type``); always
    persistent. ``timestamp`` only when parking keeps the original one.
    """
    properties = {name: carried.get(name) for name in CARRIED}
    properties.update(message_id=message_id, headers=headers, delivery_mode=PERSISTENT)
    if timestamp is not None:
        properties["timestamp"] = timestamp
    return properties


_DEATH_PREFIXES = ("x-first-death-", "x-last-death-")


def encode_body(body: object) -> tuple[bytes, str]:
    """Serialize a body; return the bytes and their content type."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        try:
            return bytes(body), BINARY  # a copy: a bytearray changed later changes nothing
        except ValueError as exc:  # a released memoryview
            raise InvalidBodyError(f"body cannot be read: {exc}") from None
    if isinstance(body, str):
        try:
            return body.encode(), TEXT
        except UnicodeEncodeError as exc:
            raise InvalidBodyError(f"a str body must be valid text: {exc}") from None
    model = _model_json(body)
    if model is not None:
        return model, JSON
    if isinstance(body, (Mapping, list, tuple)):
        try:
            text = json.dumps(body, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise InvalidBodyError(f"body cannot be serialized as JSON: {exc}") from None
        return text.encode(), JSON
    if isinstance(body, float) and not math.isfinite(body):
        raise InvalidBodyError(f"body cannot be serialized as JSON: {body!r}")
    raise InvalidBodyError(
        f"cannot serialize a body of type {type(body).__name__}: pass bytes, str, "
        "a dict or list (sent as JSON) or a pydantic model"
    )


def _model_json(body: object) -> bytes | None:
    """A pydantic model's JSON; None for anything else. pydantic is imported only if the
    caller has imported it (a model cannot exist without it): ``rmqdelay publish``
    starts faster without it."""
    if "pydantic" not in sys.modules:
        return None
    from pydantic import BaseModel

    return body.model_dump_json().encode() if isinstance(body, BaseModel) else None


def clean_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Copy headers without the broker's dead-letter records.

    Before RabbitMQ 4.0.1 a message that dead-letters through a queue already in its
    ``x-death`` with no rejection in between is dropped silently, so a message that
    goes round the tiers again must not carry them.
    """
    if not headers:
        return {}
    return {k: v for k, v in headers.items() if not _is_death_record(k)}


def _is_death_record(name: object) -> bool:
    # a name that is no str is kept, for the encoder to refuse by name
    return isinstance(name, str) and (name == "x-death" or name.startswith(_DEATH_PREFIXES))


def jsonable(value: Any) -> Any:
    """Header values (and results) as plain JSON values, for people to read: bytes as
    UTF-8 text, datetimes as ISO 8601, any other type AMQP carries (a Decimal) as str.
    ``rmqdelay consume --json`` and the dashboard show headers through it."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def header_int(headers: Mapping[str, Any], key: str, default: int) -> int:
    """An integer header written by any client (int, text or bytes); ``default`` if unusable."""
    value = headers.get(key)
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    try:
        return int(value) if value is not None and not isinstance(value, bool) else default
    except (TypeError, ValueError):
        return default
