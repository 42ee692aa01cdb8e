"""The schedule as the journal tells it: every copy, and what cancels or hides it.

``scheduled list`` keeps what is still ahead and not cancelled; ``cancel`` answers from
the same fold (:func:`plan_cancels`).

Every copy counts. Publishing is at-least-once, so one message id can wait in the tiers
several times with different due times: a publish whose confirm failed and that was sent
again, a retry, a replay. A copy is its id and its due time (in its ``rmqdelay-due-at``
header and in its record), and the fold keeps each copy: a record written late, after
the others (its publish had failed, a partition had held it), adds a copy and hides
none. A tombstone names the due times of the copies it cancels.

Pure: folding only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from itertools import compress, islice
from operator import attrgetter, eq
from typing import Any, Literal

from ..clock import iso_of_ms
from .generations import Move
from .keys import KeyBook
from .records import JournalRecord

__all__ = ["CancelAnswer", "CancelResult", "ScheduleView", "plan_cancels"]

CancelAnswer = Literal["cancelled", "unknown", "too late"]

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

    copies: MutableMapping[tuple[str, int], JournalRecord] = field(default_factory=dict)
    """Each copy's last record, by (id, due time): a dict, or a store's table (the
    dashboard's, :mod:`rmqdelay.dashboard.store`)."""
    cancelled: dict[str, set[int]] = field(default_factory=dict)
    """Per id, the due times named by a tombstone and not recorded again since."""
    keys: KeyBook = field(default_factory=KeyBook)
    """Keys, generations, claims and moves (:mod:`.keys`): what hides a keyed copy."""
    loaded: set[str] | None = None
    """None: every copy is here. A set: the view began from a checkpoint whose copies
    were taken for these ids alone (:meth:`load`); the copies the journal recorded after
    the checkpoint are here for every id."""
    deferred: dict[str, list[JournalRecord]] = field(default_factory=dict)
    """Per id whose checkpoint copies are not here, the ``rescheduled`` records read
    since: a move picks its copy among the id's copies, so it waits for :meth:`load`."""
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
        if self.loaded is not None and message_id not in self.loaded:
            self.deferred.setdefault(message_id, []).append(record)
            return
        moved = [self.copies.pop((message_id, due), None) for due in record.cancels_due_ms]
        last = max((r for r in moved if r is not None), key=lambda r: r.due_at_ms, default=None)
        if last is not None and (message_id, record.due_at_ms) not in self.copies:
            self.copies[message_id, record.due_at_ms] = replace(last, due_at_ms=record.due_at_ms)
        self._by_id = None

    # ------------------------------------------------------------------ checkpoints

    def load(self, message_ids: Iterable[str], copies: Iterable[JournalRecord]) -> None:
        """Take a checkpoint's ``copies`` of ``message_ids`` (all it holds of them) into a
        view that began from it: each where the journal did not record it again since,
        then the moves read since, in order, as if they had been there all along."""
        if self.loaded is None:
            return
        ids = set(message_ids) - self.loaded
        self.loaded |= ids
        for record in copies:
            if record.message_id in ids:
                self.copies.setdefault((record.message_id, record.due_at_ms), record)
        self._by_id = None
        for message_id in ids:
            for move in self.deferred.pop(message_id, ()):
                self._move(move)

    def restore_copy(self, record: JournalRecord) -> None:
        """One copy of a checkpoint, as it was folded (no key or cancel logic again)."""
        self.copies[record.message_id, record.due_at_ms] = record
        self._by_id = None

    def entries(self) -> Iterator[dict[str, Any]]:
        """The tombstones as checkpoint entries, then the key book's (:mod:`.checkpoint`);
        the copies are a checkpoint section of their own."""
        for message_id, dues in self.cancelled.items():
            yield {"s": "tomb", "id": message_id, "due": sorted(dues)}
        yield from self.keys.entries()

    def restore(self, entry: Mapping[str, Any]) -> None:
        """Take back one entry of :meth:`entries`."""
        if entry["s"] == "tomb":
            self.cancelled[str(entry["id"])] = {int(due) for due in entry["due"]}
        else:
            self.keys.restore(entry)

    def expire(self, now_ms: int, margin_ms: int) -> None:
        """Forget copies, tombstones, generations and moves due more than ``margin_ms``
        before ``now_ms``: settled, never listed again, and past every worker's margin."""
        cutoff = now_ms - margin_ms
        drop = getattr(self.copies, "drop_due_before", None)
        if drop is not None:  # a store's table: one statement, not a walk
            drop(cutoff)
        else:
            for copy in [c for c in self.copies if c[1] < cutoff]:
                del self.copies[copy]
        self._by_id = None
        for message_id, dues in list(self.cancelled.items()):
            dues.difference_update([due for due in dues if due < cutoff])
            if not dues:
                del self.cancelled[message_id]
        self.keys.expire(now_ms, margin_ms, self.cancelled)

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

    def describe(self) -> str:
        """The answer in words, as ``rmqdelay cancel`` and the dashboard say it: what
        was named, then how many copies it stopped when there were several."""
        if self.key is not None:
            if not self.message_id:
                return f"key {self.key}: unknown (no message with this key in the schedule journal)"
            return f"key {self.key} ({self.message_id}): {self._said()}"
        return f"{self.message_id}: {self._said()}"

    def _said(self) -> str:
        ahead = self.cancelled_due_ms or ((self.due_at_ms,) if self.due_at_ms is not None else ())
        if self.outcome == "cancelled" and ahead:
            due = ", ".join(map(iso_of_ms, ahead))
            said = (
                f"cancelled (was due {due}"
                if len(ahead) == 1
                else (f"cancelled {len(ahead)} copies (were due {due}")
            )
            past = self.copies - len(ahead)
            return said + (f"; {past} more already due)" if past > 0 else ")")
        if self.outcome == "too late" and self.due_at_ms is not None:
            due = iso_of_ms(self.due_at_ms)
            if self.copies > 1:
                return (
                    f"too late (all {self.copies} copies due, the last {due}; "
                    "they may have been delivered)"
                )
            return f"too late (due {due}; it may have been delivered)"
        return "unknown (no record in the schedule journal)"


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


_KEY_KINDS = frozenset(("claimed", "done", "rescheduled", "cancelled"))
"""Kinds the key book follows besides keyed ``scheduled`` records."""
