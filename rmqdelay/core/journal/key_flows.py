"""A publisher's side of keys: reading the journal back after a keyed publish.

The journal is the arbiter (:mod:`.keys`): whether a keyed publish was scheduled, ignored
or replaced is what the fold of every record up to its own says, the same for every
reader. So a keyed publish ends its journal write with a marker of its own, and once the
write is confirmed, reads the journal until the marker comes back. The publisher keeps
its :class:`KeyFollower` (the fold and the stream offset it has read to) and the adapter
keeps the consumer open (a :class:`~.steps.Read` with ``keep``), so a second keyed
publish reads only what was written since the first. The first starts from the latest
checkpoint's keys (:mod:`.checkpoint`), not from the journal's past.

Pure: the adapters carry out the steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from ...errors import JournalError
from ..clock import now_ms
from ..failures import journal_missing
from ..layout import Layout
from ..publishing.outgoing import Prepared, PublishResult
from ..steps import Flow
from .checkpoint import Pointer
from .generations import Generation, Loser
from .keys import KeyBook
from .reading import Clock, load_core
from .records import JournalRecord, decode_record, journal_name
from .steps import Read, Start, StreamMessage, stream_offset

__all__ = ["KEYS_READER", "KeyFollower", "key_answer", "keyed_line", "read_back"]

KEYS_READER = "keys"
"""The kept consumer of a publisher's keyed publishes (:class:`~.steps.Read` ``keep``)."""

_SCHEDULED = b'"k":"scheduled"'
_KEYED = b'"key":'
_MARKER = b'"k":"marker"'
EXPIRE_EVERY_MS = 60_000


def keyed_line(line: bytes) -> bool:
    """Whether a journal line can matter to keys: anything but a ``scheduled`` record
    without a key. A publisher follows every record every publisher writes, and most
    are unkeyed; those are passed over undecoded (as ``Tombstones.wants`` does)."""
    return _SCHEDULED not in line or _KEYED in line


@dataclass
class KeyFollower:
    """The journal as a publisher has read it for keys: the fold, and where it stands.

    ``take`` gets each stream message with its offset, in order, and skips one it was
    given before (a consumer reopened after a lost connection starts where this stopped,
    or earlier), so every record is folded exactly once.
    """

    book: KeyBook = field(default_factory=KeyBook)
    """The fold of every keyed record read."""
    next_offset: int | None = None
    """The offset of the first stream message not read yet; None before the first read."""
    expected: dict[str, tuple[JournalRecord, ...]] = field(default_factory=dict)
    """Markers of journal writes sent and not read back yet, with their keyed records."""
    seen: set[str] = field(default_factory=set)
    """Markers read back and not yet claimed by the publish that waits for them."""
    expired_at_ms: int = 0
    """When the fold last forgot what can no longer matter (a publisher lives long)."""
    pointer: Pointer | None = None
    """The checkpoint the fold started from (GENESIS: none); None before the first read."""

    def tidy(self, now_ms: int) -> None:
        """Forget keys long due, at most once every :data:`EXPIRE_EVERY_MS`."""
        if now_ms - self.expired_at_ms >= EXPIRE_EVERY_MS:
            self.expired_at_ms = now_ms
            self.book.expire(now_ms)

    def take(self, offset: int, body: bytes) -> None:
        if self.next_offset is not None and offset < self.next_offset:
            return
        self.next_offset = offset + 1
        if self.expected and self._own(body):
            return
        for line in body.split(b"\n"):
            if not keyed_line(line):
                continue
            record = decode_record(line)
            if record is None:
                continue
            if record.kind == "marker":
                if self.expected.pop(record.message_id, None) is not None:
                    self.seen.add(record.message_id)
                continue
            self.book.add(record)

    def _own(self, body: bytes) -> bool:
        """Fold a write of this publisher's own from the records it kept: decoding every
        line again cost a keyed batch a third of its time. Its marker is its last line."""
        cut = body.rfind(b"\n")
        last = body[cut + 1 :]
        if cut < 0 or _MARKER not in last:  # a marker alone is read as any marker is
            return False
        record = decode_record(last)
        if record is None or record.message_id not in self.expected:
            return False
        for own in self.expected.pop(record.message_id):
            self.book.add(own)
        self.seen.add(record.message_id)
        return True

    def expect(self, markers: Mapping[str, tuple[JournalRecord, ...]]) -> None:
        """Markers about to be written, with their writes' keyed records: noted before
        the write goes out, since another publish of this publisher may read past them."""
        self.expected.update(markers)

    def forget(self, markers: Iterable[str]) -> None:
        """Markers whose write failed: nobody waits for them."""
        for marker in markers:
            self.expected.pop(marker, None)
            self.seen.discard(marker)

    def reached(self, markers: Iterable[str]) -> bool:
        return all(m in self.seen for m in markers)


def read_back(
    layout: Layout,
    follower: KeyFollower,
    markers: list[str],
    *,
    timeout: float,
    what: str,
    clock: Clock = now_ms,
) -> Flow[None]:
    """Read the journal until every marker in ``markers`` came back.

    A first read starts from the latest checkpoint (its keys restored into the fold,
    the journal read from the offset it covers). ``what`` names the messages for the
    error when the stream gives nothing for ``timeout`` seconds.
    """

    def take(message: StreamMessage) -> bool:
        follower.take(message.offset, message.body)
        return follower.reached(markers)

    try:
        if not follower.reached(markers):
            if follower.pointer is None:
                pointer, entries = yield from load_core(layout, timeout=timeout)
                if follower.pointer is None:  # no concurrent read restored one first
                    for entry in entries:
                        follower.book.restore(entry)
                    follower.pointer = pointer
                    follower.next_offset = pointer.covers
            name = journal_name(layout)
            start: Start = (
                follower.next_offset
                if follower.next_offset is not None
                else stream_offset(clock() - layout.max_delay_ms)
            )
            end = yield Read(
                name,
                start,
                take,
                timeout,
                keep=KEYS_READER,
                reached=lambda: follower.reached(markers),
            )
            if end == "missing":
                raise journal_missing(layout)
            if end != "done":
                raise JournalError(
                    f"{what} published and recorded, but reading the schedule journal "
                    f"{name!r} back gave nothing for {timeout:g}s, so what the key made of it "
                    "(scheduled, ignored or replaced) is unknown: publish it again with the "
                    "same key and message_id (the same id is the same message, not a second one)"
                )
    finally:
        follower.forget(markers)
    follower.tidy(clock())


def key_answer(book: KeyBook, prepared: Prepared, result: PublishResult) -> PublishResult:
    """A keyed publish's result, from the fold once it has read the publish's record:
    ``ignored`` names the pending message (its id, due time and destination)."""
    outcome, entry = book.outcome(prepared.message_id)
    if isinstance(entry, Loser):
        winner = book.by_id.get(entry.winner_id)
        return replace(
            result,
            message_id=entry.winner_id,
            due_at_ms=entry.winner_due_ms,
            destination=winner.destination
            if isinstance(winner, Generation)
            else result.destination,
            generation=winner.number if isinstance(winner, Generation) else None,
            outcome="ignored",
            ignored_id=prepared.message_id,
        )
    if not isinstance(entry, Generation):
        return result  # not keyed under this id after all: nothing to add
    replaced = book.replaced(entry) if outcome == "replaced" else None
    replaced_id = None if replaced is None else replaced.message_id
    # built, not replace()d: a keyed batch answers every message
    return PublishResult(
        result.message_id,
        result.destination,
        result.due_at_ms,
        result.routing_key,
        result.hops,
        result.key,
        entry.number,
        outcome,
        replaced_id,
    )
