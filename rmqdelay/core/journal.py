"""The schedule journal, as data: what is recorded, and what a reader makes of it.

A message waiting in a fixed-TTL tier can be neither found nor removed, so every publish
also appends a small record to a RabbitMQ stream, ``{prefix}.schedule``, and a cancel
appends a tombstone there. Readers fold the records: ``scheduled list`` keeps what is still
ahead and not cancelled; a worker keeps the cancelled ids until their due time has passed,
and acks a cancelled message without calling its handler.

A reader cannot ask a stream where its end is, so it appends a ``marker`` record of its
own and reads until that marker comes back: everything confirmed before it has been seen.

Pure: encoding, decoding and folding only. :mod:`rmqdelay.amqp.journal` does the I/O.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Literal

from .layout import Layout

__all__ = [
    "CANCEL_MARGIN_MS",
    "RECORDS_PER_WRITE",
    "CancelAnswer",
    "CancelResult",
    "JournalRecord",
    "RecordKind",
    "ScheduleView",
    "Tombstones",
    "decode_record",
    "decode_records",
    "encode_record",
    "encode_records",
    "journal_name",
    "max_age",
    "plan_cancels",
]

RecordKind = Literal["scheduled", "cancelled", "marker"]
CancelAnswer = Literal["cancelled", "unknown", "too late"]
_VERSION = 1
RECORDS_PER_WRITE = 500
"""Records per stream message: a batch's (or a cancel's) records cost a few writes."""
CANCEL_MARGIN_MS = 60_000
"""How long a worker keeps a tombstone after the message's due time, for lateness."""


def journal_name(layout: Layout) -> str:
    """The stream, and the fanout exchange of the same name that leads to it."""
    return f"{layout.prefix}.schedule"


def max_age(layout: Layout) -> str:
    """The stream's ``x-max-age``: just over the longest delay, in whole hours.

    A record is useless once its message is due; one hour over ``max_delay`` leaves room
    for retries of a message published at the limit and for clock skew.
    """
    hours = math.ceil(layout.max_delay_ms / 3_600_000) + 1
    return f"{hours}h"


@dataclass(frozen=True)
class JournalRecord:
    """One line of the journal. ``due_at_ms`` is 0 for a marker."""

    kind: RecordKind
    message_id: str
    destination: str = ""
    due_at_ms: int = 0
    attempt: int = 1
    body_size: int = 0
    headers: Mapping[str, Any] = field(default_factory=dict)
    recorded_at_ms: int = 0
    body: bytes | None = None


def _plain(value: Any) -> Any:
    """Header values as JSON can hold them; the record is for people and folds."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def encode_record(record: JournalRecord) -> bytes:
    """A compact JSON line; short keys keep a record near 150 bytes without headers."""
    data: dict[str, Any] = {"v": _VERSION, "k": record.kind, "id": record.message_id}
    if record.kind != "marker":
        data |= {"d": record.destination, "due": record.due_at_ms, "a": record.attempt}
        data["n"] = record.body_size
        if record.headers:
            data["h"] = _plain(record.headers)
    data["t"] = record.recorded_at_ms
    if record.body is not None:
        data["b"] = base64.b64encode(record.body).decode()
    return json.dumps(data, separators=(",", ":")).encode()


def encode_scheduled(
    message_id: str,
    destination: str,
    due_at_ms: int,
    attempt: int,
    body_size: int,
    recorded_at_ms: int,
) -> bytes:
    """:func:`encode_record` of a ``scheduled`` record with no headers and no body, the
    usual one, without building the record first: the journal is written on every
    publish. The same bytes (``tests/unit/test_journal.py`` checks it)."""
    return (
        f'{{"v":{_VERSION},"k":"scheduled","id":{json.dumps(message_id)},'
        f'"d":{json.dumps(destination)},"due":{due_at_ms},"a":{attempt},"n":{body_size},'
        f'"t":{recorded_at_ms}}}'
    ).encode()


def decode_record(raw: bytes) -> JournalRecord | None:
    """The record, or None for anything this version cannot read (skipped, not fatal)."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("v") != _VERSION:
            return None
        kind = data["k"]
        if kind not in ("scheduled", "cancelled", "marker"):
            return None
        body = data.get("b")
        return JournalRecord(
            kind=kind,
            message_id=str(data["id"]),
            destination=str(data.get("d", "")),
            due_at_ms=int(data.get("due", 0)),
            attempt=int(data.get("a", 1)),
            body_size=int(data.get("n", 0)),
            headers=dict(data.get("h", {})),
            recorded_at_ms=int(data.get("t", 0)),
            body=base64.b64decode(body) if isinstance(body, str) else None,
        )
    except (ValueError, KeyError, TypeError):
        return None


def encode_records(records: Iterable[JournalRecord]) -> bytes:
    """Several records in one stream message, one JSON line each: a batch costs one write."""
    return b"\n".join(encode_record(r) for r in records)


def decode_records(raw: bytes) -> list[JournalRecord]:
    """Every readable record of a stream message (JSON never holds a raw newline)."""
    return [r for line in raw.split(b"\n") if (r := decode_record(line)) is not None]


@dataclass
class ScheduleView:
    """What the journal says is scheduled: the latest record per id, and the tombstones.

    A retry or replay of an id records it again with its new due time, so the latest
    ``scheduled`` record wins. A tombstone cancels what was recorded before it.
    """

    latest: dict[str, JournalRecord] = field(default_factory=dict)
    cancelled: dict[str, JournalRecord] = field(default_factory=dict)

    def add(self, record: JournalRecord) -> None:
        if record.kind == "scheduled":
            self.latest[record.message_id] = record
            self.cancelled.pop(record.message_id, None)
        elif record.kind == "cancelled":
            self.cancelled[record.message_id] = record

    def extend(self, records: Iterable[JournalRecord]) -> ScheduleView:
        for record in records:
            self.add(record)
        return self

    def pending(
        self,
        now_ms: int,
        *,
        destination: str | None = None,
        due_before_ms: int | None = None,
        limit: int | None = None,
    ) -> list[JournalRecord]:
        """Records still ahead and not cancelled, soonest first."""
        found = [
            r
            for r in self.latest.values()
            if r.due_at_ms > now_ms
            and r.message_id not in self.cancelled
            and (destination is None or r.destination == destination)
            and (due_before_ms is None or r.due_at_ms < due_before_ms)
        ]
        found.sort(key=lambda r: (r.due_at_ms, r.message_id))
        return found if limit is None else found[:limit]

    def answer(self, message_id: str, now_ms: int) -> tuple[CancelAnswer, JournalRecord | None]:
        """What a cancel of ``message_id`` finds: cancelled, unknown, or too late."""
        record = self.latest.get(message_id)
        if record is None:
            return "unknown", None
        if record.due_at_ms <= now_ms:
            return "too late", record
        return "cancelled", record


@dataclass(frozen=True)
class CancelResult:
    """What a cancel found for one message id."""

    message_id: str
    outcome: CancelAnswer
    due_at_ms: int | None = None
    destination: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "outcome": self.outcome,
            "due_at_ms": self.due_at_ms,
            "destination": self.destination,
        }


def plan_cancels(
    view: ScheduleView, message_ids: Iterable[str], now_ms: int
) -> tuple[list[CancelResult], list[JournalRecord]]:
    """The answer for each id, and the tombstones to append for those still ahead."""
    results: list[CancelResult] = []
    tombstones: list[JournalRecord] = []
    for message_id in dict.fromkeys(message_ids):
        answer, record = view.answer(message_id, now_ms)
        if record is None:
            results.append(CancelResult(message_id, answer))
            continue
        results.append(CancelResult(message_id, answer, record.due_at_ms, record.destination))
        if answer == "cancelled":
            tombstones.append(
                JournalRecord(
                    "cancelled",
                    message_id,
                    record.destination,
                    record.due_at_ms,
                    record.attempt,
                    recorded_at_ms=now_ms,
                )
            )
    return results, tombstones


@dataclass
class Tombstones:
    """The cancelled ids a worker honours, each until its due time plus a margin."""

    margin_ms: int = CANCEL_MARGIN_MS
    until_ms: dict[str, int] = field(default_factory=dict)

    def add(self, record: JournalRecord) -> None:
        if record.kind == "cancelled":
            keep = record.due_at_ms + self.margin_ms
            self.until_ms[record.message_id] = max(keep, self.until_ms.get(record.message_id, 0))

    def is_cancelled(self, message_id: str, now_ms: int) -> bool:
        until = self.until_ms.get(message_id)
        return until is not None and now_ms <= until

    def expire(self, now_ms: int) -> int:
        """Forget tombstones past their time; return how many were dropped."""
        old = [k for k, until in self.until_ms.items() if until < now_ms]
        for key in old:
            del self.until_ms[key]
        return len(old)

    def __len__(self) -> int:
        return len(self.until_ms)
