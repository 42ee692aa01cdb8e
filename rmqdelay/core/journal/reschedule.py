"""Reschedule, as data: which copies move, and whether a fresh copy must be published.

A copy waiting in a fixed-TTL tier cannot be taken out, so a reschedule is a record
(``rescheduled``) naming the id's copies still ahead and the new due time:

- **later**: nothing else is sent. The worker receiving an old copy at its due time
  forwards it to the new one (:class:`~.keys.Verdict` ``forward``); no body is needed.
- **earlier**: the old copies would come out too late, so a fresh copy is published
  now, due at the new time, then the record (``fresh_copy``): workers drop the old
  copies. That needs the body, which the journal holds only with ``journal_bodies``.

The fresh copy goes out before the record: a crash between the two leaves a copy too
many (handled twice, at least once), never none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..clock import iso_of_ms
from .records import JournalRecord
from .view import ScheduleView

__all__ = ["RescheduleOutcome", "ReschedulePlan", "RescheduleResult", "plan_reschedule"]

RescheduleOutcome = Literal[
    "rescheduled", "handled", "cancelled", "due", "ignored", "replaced", "unknown", "needs body"
]


@dataclass(frozen=True)
class RescheduleResult:
    """What a reschedule found and did. ``previous_due_ms``: the latest copy's due time
    before; ``due_at_ms``: the new one (for ``rescheduled``)."""

    target: str
    """What the caller named: a message id or a key."""
    outcome: RescheduleOutcome
    message_id: str | None = None
    key: str | None = None
    destination: str | None = None
    previous_due_ms: int | None = None
    due_at_ms: int | None = None
    fresh_copy: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "outcome": self.outcome,
            "message_id": self.message_id,
            "key": self.key,
            "destination": self.destination,
            "previous_due_ms": self.previous_due_ms,
            "due_at_ms": self.due_at_ms,
            "fresh_copy": self.fresh_copy,
        }

    def describe(self) -> str:
        """The answer in words, as ``rmqdelay reschedule`` and the dashboard say it."""
        who = ""
        if self.message_id is not None and self.message_id != self.target:
            who = f" ({self.message_id})"
        before = iso_of_ms(self.previous_due_ms) if self.previous_due_ms is not None else "?"
        if self.outcome == "rescheduled" and self.due_at_ms is not None:
            how = (
                "a fresh copy was published" if self.fresh_copy else "the waiting copy is forwarded"
            )
            said = f"rescheduled{who} from {before} to {iso_of_ms(self.due_at_ms)} ({how})"
        else:
            said = {
                "handled": f"not rescheduled{who}: already handled",
                "cancelled": f"not rescheduled{who}: it was cancelled",
                "due": f"not rescheduled{who}: already due ({before}): handled or on its way",
                "ignored": f"not rescheduled{who}: that publish was ignored (its key was pending)",
                "replaced": f"not rescheduled{who}: it was replaced under its key",
                "needs body": f"not rescheduled{who}: an earlier time needs its body, and its "
                "journal record holds none (published with journal_bodies = false)",
            }.get(self.outcome, "unknown (no message with this id or key in the schedule journal)")
        return f"{self.target}: {said}"


@dataclass(frozen=True)
class ReschedulePlan:
    """The answer, the record to append (None: nothing to do), and for an earlier time
    the record whose body, headers and destination the fresh copy is made of (publish
    it, confirmed, before appending ``record``)."""

    result: RescheduleResult
    record: JournalRecord | None = None
    fresh_from: JournalRecord | None = None


def resolve(view: ScheduleView, target: str) -> str | None:
    """The message id ``target`` names: an id recorded, else the current message of a key."""
    if view.copies_of(target):
        return target
    current = view.keys.current(target)
    return None if current is None else current.message_id


def plan_reschedule(
    view: ScheduleView, target: str, new_due_ms: int, now_ms: int
) -> ReschedulePlan:
    """Plan moving ``target`` (an id or a key) to ``new_due_ms``."""
    message_id = resolve(view, target)
    if message_id is None:
        return ReschedulePlan(RescheduleResult(target, "unknown"))
    copies = view.copies_of(message_id)
    last = copies[-1] if copies else None
    key = last.key if last is not None else None
    base = RescheduleResult(
        target,
        "unknown",
        message_id,
        key,
        last.destination if last is not None else None,
        last.due_at_ms if last is not None else None,
    )
    if key is not None:
        status = view.keys.status(message_id, now_ms)
        if status != "scheduled":
            return ReschedulePlan(_with(base, status))
    ahead = [
        c for c in copies if c.due_at_ms > now_ms and not view.is_cancelled(message_id, c.due_at_ms)
    ]
    if not ahead:
        cancelled = bool(copies) and all(view.is_cancelled(message_id, c.due_at_ms) for c in copies)
        return ReschedulePlan(_with(base, "cancelled" if cancelled else "due"))
    latest = ahead[-1]
    earlier = new_due_ms < latest.due_at_ms
    if earlier and latest.body is None:
        return ReschedulePlan(_with(base, "needs body"))
    result = RescheduleResult(
        target,
        "rescheduled",
        message_id,
        key,
        latest.destination,
        latest.due_at_ms,
        new_due_ms,
        earlier,
    )
    record = JournalRecord(
        "rescheduled",
        message_id,
        latest.destination,
        new_due_ms,
        latest.attempt,
        recorded_at_ms=now_ms,
        cancels_due_ms=tuple(c.due_at_ms for c in ahead if c.due_at_ms != new_due_ms),
        key=key,
        fresh_copy=earlier,
    )
    return ReschedulePlan(result, record, latest if earlier else None)


def _with(base: RescheduleResult, outcome: RescheduleOutcome) -> RescheduleResult:
    return RescheduleResult(
        base.target, outcome, base.message_id, base.key, base.destination, base.previous_due_ms
    )
