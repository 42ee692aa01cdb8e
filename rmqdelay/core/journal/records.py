"""The schedule journal's records and their codec: what one line of the journal says.

A message waiting in a fixed-TTL tier can be neither found nor removed, so every publish
also appends a small record to a RabbitMQ stream, ``{prefix}.schedule``, and a cancel
appends a tombstone there (:mod:`.view` folds them). A record is one compact JSON line;
a stream message holds a few hundred of them (one write per batch).

A reader cannot ask a stream where its end is, so it appends a ``marker`` record of its
own and reads until that marker comes back: everything confirmed before it has been seen.

Pure: encoding and decoding only.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Literal

from ..layout import Layout
from ..messages import CARRIED

__all__ = [
    "CANCEL_MARGIN_MS",
    "RECORDS_PER_WRITE",
    "JournalRecord",
    "OnConflict",
    "RecordKind",
    "decode_lines",
    "decode_record",
    "decode_records",
    "encode_record",
    "encode_records",
    "encode_scheduled",
    "journal_name",
    "json_text",
    "max_age",
    "plain_record",
]

RecordKind = Literal[
    "scheduled", "cancelled", "marker", "claimed", "done", "rescheduled", "recurring"
]
OnConflict = Literal["ignore", "replace"]
"""What a keyed publish does while a message with its key is pending (:mod:`.keys`)."""
_KINDS = frozenset(
    ("scheduled", "cancelled", "marker", "claimed", "done", "rescheduled", "recurring")
)
_VERSION = 1
RECORDS_PER_WRITE = 500
"""Records per stream message: a batch's (or a cancel's) records cost a few writes."""
CANCEL_MARGIN_MS = 60_000
"""How long a worker keeps a tombstone after the message's due time, for lateness."""


def journal_name(layout: Layout) -> str:
    """The stream, and the fanout exchange of the same name that leads to it."""
    return f"{layout.prefix}.schedule"


def max_age(layout: Layout) -> str:
    """The ``x-max-age`` the journal was declared with before checkpoints: just over the
    longest delay, in whole hours. A journal of then is kept as it was, and a policy
    gives it its retention by size (:func:`rmqdelay.core.topology.retention_policy`).
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
    body: bytes | None = None,
    properties: Mapping[str, Any] | None = None,
) -> bytes:
    """:func:`encode_record` of a ``scheduled`` record with no headers, the usual one
    (with its body and properties when ``journal_bodies``), without building the record
    first: the journal is written on every publish. The same bytes
    (``tests/unit/test_fast_paths.py`` checks it)."""
    keyed = ""
    if key is not None:
        keyed = f'"key":{json_text(key)},'
        if on_conflict is not None:
            keyed += f'"m":"{on_conflict}",'
    tail = ""
    if body is not None:
        tail = f',"b":"{base64.b64encode(body).decode()}"'
        if properties:
            tail += ',"p":' + json.dumps(dict(properties), separators=(",", ":"))
    return (
        f'{{"v":{_VERSION},"k":"scheduled","id":{json_text(message_id)},'
        f'"d":{json_text(destination)},"due":{due_at_ms},"a":{attempt},"n":{body_size},'
        f'{keyed}"t":{recorded_at_ms}{tail}}}'
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
        try:
            return _plain_records(found)
        except ValueError:  # a body that is not base64 after all: the parser says which
            pass
    return decode_lines(raw.split(b"\n"))


_TEXT = rb'"([ !#-\[\]-~]*)"'
"""A JSON string that reads as its own bytes: printable ASCII without ``"`` or ``\\``
(``json.dumps`` writes anything else as an escape)."""
_NUMBER = rb"(0|[1-9][0-9]*)"
"""A JSON number that ``int`` reads as JSON does: no sign, fraction or leading zero."""
_PLAIN_LINE = re.compile(
    rb'^\{"v":1,"k":"scheduled","id":%s,"d":%s,"due":%s,"a":%s,"n":%s,"t":%s'
    rb'(,"b":"[A-Za-z0-9+/=]*")?(,"p":\{"content_type":"[ !#-\[\]-~]*"\})?\}$'
    % (_TEXT, _TEXT, _NUMBER, _NUMBER, _NUMBER, _NUMBER),
    re.MULTILINE,
)
"""A whole line holding the usual record, its body and content type too when the journal
keeps bodies: one match per line at most, so as many matches as lines means every line
is one."""
_B, _P = len(',"b":"'), len(',"p":{"content_type":"')


def _plain_records(found: list[tuple[bytes, ...]]) -> list[JournalRecord]:
    """The records of :data:`_PLAIN_LINE`'s matches (a destination's name decoded once)."""
    names: dict[bytes, str] = {}
    records = []
    for message_id, destination, due, attempt, size, at, body, properties in found:
        name = names.get(destination)
        if name is None:
            name = names[destination] = destination.decode("ascii")
        record = plain_record(
            "scheduled",
            message_id.decode("ascii"),
            name,
            int(due),
            int(attempt),
            int(size),
            int(at),
        )
        if body:  # the group's whole text: '' when the line has no body
            vars(record)["body"] = base64.b64decode(body[_B:-1])
        if properties:
            vars(record)["properties"] = {"content_type": properties[_P:-2].decode("ascii")}
        records.append(record)
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
