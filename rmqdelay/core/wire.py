"""A message's AMQP properties as bytes, encoded here once for both client libraries.

pika and pamqp (aio-pika's encoder) disagree on header values: pika cannot send a
float at all, pamqp rounds one to 32 bits, refuses ``bytes`` and cuts names over 128
bytes; an int over 64 bits breaks pika's connection state and a table over the frame
size makes the broker close the connection. So rmqdelay encodes the content-header
property list itself, checking every value on the way: a value AMQP 0-9-1 cannot carry
raises :class:`~rmqdelay.errors.InvalidMessageError` before anything is sent, and both
publishers put the same bytes on the wire. Pure: no client library here.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from ..errors import InvalidMessageError
from . import clock

__all__ = [
    "FRAME_MAX",
    "MAX_PROPERTIES_BYTES",
    "SHORTSTR_MAX",
    "encode_acks",
    "encode_properties",
    "encode_publish",
]

SHORTSTR_MAX = 255
"""Bytes of UTF-8 in an AMQP short string: property values and header names."""
FRAME_MAX = 131_072
"""RabbitMQ's default ``frame_max``, which pika and aio-pika both ask for."""
MAX_PROPERTIES_BYTES = FRAME_MAX - 8 - 12
"""What one content-header frame holds after its frame header and end (8 bytes) and the
class, weight and body size (12): properties never span frames."""

_INT32 = 2**31
_INT64 = 2**63
_TYPES = "str, bytes, bool, int, float, Decimal, datetime, None, or lists and dicts of these"


def _fail(field: str, reason: str) -> InvalidMessageError:
    return InvalidMessageError(field, reason)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _utf8(field: str, value: object, what: str = "a str") -> bytes:
    if not isinstance(value, str):
        raise _fail(field, f"must be {what}, got {type(value).__name__} {_shown(value)}")
    try:
        return value.encode()
    except UnicodeEncodeError as exc:
        raise _fail(field, f"is not valid text ({exc.reason} at index {exc.start})") from None


def _shortstr(field: str, value: object) -> bytes:
    if type(value) is str and value.isascii() and len(value) <= SHORTSTR_MAX:
        return bytes((len(value),)) + value.encode()  # the usual case, checked cheaply
    data = _utf8(field, value)
    if len(data) > SHORTSTR_MAX:
        raise _fail(
            field,
            f"is {len(data)} bytes of UTF-8, over AMQP's limit of {SHORTSTR_MAX} for a "
            "short string",
        )
    return bytes((len(data),)) + data


def _octet(field: str, value: object) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise _fail(field, f"must be an int from 0 to 255, got {_shown(value)}")
    return bytes((value,))


def _seconds(field: str, value: object) -> int:
    """AMQP timestamps: whole seconds since 1970 (UTC for a naive datetime, as both
    libraries read it), so a fraction of a second is dropped."""
    if isinstance(value, datetime):
        seconds = clock.seconds_of_datetime(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    else:
        raise _fail(field, f"must be a datetime, got {type(value).__name__}")
    if not 0 <= seconds < 2**64:
        raise _fail(field, f"is {_shown(value)}: AMQP timestamps start at 1970-01-01 UTC")
    return seconds


def _decimal(field: str, value: Decimal) -> bytes:
    """AMQP decimals: a scale (0 to 255 digits after the point) and a signed 32-bit int."""
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise _fail(field, f"is {value}: AMQP decimals are finite")
    mantissa = int("".join(map(str, digits)) or "0")
    if exponent > 0:
        mantissa, exponent = mantissa * 10**exponent, 0
    while exponent < 0 and mantissa and mantissa % 10 == 0:  # 1.50 as 1.5: the same value
        mantissa, exponent = mantissa // 10, exponent + 1
    mantissa = -mantissa if sign else mantissa
    if -exponent > 255 or not -_INT32 <= mantissa < _INT32:
        raise _fail(
            field,
            f"is {_shown(value)}: an AMQP decimal holds a signed 32-bit int of digits with at "
            "most 255 of them after the point; send a str instead",
        )
    return struct.pack(">cBi", b"D", -exponent, mantissa)


def _int(field: str, value: int) -> bytes:
    if -_INT32 <= value < _INT32:
        return struct.pack(">ci", b"I", value)
    if -_INT64 <= value < _INT64:
        return struct.pack(">cq", b"l", value)
    raise _fail(
        field,
        f"is an int of {value.bit_length()} bits: AMQP carries signed 64-bit ints "
        "(-2**63 to 2**63 - 1); send a str instead",
    )


def _bytes_value(value: bytes | bytearray | memoryview) -> bytes:
    data = bytes(value)
    return struct.pack(">cI", b"x", len(data)) + data


def _value(field: str, value: object, path: tuple[int, ...]) -> bytes:
    """One field value with its type octet, the types RabbitMQ reads."""
    if isinstance(value, str):
        data = _utf8(field, value)
        return struct.pack(">cI", b"S", len(data)) + data
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int):
        return _int(field, value)
    if isinstance(value, float):
        if not math.isfinite(value):  # pika's decoder raises on one: a consumer would break
            raise _fail(field, f"is {value}: send a finite float, or a str")
        return struct.pack(">cd", b"d", value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _bytes_value(value)
    if value is None:
        return b"V"
    if isinstance(value, Decimal):
        return _decimal(field, value)
    if isinstance(value, datetime):
        return struct.pack(">cQ", b"T", _seconds(field, value))
    if isinstance(value, (dict, list)):
        if id(value) in path:
            raise _fail(field, "contains itself")
        inner = (*path, id(value))
        if isinstance(value, dict):
            return b"F" + _table(field, value, inner)
        items = b"".join(_value(f"{field}[{i}]", v, inner) for i, v in enumerate(value))
        return struct.pack(">cI", b"A", len(items)) + items
    raise _fail(
        field,
        f"has type {type(value).__name__}, which AMQP field tables cannot carry: use {_TYPES}",
    )


def _table(field: str, table: Mapping[Any, Any], path: tuple[int, ...] = ()) -> bytes:
    """A field table: names are short strings, checked before anything else is read.

    ASCII names with ASCII str or 64-bit int values take a fast path (a publish's own headers
    are these); anything else, and every error, goes through :func:`_entry`.
    """
    entries = []
    for name, value in table.items():
        kind = type(value)
        if type(name) is str and name.isascii() and len(name) <= SHORTSTR_MAX:
            if kind is str and value.isascii():
                entries.append(
                    bytes((len(name),)) + name.encode() + _S_LEN(b"S", len(value)) + value.encode()
                )
                continue
            if kind is int and -_INT64 <= value < _INT64:
                number = _I(b"I", value) if -_INT32 <= value < _INT32 else _L(b"l", value)
                entries.append(bytes((len(name),)) + name.encode() + number)
                continue
        entries.append(_entry(field, name, value, path))
    data = b"".join(entries)
    return struct.pack(">I", len(data)) + data


_S_LEN = struct.Struct(">cI").pack
_I = struct.Struct(">ci").pack
_L = struct.Struct(">cq").pack


def _entry(field: str, name: object, value: object, path: tuple[int, ...]) -> bytes:
    """One table entry, every check made, the field named in every error."""
    if not isinstance(name, str):
        raise _fail(field, f"has a name that is not a str: {type(name).__name__} {_shown(name)}")
    return _shortstr(f"{field} name {_shown(name)}", name) + _value(
        f"{field}[{_shown(name)}]", value, path
    )


def _headers(field: str, value: object) -> bytes:
    if not isinstance(value, Mapping):
        raise _fail(field, f"must be a dict of str to values, got {type(value).__name__}")
    return _table(field, value)


_Encoder = Callable[[str, Any], bytes]
_PROPERTIES: tuple[tuple[str, int, _Encoder], ...] = (
    ("content_type", 1 << 15, _shortstr),
    ("content_encoding", 1 << 14, _shortstr),
    ("headers", 1 << 13, _headers),
    ("delivery_mode", 1 << 12, _octet),
    ("priority", 1 << 11, _octet),
    ("correlation_id", 1 << 10, _shortstr),
    ("reply_to", 1 << 9, _shortstr),
    ("expiration", 1 << 8, _shortstr),
    ("message_id", 1 << 7, _shortstr),
    ("timestamp", 1 << 6, lambda f, v: struct.pack(">Q", _seconds(f, v))),
    ("type", 1 << 5, _shortstr),
    ("user_id", 1 << 4, _shortstr),
    ("app_id", 1 << 3, _shortstr),
    ("cluster_id", 1 << 2, _shortstr),  # deprecated by AMQP 0-9-1; the x-delay bridge carries it
)
"""Basic's properties in AMQP 0-9-1 order, with their flag bits."""
_NAMES = frozenset(name for name, _bit, _encode in _PROPERTIES)


def encode_properties(properties: Mapping[str, Any]) -> bytes:
    """The property flags and list of a content header; None means absent.

    Raises InvalidMessageError naming the property (or header) and the limit it breaks,
    including when the whole does not fit in one frame of :data:`FRAME_MAX` bytes.
    """
    unknown = properties.keys() - _NAMES
    if unknown:
        raise TypeError(f"no such AMQP property: {', '.join(sorted(unknown))}")
    flags = 0
    parts = []
    for name, bit, encode in _PROPERTIES:
        value = properties.get(name)
        if value is not None:
            flags |= bit
            parts.append(encode(name, value))
    data = struct.pack(">H", flags) + b"".join(parts)
    if len(data) > MAX_PROPERTIES_BYTES:
        raise _fail(
            "headers",
            f"and properties encode to {len(data):,} bytes, over the {MAX_PROPERTIES_BYTES:,} "
            f"one AMQP frame carries (frame_max {FRAME_MAX:,}, RabbitMQ's default); "
            "send large values in the body",
        )
    return data


_FRAME_END = b"\xce"
_METHOD_FRAME = struct.Struct(">BHIHHH").pack
"""A method frame's header, then basic.publish and its ticket (0)."""
_HEADER_FRAME = struct.Struct(">BHIHHQ").pack
"""A content header frame's header, then class basic, weight 0 and the body size."""
_BODY_FRAME = struct.Struct(">BHI").pack
_MANDATORY = (b"\x00\xce", b"\x01\xce")
"""The method's last octet (mandatory or not) and the frame's end."""
_EXCHANGES: dict[str, bytes] = {}
"""Exchange names as short strings: a publisher sends to a few tiers' exchanges."""
_EXCHANGES_KEPT = 10_000


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + _FRAME_END


def encode_publish(
    channel: int,
    exchange: str,
    routing_key: str,
    properties: bytes,
    body: bytes,
    *,
    mandatory: bool = True,
    frame_max: int = FRAME_MAX,
) -> bytes:
    """One basic.publish as bytes: its method, content header and body frames.

    Why: a client library writes each frame on its own and pika makes a system call per
    frame; joining a window of messages into one write cost the sync publisher less than
    half of its CPU per message (bench/README.md). ``properties`` is what
    :func:`encode_properties` returned; the body is split at ``frame_max``.
    """
    name = _EXCHANGES.get(exchange)
    if name is None:
        name = _shortstr("exchange", exchange)
        if len(_EXCHANGES) < _EXCHANGES_KEPT:
            _EXCHANGES[exchange] = name
    key = _shortstr("routing key", routing_key)
    size = len(body)
    parts = [
        _METHOD_FRAME(1, channel, 7 + len(name) + len(key), 60, 40, 0),
        name,
        key,
        _MANDATORY[mandatory],
        _HEADER_FRAME(2, channel, 12 + len(properties), 60, 0, size),
        properties,
        _FRAME_END,
    ]
    step = frame_max - 8  # a frame's header and end
    if size <= step:  # the usual message: one body frame, or none for an empty body
        if size:
            parts += (_BODY_FRAME(3, channel, size), body, _FRAME_END)
        return b"".join(parts)
    parts += (_frame(3, channel, body[i : i + step]) for i in range(0, size, step))
    return b"".join(parts)


_ACK = struct.Struct(">BHIHHQB")
"""A basic.ack method frame up to its end octet: type 1, channel, size 13, class 60,
method 80, delivery tag, the ``multiple`` bit."""


def encode_acks(
    channel: int, multiple: int | None, covered: int, singles: tuple[int, ...]
) -> bytes:
    """A channel's acks as bytes: ``multiple`` (a tag, or None) acked with the ``multiple``
    bit when it covers more than one delivery, then each of ``singles`` alone (the frames
    :class:`rmqdelay.core.handling.acks.AckPlan` asks for, in its order)."""
    parts = []
    if multiple is not None:
        parts.append(_ACK.pack(1, channel, 13, 60, 80, multiple, covered > 1) + _FRAME_END)
    parts += (_ACK.pack(1, channel, 13, 60, 80, tag, 0) + _FRAME_END for tag in singles)
    return b"".join(parts)
