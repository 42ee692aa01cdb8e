"""Validating a publish: every check, the due time and the encoded properties.

:meth:`Preparing.prepare` is the one validation pass of both publishers, retries and
replays; what it returns (:class:`~.outgoing.Prepared`) goes out unchanged, routed as
late as possible by :mod:`.sending`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

from typing_extensions import Unpack

from ...errors import DelayError, InvalidMessageError
from .. import clock, failures, tracing
from ..clock import ms_of_us
from ..durations import DurationLike, parse_duration_us
from ..frozen import make
from ..layout import Layout
from ..messages import ATTEMPT, CARRIED, KEY, MessageProperties, clean_headers, encode_body
from ..plan import check_max_delay
from ..routing import validate_destination
from .outgoing import ConflictChoice, Draft, Prepared
from .templates import REMEMBERED, PropertyTemplates, new_message_id, plain_carried

__all__ = ["KEY_MAX_CHARS", "Preparing", "check_key"]

_CARRIED = frozenset(CARRIED)
KEY_MAX_CHARS = 512
"""A key is a header value and part of every record of its message: kept short."""
_CHOICES = ("ignore", "replace")
_UNKEYED: dict[str, Any] = {
    "journal_records": 0,
    "key": None,
    "on_conflict": None,
    "marker": None,
    "own_records": (),
}
"""The fields of a message :meth:`Preparing.prepare` makes that its short paths
leave at their defaults (a keyed one then sets its key)."""


def check_key(layout: Layout, key: object, on_conflict: object) -> None:
    """Raise unless ``key`` and ``on_conflict`` make a keyed publish this layout can do."""
    if key is None:
        raise InvalidMessageError(
            "on_conflict",
            f"was given ({on_conflict!r}) without key=: it says what a keyed publish does "
            "while its key is pending; give key= too, or leave on_conflict out",
        )
    if not isinstance(key, str) or not key or len(key) > KEY_MAX_CHARS:
        raise InvalidMessageError(
            "key", f"must be a non-empty str of at most {KEY_MAX_CHARS} characters, got {key!r}"
        )
    if on_conflict is None:
        raise InvalidMessageError(
            "on_conflict",
            f"is required with key={key!r}: say what this publish does while a message with "
            'that key is pending: on_conflict="ignore" (keep the pending one, drop this) or '
            'on_conflict="replace" (drop the pending one, schedule this)',
        )
    if on_conflict not in _CHOICES:
        raise InvalidMessageError(
            "on_conflict", f'must be "ignore" or "replace", got {on_conflict!r}'
        )
    if not layout.journal:
        raise failures.journal_off(f"publish with key={key!r}")


class Preparing:
    """The checks of a publisher, and its clock (the base of
    :class:`~.publisher.PublisherCore`)."""

    layout: Layout
    offset_us = 0
    """How far this publisher's clock is ahead of the wall clock: an in-memory
    publisher's ``advance()`` moves it on."""
    _valid_destinations: set[str]
    _properties: PropertyTemplates

    def now_us(self) -> int:
        """The publisher's clock in µs: what due times and routes start from."""
        return clock.now_us() + self.offset_us

    def now_ms(self) -> int:
        """The publisher's clock in ms: what records and the journal's flows read."""
        return clock.now_ms() + self.offset_us // 1000

    def prepare(
        self,
        destination: str,
        body: object,
        *,
        delay: DurationLike | None = None,
        at: datetime | None = None,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        key: str | None = None,
        on_conflict: ConflictChoice | None = None,
        now: int | None = None,
        **properties: Unpack[MessageProperties],
    ) -> Prepared:
        """Validate a publish, fix its due time and encode it; raise before anything is sent.

        The one validation pass of both publishers, retries and replays: what AMQP
        cannot carry raises :class:`InvalidMessageError` (see :mod:`rmqdelay.core.wire`).
        A ``rmqdelay-key`` header without ``key=`` is a keyed message sent again (a
        worker's retry or forward): recorded with its key, never an answer of its own.
        """
        if key is not None or on_conflict is not None:
            check_key(self.layout, key, on_conflict)
        traced = tracing.active()
        if not properties and headers is None and message_id is None and not traced:
            if key is None:
                return self._from_draft(self._draft(destination, body, delay, at, now))
            return self._prepare_keyed(destination, body, delay, at, now, key, on_conflict)
        if properties and not properties.keys() <= _CARRIED:
            unknown = min(properties.keys() - _CARRIED)
            raise TypeError(f"publish() got an unexpected keyword argument {unknown!r}")
        if traced and now is None:
            now = self.now_us()  # the span says the delay asked: due - now, exactly
        due = self._due(destination, delay, at, now)
        payload, encoded_type = encode_body(body)
        if headers is not None and not isinstance(headers, Mapping):
            raise InvalidMessageError(
                "headers", f"must be a dict of str to values, got {type(headers).__name__}"
            )
        if traced:
            assert now is not None
            message_id = message_id or new_message_id()
            headers = tracing.created(headers, destination, message_id, due, now)
        out_headers = clean_headers(headers)
        out_headers.setdefault(ATTEMPT, 1)
        if key is not None:
            given = out_headers.get(KEY, key)
            if given != key:
                raise InvalidMessageError(
                    f"headers[{KEY!r}]", f"is {given!r} but key={key!r}: give the key once"
                )
            out_headers[KEY] = key
        elif isinstance(out_headers.get(KEY), (str, bytes)):
            carried_key = out_headers[KEY]
            key = carried_key.decode() if isinstance(carried_key, bytes) else carried_key
            out_headers[KEY] = key
        if message_id is None:
            message_id = new_message_id()
        elif not isinstance(message_id, str) or not message_id:
            raise InvalidMessageError("message_id", f"must be a non-empty str, got {message_id!r}")
        carried = cast(MessageProperties, {name: properties.get(name) for name in CARRIED})
        carried["content_type"] = carried.get("content_type") or encoded_type
        return Prepared(
            destination=destination,
            body=payload,
            headers=out_headers,
            message_id=message_id,
            due_at_us=due,
            properties=carried,
            encoded_properties=self._properties.encode(
                message_id, out_headers, carried, ms_of_us(due), destination
            ),
            key=key,
            on_conflict=on_conflict,
        )

    def _draft(
        self,
        destination: str,
        body: object,
        delay: DurationLike | None,
        at: datetime | None,
        now: int | None = None,
    ) -> Draft:
        """The checks of :meth:`prepare` for the usual message (no headers, id or
        properties given): all that can fail. :meth:`_from_draft` makes the message, the
        same bytes as the general path in about half the time
        (``tests/unit/test_fast_paths.py`` compares the two)."""
        due = self._due(destination, delay, at, now)
        payload, content_type = encode_body(body)
        return Draft(destination, payload, content_type, due)

    def _from_draft(self, draft: Draft) -> Prepared:
        """The rest of :meth:`_draft`'s message: an id and the encoded properties."""
        destination, payload, content_type, due = draft
        message_id = new_message_id()
        return make(
            Prepared,
            {
                "destination": destination,
                "body": payload,
                "headers": {ATTEMPT: 1},
                "message_id": message_id,
                "due_at_us": due,
                "properties": plain_carried(content_type),
                "encoded_properties": self._properties.plain(
                    message_id, content_type, ms_of_us(due), destination
                ),
                **_UNKEYED,
            },
        )

    def _prepare_keyed(
        self,
        destination: str,
        body: object,
        delay: DurationLike | None,
        at: datetime | None,
        now: int | None,
        key: str,
        on_conflict: ConflictChoice | None,
    ) -> Prepared:
        """:meth:`prepare` of a keyed message with nothing else of its own: a keyed batch
        should cost little more than a plain one (``python -m bench.keyed``)."""
        due = self._due(destination, delay, at, now)
        payload, content_type = encode_body(body)
        message_id = new_message_id()
        headers = {ATTEMPT: 1, KEY: key}
        carried = plain_carried(content_type)
        return make(
            Prepared,
            {
                "destination": destination,
                "body": payload,
                "headers": headers,
                "message_id": message_id,
                "due_at_us": due,
                "properties": carried,
                "encoded_properties": self._properties.encode(
                    message_id, headers, carried, ms_of_us(due), destination
                ),
                **_UNKEYED,
                "key": key,
                "on_conflict": on_conflict,
            },
        )

    def _due(
        self,
        destination: str,
        delay: DurationLike | None,
        at: datetime | None,
        now: int | None,
    ) -> int:
        """Check the destination (each one once) and the delay; the due time in µs."""
        if destination not in self._valid_destinations:
            validate_destination(self.layout, destination)
            if len(self._valid_destinations) < REMEMBERED:
                self._valid_destinations.add(destination)
        start = self.now_us() if now is None else now
        return start + self._delay_us(delay, at, start)

    def _delay_us(self, delay: DurationLike | None, at: datetime | None, start: int) -> int:
        if delay is not None and at is not None:
            raise DelayError("give either delay= or at=, not both")
        if delay is None and at is None:
            raise DelayError("give delay= (0 sends now) or at= (a timezone-aware datetime)")
        if at is not None:
            if not isinstance(at, datetime):
                raise DelayError(f"at must be a datetime, got {type(at).__name__}")
            if at.tzinfo is None or at.utcoffset() is None:
                raise DelayError(
                    f"at={at.isoformat()} is naive: give a timezone, e.g. "
                    "datetime.now(timezone.utc) + timedelta(minutes=15)"
                )
            micros = clock.us_of_datetime(at)
            if not math.isfinite(micros):
                raise DelayError(f"at={at!r} is not a usable time")
            delay_us = max(0, math.ceil(micros) - start)
        else:
            assert delay is not None
            delay_us = parse_duration_us(delay)
            if delay_us < 0:
                raise DelayError(f"delay must not be negative, got {delay!r}")
        check_max_delay(self.layout, delay_us)
        return delay_us
