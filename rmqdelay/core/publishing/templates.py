"""Message ids and the encoded properties of the usual message, by template.

The publish path's hot spots: a message id and its property bytes are made for every
message, so both are cut down to joining cached bytes (bench/README.md has the figures).
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any, cast

from ..messages import (
    ATTEMPT,
    CARRIED,
    DESTINATION,
    DUE_AT,
    KEY,
    MessageProperties,
    amqp_properties,
)
from ..wire import SHORTSTR_MAX, encode_properties

__all__ = ["REMEMBERED", "PropertyTemplates", "new_message_id", "plain_carried"]

REMEMBERED = 10_000
"""How many destinations, and property templates, a publisher keeps: a bound for a
service that makes up names as it goes."""
_NO_PROPERTIES = dict.fromkeys(CARRIED)


def plain_carried(content_type: str) -> MessageProperties:
    """The carried properties of a message that gives none: only its content type."""
    return cast(MessageProperties, dict(_NO_PROPERTIES, content_type=content_type))


_IDS: deque[str] = deque()
"""Ids made ahead, a few at a time: ``popleft`` and ``extend`` are atomic, so two threads
never take the same one, and a forked child starts with none (below)."""
_IDS_MADE = 128
_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}
if hasattr(os, "register_at_fork"):  # a child must not send its parent's next ids
    os.register_at_fork(after_in_child=_IDS.clear)


def _made_ids(count: int) -> list[str]:
    h = os.urandom(16 * count).hex()
    return [
        f"{h[i : i + 8]}-{h[i + 8 : i + 12]}-4{h[i + 13 : i + 16]}-"
        f"{_VARIANT[h[i + 16]]}{h[i + 17 : i + 20]}-{h[i + 20 : i + 32]}"
        for i in range(0, 32 * count, 32)
    ]


def new_message_id() -> str:
    """A random (version 4) UUID as text, as ``str(uuid.uuid4())`` gives, from
    ``os.urandom`` as it does: on the publish path every microsecond shows, and one
    system call per message was a tenth of the async publisher's client CPU, so the
    random bytes are read for :data:`_IDS_MADE` ids at a time (bench/README.md)."""
    while True:
        try:
            return _IDS.popleft()
        except IndexError:
            _IDS.extend(_made_ids(_IDS_MADE))


_ID_MARK = "rmqdelay\x01template\x01message-id"
_DUE_MARK = 0x7E7E_7E7E_7E7E_7E7E
_DUE_BYTES = b"l" + _DUE_MARK.to_bytes(8, "big")
_LONG_DUE = 2**31  # due times from here on are encoded as 64-bit ints ("l")
_ID_LENGTH = bytes((36,))  # of the ids new_message_id() makes
_KEY_MARK = "\x01rmqdelay-key\x02"
_KEY_MARK_MIN = 6  # a shorter key is encoded in full: its mark could be anywhere


class PropertyTemplates:
    """Encoded properties of the usual message, by template: bytes for everything but
    the due time and the message id, kept per destination, attempt and carried
    properties.

    A message with headers of its own goes through :func:`encode_properties` as before;
    a template gives exactly the bytes that would (``tests/unit/test_fast_paths.py``
    checks it), at about a quarter of the cost.
    """

    def __init__(self) -> None:
        self._templates: dict[tuple[object, ...], tuple[bytes, bytes, bytes] | None] = {}
        self._plain: dict[tuple[str, str], tuple[bytes, bytes, bytes] | None] = {}
        self._keyed: dict[tuple[object, ...], tuple[bytes, bytes, bytes, bytes] | None] = {}

    def encode(
        self,
        message_id: str,
        headers: dict[str, Any],
        carried: MessageProperties,
        due_ms: int,
        destination: str,
    ) -> bytes:
        template = None
        attempt = headers.get(ATTEMPT)
        # what a template holds: an int attempt, a 64-bit due time, a short ASCII id, and
        # text (or no) carried properties
        fits = (
            type(attempt) is int
            and due_ms >= _LONG_DUE
            and message_id.isascii()
            and len(message_id) <= SHORTSTR_MAX
            and all(v is None or type(v) is str for v in carried.values())
        )
        if fits and len(headers) == 1:
            key = (destination, attempt, *carried.values())
            if key in self._templates:
                template = self._templates[key]
            else:
                template = self._template(destination, headers, carried)
                if len(self._templates) < REMEMBERED:
                    self._templates[key] = template
        elif fits and len(headers) == 2 and type(headers.get(KEY)) is str:
            return self._keyed_bytes(message_id, headers, carried, due_ms, destination)
        if template is None:
            sent = {**headers, DUE_AT: due_ms, DESTINATION: destination}
            return encode_properties(amqp_properties(message_id, sent, carried))
        head, middle, tail = template
        return b"".join(
            (
                head,
                due_ms.to_bytes(8, "big"),
                middle,
                bytes((len(message_id),)),
                message_id.encode(),
                tail,
            )
        )

    def _keyed_bytes(
        self,
        message_id: str,
        headers: dict[str, Any],
        carried: MessageProperties,
        due_ms: int,
        destination: str,
    ) -> bytes:
        """:meth:`encode` of a keyed message (the attempt and ``rmqdelay-key`` as its
        headers): a template per length of the key, with the key cut out too."""
        key = str(headers[KEY]).encode()
        index = (destination, headers[ATTEMPT], len(key), *carried.values())
        if index in self._keyed:
            template = self._keyed[index]
        else:
            template = self._keyed_template(destination, headers, carried, len(key))
            if len(self._keyed) < REMEMBERED:
                self._keyed[index] = template
        if template is None:
            sent = {**headers, DUE_AT: due_ms, DESTINATION: destination}
            return encode_properties(amqp_properties(message_id, sent, carried))
        head, after_key, after_due, tail = template
        return b"".join(
            (
                head,
                key,
                after_key,
                due_ms.to_bytes(8, "big"),
                after_due,
                bytes((len(message_id),)),
                message_id.encode(),
                tail,
            )
        )

    def plain(self, message_id: str, content_type: str, due_ms: int, destination: str) -> bytes:
        """:meth:`encode` of a message with no headers, id or properties of its own, and
        an id rmqdelay made (ASCII, 36 characters): fewer checks, same bytes."""
        key = (destination, content_type)
        if key in self._plain:
            template = self._plain[key]
        else:
            carried = plain_carried(content_type)
            template = self._template(destination, {ATTEMPT: 1}, carried)
            if len(self._plain) < REMEMBERED:
                self._plain[key] = template
        if template is None or due_ms < _LONG_DUE:
            carried = plain_carried(content_type)
            return self.encode(message_id, {ATTEMPT: 1}, carried, due_ms, destination)
        head, middle, tail = template
        return b"".join(
            (head, due_ms.to_bytes(8, "big"), middle, _ID_LENGTH, message_id.encode(), tail)
        )

    @staticmethod
    def _keyed_template(
        destination: str, headers: dict[str, Any], carried: MessageProperties, length: int
    ) -> tuple[bytes, bytes, bytes, bytes] | None:
        """The bytes around the key, the due time and the id; None for a key too short
        to mark unambiguously, or any doubt."""
        if length < _KEY_MARK_MIN:
            return None
        mark = (_KEY_MARK * (length // len(_KEY_MARK) + 1))[:length]
        sent = {**headers, KEY: mark, DUE_AT: _DUE_MARK, DESTINATION: destination}
        whole = encode_properties(amqp_properties(_ID_MARK, sent, carried))
        mark_bytes = mark.encode()
        marked_id = bytes((len(_ID_MARK),)) + _ID_MARK.encode()
        if (
            whole.count(mark_bytes) != 1
            or whole.count(_DUE_BYTES) != 1
            or whole.count(marked_id) != 1
        ):
            return None
        key_at = whole.index(mark_bytes)
        due_at = whole.index(_DUE_BYTES) + 1
        id_at = whole.index(marked_id)
        if not key_at + length <= due_at - 1 < id_at:
            return None
        return (
            whole[:key_at],
            whole[key_at + length : due_at],
            whole[due_at + 8 : id_at],
            whole[id_at + len(marked_id) :],
        )

    @staticmethod
    def _template(
        destination: str, headers: dict[str, Any], carried: MessageProperties
    ) -> tuple[bytes, bytes, bytes] | None:
        """The bytes around the due time and the id, or None where they cannot be cut
        out unambiguously (a value that happens to hold a marker)."""
        sent = {**headers, DUE_AT: _DUE_MARK, DESTINATION: destination}
        whole = encode_properties(amqp_properties(_ID_MARK, sent, carried))
        marked_id = bytes((len(_ID_MARK),)) + _ID_MARK.encode()
        if whole.count(_DUE_BYTES) != 1 or whole.count(marked_id) != 1:
            return None
        due_at = whole.index(_DUE_BYTES) + 1
        id_at = whole.index(marked_id)
        if id_at < due_at:
            return None
        return (
            whole[:due_at],
            whole[due_at + 8 : id_at],
            whole[id_at + len(marked_id) :],
        )
