"""Selective purge: cancel every scheduled message a filter selects, in one journal read.

A message matches when one of its copies still ahead (not cancelled, not hidden under
its key) matches every filter given; it is then cancelled whole, every copy, as
``cancel ID`` would (:func:`~.view.plan_cancels`): a retry, a copy sent again or a
rescheduled message has no copy left behind. A recurring schedule's occurrences are
left alone (cancelling one would end its chain unseen): they are counted, and
``rmqdelay recurring remove`` is the way. What is counted is exactly what is cancelled:
the count, the confirmation and the tombstones come from the same read.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..clock import iso_of_ms, now_ms
from ..layout import Layout
from .keys import RECURRING_KEY_PREFIX
from .reading import Clock, JournalFlow, append, load
from .records import JournalRecord
from .view import plan_cancels

__all__ = ["PurgeResult", "Selection", "purge"]


def _text(value: object) -> str:
    """A header's value as ``--header k=v`` compares it: text as it is, bytes decoded,
    numbers as Python writes them, anything else as JSON writes it (``true``,
    ``null``, ``{"a":1}``): the journal's own text of it."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return str(value)
    return json.dumps(value, separators=(",", ":"), default=str)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.@-]+")
"""What a JSON writer may escape or space differently: anything but letters, digits
and ``_.@-`` (Go escapes ``<>&``, PHP ``/``, Python every non-ASCII character; a
table's value may be written with a space after each ``:`` and ``,``)."""


def _fragments(text: str) -> tuple[bytes, ...]:
    """The runs of ``text`` every JSON writer leaves as they are: each is in a line that
    holds ``text``, however that line was written."""
    return tuple(part.encode() for part in _UNSAFE.split(text) if part)


@dataclass(frozen=True)
class Selection:
    """What a purge selects: every filter given must match (an empty one selects all)."""

    destination: str | None = None
    due_before_ms: int | None = None
    """Due strictly before."""
    due_after_ms: int | None = None
    """Due strictly after."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Each header present with this value (compared as text, :func:`_text`)."""
    key_prefix: str | None = None
    """Keyed messages whose key starts with this."""

    def matches(self, record: JournalRecord) -> bool:
        due = record.due_at_ms
        if self.destination is not None and record.destination != self.destination:
            return False
        if self.due_before_ms is not None and due >= self.due_before_ms:
            return False
        if self.due_after_ms is not None and due <= self.due_after_ms:
            return False
        if self.key_prefix is not None and (
            record.key is None or not record.key.startswith(self.key_prefix)
        ):
            return False
        got = record.headers
        return all(k in got and _text(got[k]) == v for k, v in self.headers.items())

    def lines(self) -> Callable[[bytes], bool] | None:
        """A byte-level test of a copy's journal line that every copy :meth:`matches`
        passes (a superset: what it lets by is decoded and tested): a purge of a tenth
        of a million decodes a tenth. None when no filter can be seen in the bytes."""
        # a table's or list's text is JSON's, whose escapes another writer may not share
        values = [v for v in self.headers.values() if not v.startswith(("{", "["))]
        texts = [*self.headers.keys(), *values]
        texts += [t for t in (self.destination, self.key_prefix) if t is not None]
        needles = [part for text in texts for part in _fragments(text)]
        if not needles:
            return None
        return lambda line: all(part in line for part in needles)

    @property
    def empty(self) -> bool:
        return self == Selection()

    def to_json(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "due_before_ms": self.due_before_ms,
            "due_after_ms": self.due_after_ms,
            "headers": dict(self.headers),
            "key_prefix": self.key_prefix,
        }


@dataclass(frozen=True)
class PurgeResult:
    """What a purge selected and did. ``messages`` ids matched, ``copies`` of them still
    ahead; ``cancelled`` of the ids got their tombstone (0 on a dry run or when not
    confirmed); ``by_destination`` the matched ids per destination; ``recurring`` the
    occurrences of recurring schedules that matched and were left alone."""

    selection: Selection
    messages: int
    copies: int
    cancelled: int
    by_destination: Mapping[str, int]
    recurring: int = 0
    dry_run: bool = False
    confirmed: bool = True
    soonest_ms: int | None = None
    latest_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "copies": self.copies,
            "cancelled": self.cancelled,
            "dry_run": self.dry_run,
            "confirmed": self.confirmed,
            "by_destination": dict(self.by_destination),
            "recurring_left": self.recurring,
            "soonest_due_ms": self.soonest_ms,
            "latest_due_ms": self.latest_ms,
            "selection": self.selection.to_json(),
        }

    def describe(self) -> str:
        """The result in words, as ``rmqdelay cancel`` and the dashboard say it."""
        span = ""
        if self.soonest_ms is not None and self.latest_ms is not None:
            span = f", due {iso_of_ms(self.soonest_ms)} to {iso_of_ms(self.latest_ms)}"
        where = ", ".join(f"{d}: {n:,}" for d, n in sorted(self.by_destination.items()))
        found = f"{self.messages:,} message(s) ({self.copies:,} copies{span})"
        found += f" [{where}]" if where else ""
        if self.dry_run:
            said = f"would cancel {found}"
        elif not self.confirmed:
            said = f"not confirmed: cancelled none of {found}"
        else:
            said = f"cancelled {self.cancelled:,} of {found}"
        if self.recurring:
            said += (
                f"; {self.recurring:,} occurrence(s) of recurring schedules left alone "
                "(`rmqdelay recurring remove NAME` ends a schedule)"
            )
        return said


def purge(
    layout: Layout,
    selection: Selection,
    *,
    dry_run: bool = False,
    confirm: Callable[[PurgeResult], bool] | None = None,
    timeout: float = 30.0,
    progress: Callable[[int], None] | None = None,
    clock: Clock = now_ms,
) -> JournalFlow[PurgeResult]:
    """Cancel every message ``selection`` selects: one read of the journal (the
    checkpoint's copies without their bodies, those :meth:`Selection.lines` lets by
    decoded, and the tail), then the tombstones, confirmed. ``confirm`` sees the count
    before anything is written; False (or ``dry_run``) writes nothing."""
    loaded = yield from load(
        layout,
        copies=True,
        bodies=False,
        timeout=timeout,
        clock=clock,
        progress=progress,
        copy_lines=selection.lines(),
    )
    view = loaded.state.view
    now = clock()
    chosen = [
        r
        for r in view.pending(
            now, destination=selection.destination, due_before_ms=selection.due_before_ms
        )
        if selection.matches(r)
    ]
    recurring = {r.message_id for r in chosen if (r.key or "").startswith(RECURRING_KEY_PREFIX)}
    by_id = {r.message_id: r for r in chosen if r.message_id not in recurring}
    results, tombstones = plan_cancels(view, by_id, now)
    found = PurgeResult(
        selection,
        messages=len(by_id),
        copies=sum(len(r.cancelled_due_ms) for r in results if r.outcome == "cancelled"),
        cancelled=0,
        by_destination=dict(Counter(r.destination for r in by_id.values())),
        recurring=len(recurring),
        dry_run=dry_run,
        soonest_ms=min((r.due_at_ms for r in by_id.values()), default=None),
        latest_ms=max((r.due_at_ms for r in by_id.values()), default=None),
    )
    if dry_run or not tombstones:
        return found
    if confirm is not None and not confirm(found):
        return replace(found, confirmed=False)
    yield from append(layout, tombstones)
    return replace(found, cancelled=len(tombstones))
