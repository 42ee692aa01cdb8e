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

Pure: the codec, the pointer, the rules for when one is due, and the writer's merge.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..layout import Layout
from .records import JournalRecord, decode_records, encode_record
from .recurring import RecurringBook
from .view import ScheduleView

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
    "JournalState",
    "Mark",
    "Merge",
    "Part",
    "Pointer",
    "Restorer",
    "Section",
    "body_entry",
    "checkpoint_name",
    "copies_merge",
    "decode_entries",
    "due_by_tail",
    "encode_entries",
    "parts",
    "with_body",
    "without_body",
    "write_sections",
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

MIN_TAIL_BYTES = 4 * 1024 * 1024
"""No checkpoint is due before the tail holds this many bytes (a few seconds of a busy
journal's records): below it, reading the tail costs less than writing the state."""
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


# ---------------------------------------------------------------------------- the state


@dataclass
class JournalState:
    """Everything the journal says, folded: the schedule (:class:`~.view.ScheduleView`:
    copies, tombstones, keys) and the recurring schedules. A checkpoint is this, written
    down; each reader restores the part of it that it needs."""

    view: ScheduleView = field(default_factory=ScheduleView)
    recurring: RecurringBook = field(default_factory=RecurringBook)

    def add(self, record: JournalRecord) -> None:
        self.view.add(record)
        self.recurring.add(record)

    def restore(self, entry: Mapping[str, Any]) -> None:
        """One ``core`` entry, to the fold it belongs to."""
        if entry["s"] in _RECURRING_ENTRIES:
            self.recurring.restore(entry)
        else:
            self.view.restore(entry)

    def core_entries(self) -> Iterator[dict[str, Any]]:
        yield from self.view.entries()
        yield from self.recurring.entries()

    def expire(self, now_ms: int, horizon_ms: int) -> None:
        """Forget what is settled (:data:`SETTLE_MS`), and schedules removed longer ago
        than ``horizon_ms`` (the longest delay: none of their occurrences can come)."""
        self.view.expire(now_ms, SETTLE_MS)
        self.recurring.expire(now_ms, horizon_ms + SETTLE_MS)


_RECURRING_ENTRIES = frozenset(("sched", "switch", "removed"))


class Merge:
    """A new checkpoint's section, soonest first: the previous checkpoint's, fed part by
    part as it is read, merged with the writer's own.

    The previous section comes in order (by due time, then id); ``own`` is the writer's
    (the copies it folded from the tail, and those of the ids it loaded), sorted here.
    What ``skip`` says is gone is left out: due before the cutoff, an id whose copies the
    writer holds all of (it loaded them), a copy recorded again since. A writer holds the
    tail's copies, never the state's."""

    def __init__(
        self,
        own: Iterable[Any],
        place: Callable[[Any], tuple[int, str]],
        skip: Callable[[Any], bool],
    ) -> None:
        self._own = sorted(own, key=place)
        self._next = 0
        self._place = place
        self._skip = skip

    def feed(self, previous: Iterable[Any]) -> list[Any]:
        """What can be written once these previous entries are read (in order)."""
        out: list[Any] = []
        own, place = self._own, self._place
        for item in previous:
            if self._skip(item):
                continue
            here = place(item)
            while self._next < len(own) and place(own[self._next]) <= here:
                out.append(own[self._next])
                self._next += 1
            out.append(item)
        return out

    def finish(self) -> list[Any]:
        """The writer's own entries after the last previous one."""
        rest, self._next = self._own[self._next :], len(self._own)
        return rest


def copies_merge(view: ScheduleView, cutoff_ms: int) -> tuple[Merge, Merge]:
    """The merges of the copies and the bodies sections: the previous checkpoint's, less
    what the view replaces (see :class:`Merge`), with the view's copies due from
    ``cutoff_ms`` on."""
    loaded = view.loaded or set()
    copies = view.copies
    own = [r for key, r in copies.items() if key[1] >= cutoff_ms]

    def gone(message_id: str, due: int) -> bool:
        return due < cutoff_ms or message_id in loaded or (message_id, due) in copies

    def copy_place(r: JournalRecord) -> tuple[int, str]:
        return (r.due_at_ms, r.message_id)

    def body_place(entry: Mapping[str, Any]) -> tuple[int, str]:
        return (int(entry["due"]), str(entry["id"]))

    copies_merge = Merge(own, copy_place, lambda r: gone(r.message_id, r.due_at_ms))
    bodies = [body_entry(r) for r in own if r.body is not None]
    bodies_merge = Merge(bodies, body_place, lambda e: gone(str(e["id"]), int(e["due"])))
    return copies_merge, bodies_merge


class Restorer:
    """Takes a checkpoint's parts into a :class:`JournalState`, section by section.

    ``ids``: whose copies to keep (all by default): a reader of a few ids keeps theirs
    (the view then holds them alone, :attr:`~.view.ScheduleView.loaded`), and decodes
    only the parts that name one of them; ``hold``: which of those to keep. A worker
    reads no copy at all. Bodies join the copies kept."""

    def __init__(
        self,
        state: JournalState,
        *,
        ids: Iterable[str] | None = None,
        hold: Callable[[JournalRecord], bool] | None = None,
    ) -> None:
        self.state = state
        self.ids = None if ids is None else set(ids)
        self.hold = hold
        if self.ids is not None:
            state.view.loaded = set(self.ids)
        self.copies = 0
        """Copies kept so far."""

    def take(self, section: str, body: bytes) -> None:
        view = self.state.view
        if section == "core":
            for entry in decode_entries(body):
                self.state.restore(entry)
        elif section == "copies":
            for record in self.wanted(body):
                view.restore_copy(record)
                self.copies += 1
        elif section == "bodies":
            if self.ids is not None and not self._names_one(body):
                return
            for entry in decode_entries(body):
                copy = view.copies.get((str(entry["id"]), int(entry["due"])))
                if copy is not None:
                    view.restore_copy(with_body(copy, entry))

    def wanted(self, body: bytes) -> list[JournalRecord]:
        """The copies of a part this reader keeps."""
        ids, hold = self.ids, self.hold
        if ids is not None:
            if not self._names_one(body):
                return []
            found = [r for r in decode_copies(body) if r.message_id in ids]
        else:
            found = decode_copies(body)
        return found if hold is None else [r for r in found if hold(r)]

    def _names_one(self, body: bytes) -> bool:
        """Whether a part's bytes hold one of :attr:`ids`, as a JSON string (a part
        that does not is not decoded)."""
        return any(_quoted(i) in body for i in self.ids or ())


def _quoted(message_id: str) -> bytes:
    """How an id appears in a record's line: a JSON string."""
    return json.dumps(message_id).encode()


def write_sections(
    state: JournalState, previous: tuple[Merge, Merge] | None = None
) -> Iterator[tuple[Section, bytes, int]]:
    """A state with nothing before it, as the parts of a checkpoint (section, body,
    entries): the writer's merge with no previous checkpoint (tests, a first one)."""
    copies, bodies = previous or copies_merge(state.view, -(2**63))
    for body, count in parts(encode_entries(state.core_entries())):
        yield "core", body, count
    for body, count in parts(encode_copy(r) for r in copies.finish()):
        yield "copies", body, count
    for body, count in parts(encode_entries(bodies.finish())):
        yield "bodies", body, count
