"""The state a checkpoint writes down (:class:`JournalState`), the writer's merge of
the previous checkpoint with what came since (:class:`Merge`), and a reader's restore of
the parts it needs (:class:`Restorer`). The codec and the pointer are :mod:`.checkpoint`'s.

Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .checkpoint import (
    SETTLE_MS,
    Section,
    body_entry,
    decode_copies,
    decode_entries,
    encode_copy,
    encode_entries,
    parts,
    with_body,
)
from .records import JournalRecord
from .recurring import RecurringBook
from .view import ScheduleView

__all__ = ["JournalState", "Merge", "Restorer", "copies_merge", "write_sections"]


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
    only the parts that name one of them; ``hold``: which of those to keep; ``lines``:
    which copies' lines to decode at all (a purge's byte-level superset of what it
    selects). A worker reads no copy at all. Bodies join the copies kept."""

    def __init__(
        self,
        state: JournalState,
        *,
        ids: Iterable[str] | None = None,
        hold: Callable[[JournalRecord], bool] | None = None,
        lines: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.state = state
        self.ids = None if ids is None else set(ids)
        self.hold = hold
        self.lines = lines
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
        elif self.lines is not None:  # the lines that may be wanted, the rest undecoded
            test = self.lines
            kept = b"\n".join([line for line in body.split(b"\n") if test(line)])
            found = decode_copies(kept) if kept else []
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
