"""The schedule journal, as data: what is recorded, and what a reader makes of it.

A message waiting in a fixed-TTL tier can be neither found nor removed, so every publish
also appends a small record to a RabbitMQ stream, ``{prefix}.schedule``, and a cancel
appends a tombstone there. Readers fold the records: ``scheduled list`` keeps what is still
ahead and not cancelled; a worker keeps the cancelled copies until their due time has
passed, and acks a cancelled copy without calling its handler.

Every copy counts. Publishing is at-least-once, so one message id can wait in the tiers
several times with different due times: a publish whose confirm failed and that was sent
again, a retry, a replay. A copy is its id and its due time (in its ``rmqdelay-due-at``
header and in its record), and the folds keep each copy: a record written late, after
the others (its publish had failed, a partition had held it), adds a copy and hides
none. A tombstone names the due times of the copies it cancels.

A reader cannot ask a stream where its end is, so it appends a ``marker`` record of its
own and reads until that marker comes back: everything confirmed before it has been seen.

Pure: encoding, decoding and folding only. :mod:`rmqdelay.amqp.journal` does the I/O.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from decimal import Decimal
from itertools import compress, islice
from operator import attrgetter, eq
from typing import TYPE_CHECKING, Any, Literal

from .layout import Layout
from .messages import CARRIED

if TYPE_CHECKING:
    from .keys import KeyBook, Move

__all__ = [
    "CANCEL_MARGIN_MS",
    "RECORDS_PER_WRITE",
    "CancelAnswer",
    "CancelResult",
    "JournalRecord",
    "OnConflict",
    "RecordKind",
    "ScheduleView",
    "Tombstones",
    "decode_lines",
    "decode_record",
    "decode_records",
    "encode_record",
    "encode_records",
    "journal_name",
    "max_age",
    "plain_record",
    "plan_cancels",
]

RecordKind = Literal[
    "scheduled", "cancelled", "marker", "claimed", "done", "rescheduled", "recurring"
]
OnConflict = Literal["ignore", "replace"]
"""What a keyed publish does while a message with its key is pending (:mod:`.keys`)."""
_KINDS = frozenset(
    ("scheduled", "cancelled", "marker", "claimed", "done", "rescheduled", "recurring")
)
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
    """One line of the journal. ``due_at_ms`` is 0 for a marker.

    A tombstone (``cancelled``) cancels the copies of its id due at ``cancels_due_ms``
    and at ``due_at_ms`` (the latest of them, so a reader that knows only ``due_at_ms``
    keeps the tombstone as long as it is needed); empty names ``due_at_ms`` alone, as
    tombstones written before copies were told apart do.
    """

    kind: RecordKind
    message_id: str
    destination: str = ""
    due_at_ms: int = 0
    attempt: int = 1
    body_size: int = 0
    headers: Mapping[str, Any] = field(default_factory=dict)
    recorded_at_ms: int = 0
    body: bytes | None = None
    properties: Mapping[str, Any] = field(default_factory=dict)
    """With the body (``journal_bodies``): the AMQP properties it was published with
    (content type and the others a message carries), so a copy made from the record is
    the same message."""
    cancels_due_ms: tuple[int, ...] = ()
    key: str | None = None
    """A keyed message's key (``scheduled``, ``claimed``, ``done``, ``rescheduled``)."""
    on_conflict: OnConflict | None = None
    """Written by a keyed message's first publish only; its retries and forwards leave it out."""
    worker: str = ""
    """``claimed``/``done``: the worker instance that wrote it."""
    claim_id: str = ""
    """``claimed``: this claim's own id, so its writer knows it when it comes back."""
    fresh_copy: bool = False
    """``rescheduled``: the rescheduler published a copy due at ``due_at_ms`` itself; when
    False, a worker receiving an older copy forwards it there."""
    data: Mapping[str, Any] = field(default_factory=dict)
    """``recurring``: the control record's operation and rule."""

    def named_due_times(self) -> tuple[int, ...]:
        """The due times of the copies a tombstone cancels, without repeats."""
        if not self.cancels_due_ms:
            return (self.due_at_ms,)
        return tuple(dict.fromkeys((*self.cancels_due_ms, self.due_at_ms)))


_new_object = object.__new__
_set_attribute = object.__setattr__
_DEFAULTS = vars(JournalRecord("scheduled", ""))
"""A record's fields, each at its default: :func:`plain_record`'s start."""


def plain_record(
    kind: RecordKind,
    message_id: str,
    destination: str,
    due_at_ms: int,
    attempt: int,
    body_size: int,
    recorded_at_ms: int,
) -> JournalRecord:
    """``JournalRecord(kind, message_id, ...)`` with no headers, body or key (the usual
    record), three times faster: a frozen dataclass sets each of its 17 fields through
    ``object.__setattr__``, which took a third of reading 100,000 records. The fields
    start as a constructed record's, so a field added later is there with its default;
    the mappings are new ones, as the constructor's (``tests/unit/test_journal.py``)."""
    fields = _DEFAULTS.copy()
    fields["kind"] = kind
    fields["message_id"] = message_id
    fields["destination"] = destination
    fields["due_at_ms"] = due_at_ms
    fields["attempt"] = attempt
    fields["body_size"] = body_size
    fields["recorded_at_ms"] = recorded_at_ms
    fields["headers"] = {}
    fields["properties"] = {}
    fields["data"] = {}
    record: JournalRecord = _new_object(JournalRecord)
    _set_attribute(record, "__dict__", fields)
    return record


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


def _properties(value: Any) -> dict[str, Any]:
    """A record's ``p``: the carried properties it names, of the types AMQP gives them."""
    if not isinstance(value, dict):
        return {}
    return {
        k: v
        for k, v in value.items()
        if k in CARRIED and (isinstance(v, str) or (k == "priority" and type(v) is int))
    }


def encode_record(record: JournalRecord) -> bytes:
    """A compact JSON line; short keys keep a record near 150 bytes without headers."""
    data: dict[str, Any] = {"v": _VERSION, "k": record.kind, "id": record.message_id}
    if record.kind != "marker":
        data |= {"d": record.destination, "due": record.due_at_ms, "a": record.attempt}
        data["n"] = record.body_size
        if record.headers:
            data["h"] = _plain(record.headers)
    if record.cancels_due_ms:
        data["c"] = list(record.cancels_due_ms)
    if record.key is not None:
        data["key"] = record.key
    if record.on_conflict is not None:
        data["m"] = record.on_conflict
    if record.worker:
        data["w"] = record.worker
    if record.claim_id:
        data["cid"] = record.claim_id
    if record.fresh_copy:
        data["f"] = True
    if record.data:
        data["r"] = _plain(record.data)
    data["t"] = record.recorded_at_ms
    if record.body is not None:
        data["b"] = base64.b64encode(record.body).decode()
        if record.properties:
            data["p"] = dict(record.properties)
    return json.dumps(data, separators=(",", ":")).encode()


json_text: Callable[[str], str] = getattr(json.encoder, "encode_basestring_ascii", json.dumps)
"""What ``json.dumps`` makes of a str (by default, ASCII), without its checks of the
arguments and the type: the journal writes two per message, ``scheduled list --json`` two
per row. The encoder's helper is not in ``json``'s documented API, so ``json.dumps``
itself stands in where it is missing (tests check both give the same text)."""


def encode_scheduled(
    message_id: str,
    destination: str,
    due_at_ms: int,
    attempt: int,
    body_size: int,
    recorded_at_ms: int,
    key: str | None = None,
    on_conflict: OnConflict | None = None,
) -> bytes:
    """:func:`encode_record` of a ``scheduled`` record with no headers and no body, the
    usual one, without building the record first: the journal is written on every
    publish. The same bytes (``tests/unit/test_journal.py`` checks it)."""
    keyed = ""
    if key is not None:
        keyed = f'"key":{json_text(key)},'
        if on_conflict is not None:
            keyed += f'"m":"{on_conflict}",'
    return (
        f'{{"v":{_VERSION},"k":"scheduled","id":{json_text(message_id)},'
        f'"d":{json_text(destination)},"due":{due_at_ms},"a":{attempt},"n":{body_size},'
        f'{keyed}"t":{recorded_at_ms}}}'
    ).encode()


def decode_record(raw: bytes) -> JournalRecord | None:
    """The record, or None for anything this version cannot read (skipped, not fatal)."""
    try:
        return _record_of(json.loads(raw))
    except ValueError:
        return None


_PLAIN_KEYS = frozenset(("v", "k", "id", "d", "due", "a", "n", "t"))
"""The fields of the usual record: :func:`encode_scheduled`'s without a key."""


def _record_of(data: Any) -> JournalRecord | None:
    """A parsed line as a record, or None when this version cannot read it."""
    try:
        if not isinstance(data, dict) or data.get("v") != _VERSION:
            return None
        kind = data["k"]
        if kind not in _KINDS:
            return None
        if data.keys() == _PLAIN_KEYS:  # the usual record: fewer lookups
            return plain_record(
                kind,
                str(data["id"]),
                str(data["d"]),
                int(data["due"]),
                int(data["a"]),
                int(data["n"]),
                int(data["t"]),
            )
        body = data.get("b")
        key = data.get("key")
        mode = data.get("m")
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
            properties=_properties(data.get("p")),
            cancels_due_ms=tuple(int(due) for due in data.get("c", ())),
            key=None if key is None else str(key),
            on_conflict=mode if mode in ("ignore", "replace") else None,
            worker=str(data.get("w", "")),
            claim_id=str(data.get("cid", "")),
            fresh_copy=bool(data.get("f", False)),
            data=dict(data.get("r", {})),
        )
    except (ValueError, KeyError, TypeError):
        return None


def encode_records(records: Iterable[JournalRecord]) -> bytes:
    """Several records in one stream message, one JSON line each: a batch costs one write."""
    return b"\n".join(encode_record(r) for r in records)


def decode_records(raw: bytes) -> list[JournalRecord]:
    """Every readable record of a stream message (JSON never holds a raw newline).

    A write of usual records (:func:`encode_scheduled`'s, no key: what ``publish_many``
    writes, 500 to a message) is read by one regular expression over the whole message,
    each record made without the JSON parser's dict; any other line sends the message
    through :func:`decode_lines`. Same records either way (``tests/unit/test_journal.py``).
    """
    found = _PLAIN_LINE.findall(raw)
    if len(found) == raw.count(b"\n") + 1:
        return _plain_records(found)
    return decode_lines(raw.split(b"\n"))


_TEXT = rb'"([ !#-\[\]-~]*)"'
"""A JSON string that reads as its own bytes: printable ASCII without ``"`` or ``\\``
(``json.dumps`` writes anything else as an escape)."""
_NUMBER = rb"(0|[1-9][0-9]*)"
"""A JSON number that ``int`` reads as JSON does: no sign, fraction or leading zero."""
_PLAIN_LINE = re.compile(
    rb'^\{"v":1,"k":"scheduled","id":%s,"d":%s,"due":%s,"a":%s,"n":%s,"t":%s\}$'
    % (_TEXT, _TEXT, _NUMBER, _NUMBER, _NUMBER, _NUMBER),
    re.MULTILINE,
)
"""A whole line holding the usual record: one match per line at most, so as many
matches as lines means every line is one."""


def _plain_records(found: list[tuple[bytes, ...]]) -> list[JournalRecord]:
    """The records of :data:`_PLAIN_LINE`'s matches (a destination's name decoded once)."""
    names: dict[bytes, str] = {}
    records = []
    for message_id, destination, due, attempt, size, at in found:
        name = names.get(destination)
        if name is None:
            name = names[destination] = destination.decode("ascii")
        records.append(
            plain_record(
                "scheduled",
                message_id.decode("ascii"),
                name,
                int(due),
                int(attempt),
                int(size),
                int(at),
            )
        )
    return records


def decode_lines(lines: list[bytes]) -> list[JournalRecord]:
    """Every readable record of these lines, in order: parsed as one JSON array (one
    parser call for a write of 500 records instead of 500), line by line when any line
    is not JSON, so an unreadable line is skipped and costs the others nothing."""
    try:
        parsed = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        return [r for line in lines if (r := decode_record(line)) is not None]
    if len(parsed) != len(lines):  # a line was not one JSON value: read them one by one
        return [r for line in lines if (r := decode_record(line)) is not None]
    return [r for data in parsed if (r := _record_of(data)) is not None]


_DUE, _ID = attrgetter("due_at_ms"), attrgetter("message_id")


def _soonest_first(found: list[JournalRecord]) -> None:
    """Sort copies by due time, then id. By due time alone first (ints: 100,000 copies
    sorted 6 times faster than by (due, id) tuples), then each run of copies due at the
    same millisecond by id, as the stable sort left them in record order."""
    found.sort(key=_DUE)
    dues = list(map(_DUE, found))
    # i such that found[i] is due when found[i - 1] is: a run of them is one tie
    ties = compress(range(1, len(dues)), map(eq, dues, islice(dues, 1, None)))
    first = last = -2
    for i in (*ties, -2):
        if i != last + 1:
            if first >= 0:
                found[first - 1 : last + 1] = sorted(found[first - 1 : last + 1], key=_ID)
            first = i
        last = i


@dataclass
class ScheduleView:
    """What the journal says may still be scheduled: every copy, and what cancels it.

    A copy is ``(message id, due time)``; the view keeps the last record of each, never
    only the latest record of an id. A retry or replay records its id again with a new
    due time: the older copy has fallen due, so :meth:`pending` leaves it out by its
    time, not because a later record replaced it. A record that comes late (its publish
    failed, or a partition held it) adds its copy and hides no other.

    A copy is cancelled when a tombstone naming its due time comes after its last
    record. So a re-schedule of the id with a new due time, recorded after the
    tombstone, is a copy the tombstone does not name and stays pending; a copy recorded
    again, same id and due time, after the tombstone is pending again (the two cannot be
    told apart, in the journal or in a worker).
    """

    copies: dict[tuple[str, int], JournalRecord] = field(default_factory=dict)
    cancelled: dict[str, set[int]] = field(default_factory=dict)
    """Per id, the due times named by a tombstone and not recorded again since."""
    keys: KeyBook = field(default_factory=lambda: _key_book())
    """Keys, generations, claims and moves (:mod:`.keys`): what hides a keyed copy."""
    _by_id: dict[str, list[int]] | None = field(default=None, init=False, repr=False, compare=False)

    def add(self, record: JournalRecord) -> None:
        message_id = record.message_id
        kind = record.kind
        if record.key is not None or kind in _KEY_KINDS:
            self.keys.add(record)
        if kind == "scheduled":  # first: nearly every record (a list reads 100,000)
            due = record.due_at_ms
            if self.keys.moves and self.keys.stale(message_id, due) is not None:
                return  # a copy recorded again after its id moved: it will not be handled
            self.copies[message_id, due] = record
            self._by_id = None
            named = self.cancelled.get(message_id) if self.cancelled else None
            if named is not None and due in named:
                named.discard(due)
                if not named:
                    del self.cancelled[message_id]
        elif kind == "rescheduled":
            self._move(record)
        elif kind == "cancelled":
            self.cancelled.setdefault(message_id, set()).update(record.named_due_times())

    def extend(self, records: Iterable[JournalRecord]) -> ScheduleView:
        for record in records:
            self.add(record)
        return self

    def _move(self, record: JournalRecord) -> None:
        """A reschedule: the id's named copies become one copy at the new due time."""
        message_id = record.message_id
        moved = [self.copies.pop((message_id, due), None) for due in record.cancels_due_ms]
        last = max((r for r in moved if r is not None), key=lambda r: r.due_at_ms, default=None)
        if last is not None and (message_id, record.due_at_ms) not in self.copies:
            self.copies[message_id, record.due_at_ms] = replace(last, due_at_ms=record.due_at_ms)
        self._by_id = None

    def hidden(self, record: JournalRecord) -> bool:
        """Whether a keyed copy will not be handled: it lost to a pending message with its
        key (``ignore``), or a ``replace`` took its place."""
        return record.key is not None and self.keys.hides(record.message_id)

    def is_cancelled(self, message_id: str, due_at_ms: int) -> bool:
        """Whether a tombstone after the copy's last record names it."""
        named = self.cancelled.get(message_id)
        return named is not None and due_at_ms in named

    def pending(
        self,
        now_ms: int,
        *,
        destination: str | None = None,
        due_before_ms: int | None = None,
        limit: int | None = None,
    ) -> list[JournalRecord]:
        """Every copy still ahead and not cancelled, soonest first: an id with several
        copies waiting appears once per copy."""
        cancelled = self.cancelled
        found = [
            r
            for (message_id, due), r in self.copies.items()
            if due > now_ms
            and (message_id not in cancelled or due not in cancelled[message_id])
            and (destination is None or r.destination == destination)
            and (due_before_ms is None or due < due_before_ms)
            and not (r.key is not None and self.hidden(r))
        ]
        _soonest_first(found)
        return found if limit is None else found[:limit]

    def copies_of(self, message_id: str) -> list[JournalRecord]:
        """Every copy of ``message_id`` recorded, cancelled or not, soonest first."""
        if self._by_id is None:
            by_id: dict[str, list[int]] = {}
            for key in self.copies:
                by_id.setdefault(key[0], []).append(key[1])
            self._by_id = by_id
        dues = sorted(self._by_id.get(message_id, ()))
        return [self.copies[message_id, due] for due in dues]

    def answer(self, message_id: str, now_ms: int) -> tuple[CancelAnswer, JournalRecord | None]:
        """What a cancel of ``message_id`` finds: ``cancelled`` when any copy is still
        ahead (with the last of them), ``too late`` when every copy is due already (with
        the last), ``unknown`` without a record. A copy cancelled before counts: a second
        cancel answers as the first did."""
        copies = self.copies_of(message_id)
        if not copies:
            return "unknown", None
        if copies[-1].due_at_ms <= now_ms:
            return "too late", copies[-1]
        return "cancelled", copies[-1]


@dataclass(frozen=True)
class CancelResult:
    """What a cancel found for one message id.

    ``due_at_ms`` is the last due time of the copies the answer is about (those still
    ahead for ``cancelled``, all of them for ``too late``). ``copies`` is how many
    copies of the id the journal holds; ``cancelled_due_ms`` the due times of those
    this cancel stopped, soonest first: more than one when a publish was sent again.
    """

    message_id: str
    outcome: CancelAnswer
    due_at_ms: int | None = None
    destination: str | None = None
    copies: int = 0
    cancelled_due_ms: tuple[int, ...] = ()
    key: str | None = None
    """For a cancel by key: the key, whose current message is ``message_id`` (empty
    when the journal knows no message with that key)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "outcome": self.outcome,
            "due_at_ms": self.due_at_ms,
            "destination": self.destination,
            "copies": self.copies,
            "cancelled_due_ms": list(self.cancelled_due_ms),
            **({"key": self.key} if self.key is not None else {}),
        }


def plan_cancels(
    view: ScheduleView, message_ids: Iterable[str], now_ms: int
) -> tuple[list[CancelResult], list[JournalRecord]]:
    """The answer for each id, and the tombstones to append for those still ahead.

    A tombstone names every copy recorded for its id, those already due too: such a
    copy may still wait in its work queue, and a worker then skips it (within
    :data:`CANCEL_MARGIN_MS`). An id whose copies are all due gets no tombstone: the
    answer is ``too late``.
    """
    results: list[CancelResult] = []
    tombstones: list[JournalRecord] = []
    for message_id in dict.fromkeys(message_ids):
        copies = view.copies_of(message_id)
        answer, last = view.answer(message_id, now_ms)
        if last is None:
            results.append(CancelResult(message_id, answer))
            continue
        ahead = tuple(c.due_at_ms for c in copies if c.due_at_ms > now_ms)
        results.append(
            CancelResult(message_id, answer, last.due_at_ms, last.destination, len(copies), ahead)
        )
        if answer == "cancelled":
            tombstones.append(
                JournalRecord(
                    "cancelled",
                    message_id,
                    last.destination,
                    last.due_at_ms,
                    last.attempt,
                    recorded_at_ms=now_ms,
                    # one copy: the tombstone of old, due_at_ms alone names it; the due
                    # times an id was moved from too, so a worker skips a stale copy
                    cancels_due_ms=_named(copies, view.keys.moves.get(message_id)),
                )
            )
    return results, tombstones


def _named(copies: list[JournalRecord], move: Move | None) -> tuple[int, ...]:
    dues = [c.due_at_ms for c in copies]
    if move is not None:
        dues = sorted({*dues, *move.old_due_ms})
    return tuple(dues) if len(dues) > 1 else ()


def _dues(value: int | tuple[int, ...]) -> tuple[int, ...]:
    return (value,) if isinstance(value, int) else value


_KEY_KINDS = frozenset(("claimed", "done", "rescheduled", "cancelled"))
"""Kinds the key book follows besides keyed ``scheduled`` records."""


def _key_book() -> KeyBook:
    from .keys import KeyBook  # keys imports this module's records

    return KeyBook()


_SCHEDULED_KIND = b'"k":"scheduled"'
_LOOKUP_MAX = 16


@dataclass
class Tombstones:
    """The cancelled copies a worker honours, each until its due time plus a margin.

    Per id, the due times its tombstones name (one int, the usual case, or a tuple:
    a worker holds many). The worker follows every record, so a ``scheduled`` record
    of a named copy coming after the tombstone takes that copy out again, as in
    :class:`ScheduleView`: the worker skips exactly what ``scheduled list`` no longer
    shows.
    """

    margin_ms: int = CANCEL_MARGIN_MS
    due_ms: dict[str, int | tuple[int, ...]] = field(default_factory=dict)

    def add(self, record: JournalRecord) -> None:
        message_id = record.message_id
        held = self.due_ms.get(message_id)
        if record.kind == "cancelled":
            named = record.named_due_times()
            if held is None and len(named) == 1:
                self.due_ms[message_id] = named[0]
                return
            dues = tuple(sorted({*named, *(_dues(held) if held is not None else ())}))
            self.due_ms[message_id] = dues[0] if len(dues) == 1 else dues
        elif record.kind == "scheduled" and held is not None:
            rest = tuple(d for d in _dues(held) if d != record.due_at_ms)
            if not rest:
                del self.due_ms[message_id]
            else:
                self.due_ms[message_id] = rest[0] if len(rest) == 1 else rest

    def wants(self, line: bytes) -> bool:
        """Whether a journal line can change what is held: a tombstone, a marker, or a
        ``scheduled`` record of an id held. A worker follows every record every
        publisher writes, and decoding each one cost it more than the rest of its work
        for a publish (the x-delay bridge's journal records carry an envelope); a
        ``scheduled`` record of an id no tombstone names is passed over undecoded.

        In a line, ``"k":"scheduled"`` is the record's kind (a quote inside a JSON string
        is escaped), and a held id is there as its JSON string if the record is its.
        """
        if _SCHEDULED_KIND not in line:
            return True
        held = self.due_ms
        if not held:
            return False
        if len(held) > _LOOKUP_MAX:
            return True  # decoding is cheaper than looking for this many ids
        return any(json.dumps(message_id).encode() in line for message_id in held)

    def is_cancelled(self, message_id: str, now_ms: int, due_at_ms: int | None = None) -> bool:
        """Whether the copy of ``message_id`` due at ``due_at_ms`` is cancelled. A
        delivery without a due time (no ``rmqdelay-due-at`` header) is taken for any
        cancelled copy of its id."""
        held = self.due_ms.get(message_id)
        if held is None:
            return False
        if due_at_ms is None:
            return any(now_ms <= due + self.margin_ms for due in _dues(held))
        return due_at_ms in _dues(held) and now_ms <= due_at_ms + self.margin_ms

    def expire(self, now_ms: int) -> int:
        """Forget copies past their time; return how many ids were dropped whole."""
        dropped = 0
        for message_id, held in list(self.due_ms.items()):
            keep = tuple(d for d in _dues(held) if d + self.margin_ms >= now_ms)
            if not keep:
                del self.due_ms[message_id]
                dropped += 1
            elif len(keep) != len(_dues(held)):
                self.due_ms[message_id] = keep[0] if len(keep) == 1 else keep
        return dropped

    def __len__(self) -> int:
        return len(self.due_ms)
