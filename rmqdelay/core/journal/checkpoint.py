"""Checkpoints: the journal's fold written back to RabbitMQ, so a reader starts from it.

Every reader used to fold everything recorded since now - ``max_delay``: its cost grew
with the traffic of the past, not with what is pending. A checkpoint is the fold as of a
journal offset (:attr:`Pointer.covers`), with what is settled left out (copies, tombstones
and keys due more than :data:`SETTLE_MS` before it was written: past every worker's
margin for lateness, retries and clock skew). A reader loads the latest complete one and
reads the journal only from the offset it covers: its cost is what is relevant now plus
a bounded tail (a checkpoint is due once the tail outgrows a fraction of it).

A checkpoint lives in a stream of its own, ``{prefix}.schedule.checkpoints`` (the
journal's readers never receive it), as messages in this order, each naming its
checkpoint in the header :data:`HEADER` (a :class:`Mark`):

- ``begin``;
- the ``core`` parts: tombstones, keys (generations, claims, losers, moves) and recurring
  schedules, small, all that a worker or a keyed publish needs;
- the ``copies`` parts: every copy still ahead (or within the margin), soonest first, as
  journal records without their bodies: ``scheduled list --limit 50`` reads the first;
- the ``bodies`` parts (``journal_bodies``): what a reschedule to an earlier time needs;
- ``commit``, with the part counts of each section.

Every message's mark also carries the pointer to the latest *complete* checkpoint its
writer knew (a commit points to itself), so a reader attaches to the stream's last
message and reads the pointer there: one message, however long the stream. A checkpoint
cut off half-way is never named by any pointer; a reader that starts during one uses the
previous one; records written meanwhile are in the tail after its offset.

Pure: the codec, the pointer and the rules for when one is due; the state a checkpoint
writes down, its merge and its restore are :mod:`.state`'s.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..layout import Layout
from .records import JournalRecord, decode_records, encode_record

__all__ = [
    "CHECKPOINT_TYPE",
    "COPIES",
    "COPIES_AND_BODIES",
    "CORE",
    "GENESIS",
    "HEADER",
    "HEARTBEAT_MS",
    "LEASE_MS",
    "MIN_TAIL_BYTES",
    "PART_BYTES",
    "QUIET_MS",
    "SECTIONS",
    "SETTLE_MS",
    "Mark",
    "Part",
    "Pointer",
    "Section",
    "body_entry",
    "checkpoint_name",
    "decode_entries",
    "due_by_tail",
    "encode_entries",
    "parts",
    "with_body",
    "without_body",
]

SETTLE_MS = 10 * 60_000
"""How long after its due time a copy, a tombstone or a key stays in a checkpoint: past
a worker's margin for a late copy (one minute), a retry's re-record and clock skew."""
Section = Literal["core", "copies", "bodies"]
SECTIONS: tuple[Section, ...] = ("core", "copies", "bodies")
CORE: tuple[Section, ...] = ("core",)
"""What a worker or a keyed publish reads of a checkpoint."""
COPIES: tuple[Section, ...] = ("copies",)
COPIES_AND_BODIES: tuple[Section, ...] = ("copies", "bodies")
Part = Literal["begin", "core", "copies", "bodies", "commit", "alive", "genesis"]
"""What a checkpoint stream message is: a checkpoint's part, a writer's heartbeat
(``alive``), or the first message ``topology apply`` writes (``genesis``)."""
PART_BYTES = 256 * 1024
"""A part is one stream message of about this many bytes (whole lines)."""
CHECKPOINT_TYPE = "rmqdelay-checkpoint"
"""The AMQP ``type`` of every checkpoint stream message."""
HEADER = "rmqdelay-checkpoint"
"""The header holding a message's :class:`Mark`, as compact JSON."""

MIN_TAIL_BYTES = 1024 * 1024
"""No checkpoint is due before the tail holds this many bytes (about 10,000 records, a
few seconds of a busy journal): below it, reading the tail costs a reader less than a
checkpoint costs its writer. Readers of a small state pay this tail at most: 0.1 s or
so (4 MiB cost a listing of nothing pending twice its time: ``bench.history``)."""
TAIL_RATIO = 8
"""A checkpoint is due once the tail holds an eighth of the latest one's bytes: a reader
that needs the whole state reads at most 1.125 times it, and one that needs only the
core (a worker, a keyed publish) a tail of an eighth of it (13 MB at a million pending:
under a second); the writer rewrites the state each time the journal grew by that."""
HEARTBEAT_MS = 5 * 60_000
"""A long-lived reader (a worker, the dashboard) that wrote no checkpoint says it is
alive this often, so that short-lived ones know a writer runs."""
QUIET_MS = 15 * 60_000
"""A short-lived process (a publisher, a command) writes a checkpoint when the stream
heard from no writer for this long: then nothing else keeps the tail short."""
LEASE_MS = 2 * 60_000
"""A checkpoint whose last part is younger than this is being written: another writer
waits. One cut off half-way is left after this long (no pointer names it)."""


def checkpoint_name(layout: Layout) -> str:
    """The checkpoint stream, and the fanout exchange of the same name leading to it."""
    return f"{layout.prefix}.schedule.checkpoints"


# ---------------------------------------------------------------------------- pointer


@dataclass(frozen=True)
class Pointer:
    """The latest complete checkpoint: where it is, and what it covers.

    ``covers`` is the journal offset its state runs to (exclusive): a reader reads the
    journal from there. None for :data:`GENESIS`, no checkpoint yet: a reader reads the
    journal from now - ``max_delay``, as before checkpoints. ``offset`` is the
    checkpoint stream offset of its ``begin``; ``sections`` the parts, entries and bytes
    of each section.
    """

    id: str
    at_ms: int
    covers: int | None
    offset: int | None
    sections: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.covers is not None

    @property
    def bytes(self) -> int:
        return sum(size for _parts, _entries, size in self.sections.values())

    def parts(self, section: Section) -> int:
        return self.sections.get(section, (0, 0, 0))[0]

    def entries(self, section: Section) -> int:
        return self.sections.get(section, (0, 0, 0))[1]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at_ms,
            "covers": self.covers,
            "offset": self.offset,
            "sections": {name: list(counts) for name, counts in self.sections.items()},
        }

    @staticmethod
    def of_json(data: Mapping[str, Any]) -> Pointer:
        sections = {
            str(name): (int(p), int(e), int(b)) for name, (p, e, b) in data["sections"].items()
        }
        covers, offset = data.get("covers"), data.get("offset")
        return Pointer(
            str(data["id"]),
            int(data["at"]),
            None if covers is None else int(covers),
            None if offset is None else int(offset),
            sections,
        )


GENESIS = Pointer("genesis", 0, None, None)
"""No checkpoint yet: readers read the journal from now - ``max_delay``."""


@dataclass(frozen=True)
class Mark:
    """What a checkpoint stream message says of itself (its :data:`HEADER`)."""

    id: str
    """Its checkpoint (or heartbeat) id."""
    part: Part
    index: int
    """Its place in its section (0 for the others)."""
    at_ms: int
    """Its writer's clock when it was written."""
    writer: str
    latest: Pointer
    """The latest complete checkpoint its writer knew: itself, for a commit."""

    def header(self) -> str:
        return json.dumps(
            {
                "id": self.id,
                "part": self.part,
                "i": self.index,
                "at": self.at_ms,
                "w": self.writer,
                "latest": self.latest.to_json(),
            },
            separators=(",", ":"),
        )

    @staticmethod
    def of_header(value: object) -> Mark | None:
        """The mark of a header value; None for anything else (not a checkpoint's)."""
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode(errors="replace")
        if not isinstance(value, str):
            return None
        try:
            data = json.loads(value)
            return Mark(
                str(data["id"]),
                data["part"],
                int(data["i"]),
                int(data["at"]),
                str(data["w"]),
                Pointer.of_json(data["latest"]),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def busy(self, now_ms: int) -> bool:
        """Whether another writer is writing a checkpoint: this is a part of one, not
        committed, and younger than :data:`LEASE_MS`."""
        return self.part in ("begin", "core", "copies", "bodies") and now_ms - self.at_ms < LEASE_MS

    def quiet(self, now_ms: int) -> bool:
        """Whether no writer spoke for :data:`QUIET_MS`: a short-lived process then writes
        a checkpoint itself, as nothing else keeps the tail short."""
        return now_ms - self.at_ms >= QUIET_MS


def due_by_tail(pointer: Pointer, tail_bytes: int, retention_bytes: int) -> bool:
    """Whether a reader that read ``tail_bytes`` of journal after ``pointer`` should write
    a checkpoint: the tail outgrew an eighth of the state (and :data:`MIN_TAIL_BYTES`),
    or an eighth of the journal's retention (the tail must never be deleted before a
    checkpoint covers it)."""
    if tail_bytes >= retention_bytes // 8:
        return True
    return tail_bytes >= max(MIN_TAIL_BYTES, pointer.bytes // TAIL_RATIO)


# ---------------------------------------------------------------------------- entries


def encode_entries(entries: Iterable[Mapping[str, Any]]) -> Iterator[bytes]:
    """Each entry as one compact JSON line."""
    for entry in entries:
        yield json.dumps(entry, separators=(",", ":")).encode()


def decode_entries(body: bytes) -> list[dict[str, Any]]:
    """The entries of one part (one JSON line each)."""
    found = json.loads(b"[" + body.replace(b"\n", b",") + b"]")
    return [entry for entry in found if isinstance(entry, dict)]


def parts(lines: Iterable[bytes], max_bytes: int = PART_BYTES) -> Iterator[tuple[bytes, int]]:
    """Lines grouped into parts of about ``max_bytes``: each body and its line count."""
    chunk: list[bytes] = []
    size = 0
    for line in lines:
        if chunk and size + len(line) > max_bytes:
            yield b"\n".join(chunk), len(chunk)
            chunk, size = [], 0
        chunk.append(line)
        size += len(line) + 1
    if chunk:
        yield b"\n".join(chunk), len(chunk)


def without_body(record: JournalRecord) -> JournalRecord:
    """A copy as the copies section holds it: its body goes to the bodies section."""
    if record.body is None and not record.properties:
        return record
    return replace(record, body=None, properties={})


def body_entry(record: JournalRecord) -> dict[str, Any]:
    """A copy's body (and the properties kept with it) as a bodies section entry."""
    assert record.body is not None
    return {
        "s": "body",
        "id": record.message_id,
        "due": record.due_at_ms,
        "b": base64.b64encode(record.body).decode(),
        "p": dict(record.properties),
    }


def with_body(record: JournalRecord, entry: Mapping[str, Any]) -> JournalRecord:
    """A copy of the copies section with its body from the bodies section."""
    return replace(record, body=base64.b64decode(entry["b"]), properties=dict(entry["p"]))


def decode_copies(body: bytes) -> list[JournalRecord]:
    """The copies of one part (journal records, one line each)."""
    return decode_records(body)


def encode_copy(record: JournalRecord) -> bytes:
    return encode_record(without_body(record))
