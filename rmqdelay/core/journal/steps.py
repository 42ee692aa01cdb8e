"""The journal's two steps: what a journal flow asks of the adapter running it.

:mod:`.flows` and :mod:`.checkpoint_flows` write the reads and writes of the journal and
of its checkpoints once, as generators yielding these; an adapter answers them: the pika
and aio-pika publishers and readers (:mod:`rmqdelay.amqp.journal`), the worker's tail and
the in-memory publisher.

- :class:`Append`: publish these stream messages and wait for every confirm. Answer
  True, or False when the stream is not there.
- :class:`Read`: consume a stream from an offset, a time, its first or its last
  message, handing each message to ``take`` in order until it returns True. Answer how it
  ended (:data:`ReadEnd`). With ``keep``, the adapter keeps the consumer open for the next
  read of that name, which goes on where this one stopped: a keyed publish reads only
  what is new since the last one. A one-off read is a follow that stops.

They join the publish steps in :data:`rmqdelay.core.steps.Step`, so a publisher's ``_run``
carries out a journal flow as it does a publish.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..clock import datetime_of_ms

__all__ = [
    "JOURNAL_TYPE",
    "Append",
    "JournalStep",
    "JournalWrite",
    "Read",
    "ReadEnd",
    "Start",
    "StreamMessage",
    "journal_properties",
    "stream_offset",
]

JOURNAL_TYPE = "rmqdelay-journal"
"""The AMQP ``type`` of every journal write."""


def journal_properties(
    message_id: str, kind: str = JOURNAL_TYPE, headers: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The AMQP properties of a stream write: persistent, typed, named by its first record
    (a checkpoint's parts carry their mark in ``headers``)."""
    properties: dict[str, Any] = {
        "message_id": message_id,
        "type": kind,
        "content_type": "application/json",
        "delivery_mode": 2,
    }
    if headers:
        properties["headers"] = dict(headers)
    return properties


@dataclass(frozen=True)
class JournalWrite:
    """One stream message: a few hundred records (or a checkpoint's part), one JSON line
    each."""

    body: bytes
    message_id: str
    kind: str = JOURNAL_TYPE
    headers: Mapping[str, Any] = field(default_factory=dict)

    @property
    def properties(self) -> dict[str, Any]:
        return journal_properties(self.message_id, self.kind, self.headers)


@dataclass(frozen=True)
class Append:
    """A step: publish ``writes`` to the exchange ``stream`` (a fanout of the stream's name:
    mandatory, on a confirm channel) and wait for every confirm.

    Answer True once all are confirmed; False when the stream is not there (a return, a
    nack, or no such exchange). A lost connection raises, as a publish's does.
    """

    stream: str
    writes: list[JournalWrite]


ReadEnd = Literal["done", "missing", "silent"]
"""How a :class:`Read` ended: ``take`` said stop, the stream does not exist, or no
message came for ``timeout`` seconds."""

Start = int | datetime | Literal["first", "last"]
"""Where a consumer begins (``x-stream-offset``): an offset, a time (whole seconds: the
chunk holding that time, so earlier messages may come first), or the stream's first
message or its last chunk."""


@dataclass(frozen=True)
class StreamMessage:
    """One message of a stream, as a consumer gets it."""

    offset: int
    """Its stream offset (the broker's ``x-stream-offset`` header; -1 when it sent none)."""
    body: bytes
    headers: Mapping[str, Any]


@dataclass(frozen=True)
class Read:
    """A step: consume the stream ``stream`` from ``start`` (manual acks, a prefetch: a
    stream requires both), calling ``take`` with each message in order, and stop once
    ``take`` returns True. Answer a :data:`ReadEnd`.

    Without ``keep`` the consumer is the step's own, closed before answering. With it,
    the adapter keeps it open under that name: the next read of the name gets what came
    after this one stopped, ``start`` used only when it must open a consumer again (the
    caller then passes the offset it read to; ``take`` skips what it was given before,
    so starting early is harmless). ``reached`` is True when what the step waits for was
    read already (by another read of the same name, running first): the adapter answers
    ``done`` without waiting.
    """

    stream: str
    start: Start
    take: Callable[[StreamMessage], bool]
    timeout: float
    keep: str | None = None
    reached: Callable[[], bool] = lambda: False
    prefetch: int | None = None
    """Messages the consumer may hold unacked (None: the adapter's own, sized for the
    journal's writes; a checkpoint's parts are larger, and read a few at a time)."""


def stream_offset(since_ms: int) -> datetime:
    """The ``x-stream-offset`` that reads from ``since_ms``: AMQP timestamps are whole
    seconds, so one second early rather than miss a record."""
    return datetime_of_ms(max(0, since_ms // 1000 - 1) * 1000)


JournalStep = Append | Read
"""What a journal flow asks of its adapter."""
