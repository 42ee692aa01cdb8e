"""The schedule journal's two steps: what a journal flow asks of the adapter running it.

:mod:`.journal_flows` writes the reads and writes of the journal once, as generators
yielding these; an adapter answers them: the pika and aio-pika publishers, the worker's
tail (:mod:`rmqdelay.amqp.journal`) and the in-memory publisher.

- :class:`Append`: publish these stream messages and wait for every confirm. Answer
  True, or False when the journal is not there.
- :class:`Read`: consume the stream from a time on, handing each message's body to
  ``take`` in order, until it returns True. Answer how it ended (:data:`ReadEnd`).
- :class:`Follow`: as :class:`Read`, on a consumer the adapter keeps open between
  steps, so a keyed publish reads only what is new since the last one.

They join the publish steps in :data:`rmqdelay.core.outgoing.Step`, so a publisher's
``_run`` carries out a journal flow as it does a publish.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ..clock import datetime_of_ms

__all__ = [
    "JOURNAL_TYPE",
    "Append",
    "Follow",
    "JournalStep",
    "JournalWrite",
    "Read",
    "ReadEnd",
    "journal_properties",
    "stream_offset",
]

JOURNAL_TYPE = "rmqdelay-journal"
"""The AMQP ``type`` of every journal write."""


def journal_properties(message_id: str) -> dict[str, Any]:
    """The AMQP properties of a journal write: persistent, typed, named by its first record."""
    return {
        "message_id": message_id,
        "type": JOURNAL_TYPE,
        "content_type": "application/json",
        "delivery_mode": 2,
    }


@dataclass(frozen=True)
class JournalWrite:
    """One stream message: a few hundred records, one JSON line each."""

    body: bytes
    message_id: str

    @property
    def properties(self) -> dict[str, Any]:
        return journal_properties(self.message_id)


@dataclass(frozen=True)
class Append:
    """A step: publish ``writes`` to the journal's exchange ``stream`` (mandatory, on a
    confirm channel) and wait for every confirm.

    Answer True once all are confirmed; False when the journal is not there (a return, a
    nack, or no such exchange). A lost connection raises, as a publish's does.
    """

    stream: str
    writes: list[JournalWrite]


ReadEnd = Literal["done", "missing", "silent"]
"""How a :class:`Read` ended: the reader reached its marker, the stream does not exist,
or no message came for ``timeout`` seconds."""


@dataclass(frozen=True)
class Read:
    """A step: consume the stream ``stream`` from :attr:`offset` on (manual acks, a
    prefetch: a stream requires both), calling ``take`` with each message's body in
    order, and stop once ``take`` returns True.

    Answer a :data:`ReadEnd`. The consumer is the step's own: closed before answering.
    """

    stream: str
    since_ms: int
    take: Callable[[bytes], bool]
    timeout: float

    @property
    def offset(self) -> datetime:
        return stream_offset(self.since_ms)


def stream_offset(since_ms: int) -> datetime:
    """The ``x-stream-offset`` that reads from ``since_ms``: AMQP timestamps are whole
    seconds, so one second early rather than miss a record."""
    return datetime_of_ms(max(0, since_ms // 1000 - 1) * 1000)


@dataclass(frozen=True)
class Follow:
    """A step: hand ``take`` each message of the stream ``stream`` after the last one it
    was given, with its stream offset, until it returns True; answer a :data:`ReadEnd`.

    The adapter keeps the consumer open for the next Follow (a publisher's keyed
    publishes each read what is new, not the whole journal). A consumer it has to open
    starts at offset ``next_offset`` when that is known, else at the time ``since_ms``;
    ``take`` skips what it was given before, so starting early is harmless. Messages
    that arrived after ``take`` said stop are given to the next Follow's ``take``.
    """

    stream: str
    since_ms: int
    next_offset: int | None
    take: Callable[[int, bytes], bool]
    timeout: float
    reached: Callable[[], bool] = lambda: False
    """True when what the step waits for was read already (by another Follow of the
    same publisher, running first): the adapter answers ``done`` without waiting."""
    reader: str = "keys"
    """Which of the publisher's consumers: each fold (keys, :mod:`.view_follow`'s
    ``view``) reads on from its own offset, so each has its own."""

    @property
    def offset(self) -> datetime | int:
        """The ``x-stream-offset`` of a consumer opened for this step."""
        return self.next_offset if self.next_offset is not None else stream_offset(self.since_ms)


JournalStep = Append | Read
"""What a journal flow asks; :class:`Follow` is a publisher's own (see :mod:`.key_flows`)."""
