"""Keys, generations and moves: what the schedule journal's order decides.

A keyed publish (``key="order-42-timeout"``) records its key with its message. While a
message with that key is *pending* (its generation's winner is not cancelled, not
handled, and due after the new record was written), a second publish with the key is,
by the caller's choice, ``ignore``-d (its copies are dropped) or ``replace``-s the
pending one (the old copies are dropped, the new message starts the next generation).

Every reader (publishers answering a keyed publish, workers before a handler runs,
``scheduled list``) folds the same records in the stream's order, and each decision
depends on the records alone (the writer's ``recorded_at_ms``, never the reader's
clock), so they all agree. A worker takes a winner's copy with a ``claimed`` record
and handles it only when its own claim is the first for that copy; ``done`` after the
handler succeeded makes any later copy of the generation a duplicate. A redelivered
copy takes over a claim whose claimer never wrote ``done`` (it may have died), unless
that claim's copy is being handled in the same worker. A
``rescheduled`` record moves an id's copies to a new due time: a worker receiving an
older copy drops it (the rescheduler published a fresh copy) or forwards it.

Where it stops, said in the README: a worker that does not read the journal enforces
nothing; publishers' clocks decide ``pending``; a handler that ran but whose ``done`` was
never written (the worker died) runs again for a redelivered copy (at least once).

Pure: no I/O. The fold is idempotent: reading a stretch of records twice, as a reader
that restarts from a timestamp does, changes nothing.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .generations import Generation, Loser, Move, book_entries, restore_entry
from .records import CANCEL_MARGIN_MS, JournalRecord

__all__ = [
    "RECURRING_KEY_PREFIX",
    "UNRECORDED_GRACE_MS",
    "Action",
    "KeyBook",
    "KeyStatus",
    "KeyedOutcome",
    "Verdict",
    "recurring_key",
]

UNRECORDED_GRACE_MS = 30_000
"""How long after its due time a keyed copy whose record has not been read is waited
for: a message and its record go out in one confirm window, and a publish whose record
failed raised to its caller (who sends it again)."""

Action = Literal["handle", "claim", "forward", "drop", "wait"]
KeyedOutcome = Literal["scheduled", "ignored", "replaced"]
KeyStatus = Literal["scheduled", "due", "handled", "cancelled", "ignored", "replaced", "unknown"]


RECURRING_KEY_PREFIX = "recurring:"
"""What every key of a recurring schedule's occurrence starts with."""


def recurring_key(name: str, occurrence_ms: int) -> str:
    """The key of one occurrence of a recurring schedule: taken by the first publish."""
    return f"{RECURRING_KEY_PREFIX}{name}@{occurrence_ms}"


@dataclass(frozen=True)
class Verdict:
    """What a worker does with a delivery before (or instead of) its handler."""

    action: Action
    reason: str = ""
    generation: Generation | None = None
    forward_due_ms: int | None = None


_HANDLE = Verdict("handle")


@dataclass
class KeyBook:
    """The fold of keyed records, claims, ``done`` and moves, in journal order."""

    generations: dict[str, list[Generation]] = field(default_factory=dict)
    """Per key, its generations seen, oldest first."""
    by_id: dict[str, Generation | Loser] = field(default_factory=dict)
    moves: dict[str, Move] = field(default_factory=dict)

    # ------------------------------------------------------------------ the fold

    def add(self, record: JournalRecord) -> None:
        kind = record.kind
        if kind == "scheduled":
            if record.key is not None:
                self._scheduled(record, record.key)
        elif kind == "cancelled":
            entry = self.by_id.get(record.message_id)
            if isinstance(entry, Generation) and entry.due_ms in record.named_due_times():
                entry.cancelled = True
        elif kind == "claimed":
            entry = self.by_id.get(record.message_id)
            if isinstance(entry, Generation):
                entry.claims.setdefault(record.due_at_ms, (record.worker, record.claim_id))
                entry.claimed.setdefault(record.attempt, record.due_at_ms)
        elif kind == "done":
            entry = self.by_id.get(record.message_id)
            if isinstance(entry, Generation):
                entry.done = True
        elif kind == "rescheduled":
            self._moved(record)

    def extend(self, records: Iterable[JournalRecord]) -> KeyBook:
        for record in records:
            self.add(record)
        return self

    def _scheduled(self, record: JournalRecord, key: str) -> None:
        message_id = record.message_id
        entry = self.by_id.get(message_id)
        if entry is not None:
            if isinstance(entry, Generation):
                move = self.moves.get(message_id)
                stale = move is not None and record.due_at_ms in move.old_due_ms
                if not stale:
                    entry.due_ms = record.due_at_ms  # a retry, forward or resend
                    entry.last_ms = max(entry.last_ms, record.due_at_ms)
                if entry.cancelled and record.due_at_ms == entry.due_ms:
                    entry.cancelled = False  # recorded again after its tombstone
            elif record.due_at_ms > entry.due_ms:  # a later copy of a loser: dropped too
                self.by_id[message_id] = replace(entry, due_ms=record.due_at_ms)
            return
        history = self.generations.setdefault(key, [])
        current = history[-1] if history else None
        pending = current is not None and current.pending(record.recorded_at_ms)
        if current is not None and pending and record.on_conflict is None:
            # A retry or forward (a first publish always says ignore or replace) of a
            # generation this reader no longer holds: settled and forgotten while its
            # handling ran late. It goes on; it neither loses to the key nor takes it.
            due = record.due_at_ms
            continued = Generation(
                key, 0, message_id, due, record.recorded_at_ms, record.destination, last_ms=due
            )
            history.insert(len(history) - 1, continued)
            self.by_id[message_id] = continued
            return
        if current is not None and pending and record.on_conflict != "replace":
            self.by_id[message_id] = Loser(
                key, message_id, current.message_id, current.due_ms, record.due_at_ms
            )
            return
        if current is not None and pending:
            current.superseded_by = message_id
        generation = Generation(
            key,
            (current.number + 1) if current is not None else 1,
            message_id,
            record.due_at_ms,
            record.recorded_at_ms,
            record.destination,
            last_ms=record.due_at_ms,
        )
        history.append(generation)
        self.by_id[message_id] = generation

    def _moved(self, record: JournalRecord) -> None:
        message_id = record.message_id
        before = self.moves.get(message_id)
        old = set(record.cancels_due_ms)
        if before is not None:
            old |= before.old_due_ms | {before.due_ms}
        old.discard(record.due_at_ms)
        self.moves[message_id] = Move(record.due_at_ms, frozenset(old), record.fresh_copy)
        entry = self.by_id.get(message_id)
        if isinstance(entry, Generation):
            entry.due_ms = record.due_at_ms
            entry.last_ms = max(entry.last_ms, record.due_at_ms)

    # ------------------------------------------------------------------ questions

    def current(self, key: str) -> Generation | None:
        history = self.generations.get(key)
        return history[-1] if history else None

    def pending(self, key: str, now_ms: int) -> Generation | None:
        """The generation holding ``key`` now, if one does."""
        current = self.current(key)
        return current if current is not None and current.pending(now_ms) else None

    def outcome(self, message_id: str) -> tuple[KeyedOutcome, Generation | Loser | None]:
        """What a keyed publish of ``message_id`` came to, once its record was read:
        ``scheduled`` (it won a generation), ``ignored`` (it lost: the Loser names the
        pending winner), or ``replaced`` (it won and superseded the pending one)."""
        entry = self.by_id.get(message_id)
        if entry is None:
            return "scheduled", None
        if isinstance(entry, Loser):
            return "ignored", entry
        if self.replaced(entry) is not None:
            return "replaced", entry
        return "scheduled", entry

    def replaced(self, generation: Generation) -> Generation | None:
        """The generation ``generation`` took the place of (a ``replace`` publish), if any."""
        for earlier in self.generations.get(generation.key, ()):
            if earlier.superseded_by == generation.message_id:
                return earlier
        return None

    def status(self, message_id: str, now_ms: int) -> KeyStatus:
        """Where a keyed id stands: for a reschedule's or a cancel's answer."""
        entry = self.by_id.get(message_id)
        if entry is None:
            return "unknown"
        if isinstance(entry, Loser):
            return "ignored"
        if entry.superseded_by is not None:
            return "replaced"
        if entry.cancelled:
            return "cancelled"
        if entry.done:
            return "handled"
        return "scheduled" if entry.due_ms > now_ms else "due"

    def pending_keys(self, now_ms: int) -> int:
        """How many keys a pending message holds now (the ``rmqdelay_keys_pending`` gauge;
        safe to call from a metrics thread while the fold goes on)."""
        return sum(1 for history in list(self.generations.values()) if history[-1].pending(now_ms))

    def hides(self, message_id: str) -> bool:
        """Whether the id's copies will never be handled: it lost to a pending message with
        its key (``ignore``), or a ``replace`` took its place."""
        entry = self.by_id.get(message_id)
        return isinstance(entry, Loser) or (entry is not None and entry.superseded_by is not None)

    def stale(self, message_id: str, due_ms: int | None) -> Move | None:
        """The move that makes this copy stale (any id, keyed or not), if one does."""
        move = self.moves.get(message_id)
        if move is None or due_ms is None or due_ms not in move.old_due_ms:
            return None
        return move

    def verdict(
        self,
        message_id: str,
        due_ms: int | None,
        key: str | None,
        *,
        redelivered: bool,
        now_ms: int,
        claim_id: str = "",
        held_here: Container[str] = (),
        attempt: int = 1,
    ) -> Verdict:
        """What a worker does with this delivery; ``claim_id`` is the claim it wrote for
        it and read back, if it did; ``held_here`` the claims whose copy this worker is
        handling now (a redelivered copy waits for them: its claimer is alive). One
        claim decides for all copies of an ``attempt`` (:meth:`Generation.claim_for`).

        An unkeyed delivery is only ever moved (``forward`` or ``drop``) or handled.
        """
        move = self.stale(message_id, due_ms)
        if move is not None:
            if move.fresh_copy:
                return Verdict("drop", "rescheduled")
            return Verdict("forward", "rescheduled", forward_due_ms=move.due_ms)
        if key is None:
            return _HANDLE
        entry = self.by_id.get(message_id)
        if entry is None:
            if due_ms is not None and now_ms > due_ms + UNRECORDED_GRACE_MS:
                return Verdict("drop", "unrecorded")
            return Verdict("wait", "unrecorded")
        if isinstance(entry, Loser):
            return Verdict("drop", "ignored")
        if entry.superseded_by is not None:
            return Verdict("drop", "replaced", entry)
        if entry.cancelled:
            return Verdict("drop", "cancelled", entry)
        if entry.done:
            return Verdict("drop", "duplicate", entry)
        copy = entry.due_ms if due_ms is None else due_ms
        claim = entry.claim_for(copy, attempt)
        if claim is None:
            return Verdict("claim", "", entry)
        if claim_id and claim[1] == claim_id:
            return Verdict("handle", "", entry)
        if redelivered:
            if claim[1] in held_here:
                # Another copy of this generation (a duplicate publish) claimed it in
                # this worker and its handler runs: its done record, or its failure, decides.
                return Verdict("wait", "claimed here", entry)
            return Verdict("handle", "taken over", entry)  # its claimer may have died
        return Verdict("drop", "claimed elsewhere", entry)

    # ------------------------------------------------------------------ memory

    def expire(
        self, now_ms: int, margin_ms: int = CANCEL_MARGIN_MS, named: Container[str] = ()
    ) -> int:
        """Forget what can no longer matter: generations and losers whose due time plus
        ``margin_ms`` has passed (a key's last generation is kept while it may be
        pending for a record written with a slow clock), and moves of such ids.
        ``named``: ids a tombstone still names a copy of (the view's); their entries are
        kept, since that copy may be recorded again, and a replaced or ignored id must
        not come back as a new generation. Returns how many ids were forgotten."""
        cutoff = now_ms - margin_ms
        forgotten = 0
        for key, history in list(self.generations.items()):
            keep = [g for g in history if g.settles_ms >= cutoff or g.message_id in named]
            if keep and keep[-1] is not history[-1]:
                keep.append(history[-1])
            for generation in history:
                if generation not in keep:
                    self.by_id.pop(generation.message_id, None)
                    self.moves.pop(generation.message_id, None)
                    forgotten += 1
            if keep:
                self.generations[key] = keep
            else:
                del self.generations[key]
        for message_id, entry in list(self.by_id.items()):
            if isinstance(entry, Loser) and entry.due_ms < cutoff and message_id not in named:
                del self.by_id[message_id]
                forgotten += 1
        for message_id, move in list(self.moves.items()):
            # an earlier time: the old copies still come out at theirs, to be dropped
            if move.settles_ms < cutoff and message_id not in self.by_id:
                del self.moves[message_id]
        return forgotten

    # ------------------------------------------------------------------ checkpoints

    def clear(self) -> None:
        """Forget everything, for a fold begun again from a checkpoint."""
        self.generations.clear()
        self.by_id.clear()
        self.moves.clear()

    def entries(self) -> Iterator[dict[str, Any]]:
        """The book as checkpoint entries (:mod:`.generations`); :meth:`restore` takes
        them back."""
        return book_entries(self.generations, self.by_id, self.moves)

    def restore(self, entry: Mapping[str, Any]) -> None:
        """Take back one entry of :meth:`entries` (in their order)."""
        restore_entry(entry, self.generations, self.by_id, self.moves)

    def __len__(self) -> int:
        return len(self.by_id)
