"""What a key book holds: generations, losers and moves, and their checkpoint form.

The data of :mod:`.keys`' fold, apart from the fold itself, so that a checkpoint's
entries (written by :func:`book_entries`, taken back by :func:`restore_entry`) sit beside
the types they carry. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Generation", "Loser", "Move", "book_entries", "restore_entry"]


@dataclass
class Generation:
    """One generation of a key: the message that won it, and what became of it."""

    key: str
    number: int
    """Counted by this reader from the oldest record it read: for people, not identity.
    A generation *is* its winner's message id. 0: a retry or forward whose first record
    this reader no longer holds."""
    message_id: str
    due_ms: int
    """The winner's current due time: a retry, forward or reschedule moves it."""
    recorded_at_ms: int
    destination: str = ""
    cancelled: bool = False
    superseded_by: str | None = None
    """The id of the ``replace`` publish that took its place while it was pending."""
    done: bool = False
    claims: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Per copy (its due time), the first claim read: (worker, claim id)."""
    last_ms: int = 0
    """The latest due time any copy of it was recorded with: until then a copy may come
    (a record written late can set :attr:`due_ms` earlier than a retry's copy)."""
    claimed: dict[int, int] = field(default_factory=dict)
    """Per attempt, the copy its first claim was for. A resend of a copy whose time has
    passed (a recurring chain's restarted worker publishes the next occurrence again) is
    due when sent, not at the first copy's time: one attempt, copies at two due times,
    and the first claim of the attempt decides for both. A retry is another attempt."""

    def claim_for(self, copy_ms: int, attempt: int) -> tuple[str, str] | None:
        """The claim that decides for this copy: its attempt's first, else its own."""
        return self.claims.get(self.claimed.get(attempt, copy_ms))

    @property
    def settles_ms(self) -> int:
        """When its last copy is due: after that (and a margin) it can be forgotten."""
        return max(self.due_ms, self.last_ms)

    def pending(self, at_ms: int) -> bool:
        """Whether it still holds its key at ``at_ms`` (a record's own time)."""
        return (
            not self.cancelled
            and self.superseded_by is None
            and not self.done
            and self.due_ms > at_ms
        )


@dataclass(frozen=True)
class Loser:
    """A keyed publish that lost: ``ignored`` while ``winner_id`` was pending."""

    key: str
    message_id: str
    winner_id: str
    winner_due_ms: int
    """The pending winner's due time when this publish lost to it."""
    due_ms: int
    """This publish's own due time (its latest copy's): its copies come out then, and
    are dropped."""


@dataclass(frozen=True)
class Move:
    """An id's copies moved to ``due_ms``: copies due at any of ``old_due_ms`` are stale."""

    due_ms: int
    old_due_ms: frozenset[int]
    fresh_copy: bool

    @property
    def settles_ms(self) -> int:
        """When the last copy it speaks of is due: moved to an earlier time, the old
        copies still come out at theirs, and must be recognised as stale then."""
        return max(self.due_ms, max(self.old_due_ms, default=self.due_ms))


def book_entries(
    generations: Mapping[str, list[Generation]],
    by_id: Mapping[str, Generation | Loser],
    moves: Mapping[str, Move],
) -> Iterator[dict[str, Any]]:
    """A key book as checkpoint entries (:mod:`.checkpoint`): each generation, oldest
    first per key, then the losers and the moves; :func:`restore_entry` takes them back."""
    for history in generations.values():
        for g in history:
            entry: dict[str, Any] = {
                "s": "gen",
                "key": g.key,
                "n": g.number,
                "id": g.message_id,
                "due": g.due_ms,
                "t": g.recorded_at_ms,
                "d": g.destination,
            }
            if g.cancelled:
                entry["x"] = True
            if g.superseded_by is not None:
                entry["sup"] = g.superseded_by
            if g.done:
                entry["done"] = True
            if g.claims:
                entry["cl"] = [[due, w, c] for due, (w, c) in g.claims.items()]
            if g.claimed:
                entry["ca"] = [[attempt, due] for attempt, due in g.claimed.items()]
            if g.last_ms > g.due_ms:
                entry["last"] = g.last_ms
            yield entry
    for held in by_id.values():
        if isinstance(held, Loser):
            yield {
                "s": "lost",
                "key": held.key,
                "id": held.message_id,
                "w": held.winner_id,
                "wd": held.winner_due_ms,
                "due": held.due_ms,
            }
    for message_id, move in moves.items():
        yield {
            "s": "move",
            "id": message_id,
            "due": move.due_ms,
            "old": sorted(move.old_due_ms),
            "f": move.fresh_copy,
        }


def restore_entry(
    entry: Mapping[str, Any],
    generations: dict[str, list[Generation]],
    by_id: dict[str, Generation | Loser],
    moves: dict[str, Move],
) -> None:
    """Take back one entry of :func:`book_entries` (in their order)."""
    kind = entry["s"]
    if kind == "gen":
        g = Generation(
            str(entry["key"]),
            int(entry["n"]),
            str(entry["id"]),
            int(entry["due"]),
            int(entry["t"]),
            str(entry.get("d", "")),
            bool(entry.get("x", False)),
            entry.get("sup"),
            bool(entry.get("done", False)),
            {int(due): (str(w), str(c)) for due, w, c in entry.get("cl", ())},
            int(entry.get("last", entry["due"])),
            {int(attempt): int(due) for attempt, due in entry.get("ca", ())},
        )
        generations.setdefault(g.key, []).append(g)
        by_id[g.message_id] = g
    elif kind == "lost":
        loser = Loser(
            str(entry["key"]),
            str(entry["id"]),
            str(entry["w"]),
            int(entry["wd"]),
            int(entry["due"]),
        )
        by_id[loser.message_id] = loser
    elif kind == "move":
        old = frozenset(int(due) for due in entry["old"])
        moves[str(entry["id"])] = Move(int(entry["due"]), old, bool(entry["f"]))
