"""Tombstones as a worker holds them: the cancelled copies it skips.

Pure: folding only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .records import CANCEL_MARGIN_MS, JournalRecord

__all__ = ["Tombstones"]

_SCHEDULED_KIND = b'"k":"scheduled"'
_LOOKUP_MAX = 16


def _dues(value: int | tuple[int, ...]) -> tuple[int, ...]:
    return (value,) if isinstance(value, int) else value


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

    def clear(self) -> None:
        """Forget everything, for a fold begun again from a checkpoint."""
        self.due_ms.clear()

    def restore(self, entry: Mapping[str, Any]) -> None:
        """A checkpoint's tombstone entry (``"s": "tomb"``; :mod:`.checkpoint`); others
        are not a worker's tombstones' concern."""
        if entry["s"] == "tomb":
            dues = tuple(sorted(int(due) for due in entry["due"]))
            self.due_ms[str(entry["id"])] = dues[0] if len(dues) == 1 else dues

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
