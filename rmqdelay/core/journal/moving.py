"""Moving what waits to another cluster (``rmqdelay move``), pure: what becomes of each
message taken from the old cluster's queues, and the report.

A message goes on to the new cluster with its own due time, id, headers, body and
attempt, and its key, unless the old cluster's journal says no worker would handle it
(cancelled, lost to its key, superseded by a reschedule), or the new cluster's journal
holds its copy already (moved by a run that was cut off before its ack here: once in
effect, not twice). A copy rescheduled later goes at its new time.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..messages import ATTEMPT, DESTINATION, DUE_AT, KEY, header_int
from .keys import RECURRING_KEY_PREFIX
from .view import ScheduleView

__all__ = ["MoveReport", "Moving", "decide", "request_of"]

Action = Literal["move", "skip", "moved", "recurring"]
DROPPED = frozenset(("ignored", "replaced", "cancelled", "duplicate", "rescheduled"))
"""A key filter's or a reschedule's reasons for a copy no worker would handle."""


@dataclass(frozen=True)
class Moving:
    """What becomes of one message: ``move`` it (due at ``due_ms``), ``skip`` it (acked
    here, not sent: ``reason``), ``moved`` (its copy is there already), or ``recurring``
    (an occurrence: moved as it is, with its chain, which carries its schedule over)."""

    action: Action
    destination: str
    message_id: str
    due_ms: int
    key: str | None = None
    reason: str = ""


def decide(
    old: ScheduleView,
    there: Mapping[str, Collection[int]],
    headers: Mapping[str, Any],
    message_id: str,
    now_ms: int,
) -> Moving:
    """What to do with a message of the old cluster, by its headers and both journals
    (``there``: the due times of each id's copies the new cluster's journal holds; one
    due already when it moved went at once, so any copy of its id there is it)."""
    destination = str(headers.get(DESTINATION) or "")
    due = header_int(headers, DUE_AT, now_ms)
    raw_key = headers.get(KEY)
    key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
    key = key if isinstance(key, str) and key else None
    if not destination:
        return Moving("skip", destination, message_id, due, key, "no rmqdelay-destination")
    if old.is_cancelled(message_id, due):
        return Moving("skip", destination, message_id, due, key, "cancelled")
    verdict = old.keys.verdict(message_id, due, key, redelivered=False, now_ms=now_ms)
    if verdict.action == "forward" and verdict.forward_due_ms is not None:
        due = verdict.forward_due_ms
    elif verdict.action == "drop" and verdict.reason in DROPPED:
        return Moving("skip", destination, message_id, due, key, verdict.reason)
    dues = there.get(message_id, ())
    if due in dues or (due <= now_ms and dues):
        return Moving("moved", destination, message_id, due, key)
    if key is not None and key.startswith(RECURRING_KEY_PREFIX):
        return Moving("recurring", destination, message_id, due, key)
    return Moving("move", destination, message_id, due, key)


def request_of(
    moving: Moving, body: bytes, headers: Mapping[str, Any], properties: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``publish_many`` request that sends ``moving`` on: its own id, due time,
    attempt, key (first publish wins: a copy sent twice is ignored there), body, the
    headers it was published with and its AMQP properties."""
    from ..clock import datetime_of_ms

    kept = {k: v for k, v in headers.items() if k not in (DUE_AT, DESTINATION, KEY)}
    kept[ATTEMPT] = max(1, header_int(headers, ATTEMPT, 1))
    request: dict[str, Any] = {
        "destination": moving.destination,
        "body": body,
        "at": datetime_of_ms(moving.due_ms),
        "message_id": moving.message_id,
        "headers": kept,
        **{k: v for k, v in properties.items() if v is not None},
    }
    if moving.key is not None:
        request |= {"key": moving.key, "on_conflict": "ignore"}
    return request


@dataclass
class MoveReport:
    """What a move did, counted: ``moved`` sent there and confirmed, then acked here;
    ``already`` found there (a cut-off run's), acked here; ``skipped`` by reason;
    ``recurring`` schedules carried over; ``left`` what stayed (and why)."""

    moved: int = 0
    already: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    recurring: list[str] = field(default_factory=list)
    by_destination: dict[str, int] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)
    dry_run: bool = False
    waiting: int = 0
    """On a dry run: the messages waiting in the old cluster's queues."""
    taken: int = 0
    """Messages taken from the old cluster (and acked there)."""

    def count(self, moving: Moving) -> None:
        self.taken += 1
        if moving.action == "move":
            self.moved += 1
            self.by_destination[moving.destination] = (
                self.by_destination.get(moving.destination, 0) + 1
            )
        elif moving.action == "moved":
            self.already += 1
        elif moving.action == "skip":
            self.skipped[moving.reason] = self.skipped.get(moving.reason, 0) + 1

    def to_json(self) -> dict[str, Any]:
        return {
            "moved": self.moved,
            "already_there": self.already,
            "skipped": dict(self.skipped),
            "recurring": list(self.recurring),
            "by_destination": dict(self.by_destination),
            "left": list(self.left),
            "dry_run": self.dry_run,
            "waiting": self.waiting,
        }

    def describe(self) -> str:
        if self.dry_run:
            return f"would move the {self.waiting:,} message(s) waiting (dry run: nothing taken)"
        said = f"moved {self.moved:,} message(s)"
        if self.already:
            said += f"; {self.already:,} were there already (a run cut off before its acks)"
        if self.skipped:
            why = ", ".join(f"{n:,} {reason}" for reason, n in sorted(self.skipped.items()))
            said += f"; left behind, as no worker would handle them: {why}"
        if self.recurring:
            said += f"; recurring schedules carried over: {', '.join(self.recurring)}"
        if self.left:
            said += f"; not moved: {'; '.join(self.left)}"
        return said
