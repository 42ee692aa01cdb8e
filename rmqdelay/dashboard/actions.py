"""The dashboard's actions, each one call of the publishers' or the parked queue's own
API (nothing here decides what a cancel or a replay does), and each answer in words.

Every action returns an :class:`Outcome`: whether it did what was asked, a sentence
for the page (the result's own words, which the CLI prints too), and the API's JSON.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from ..core.clock import datetime_of_ms, iso_of_ms, now_ms
from ..core.journal.recurring import RecurringResult
from ..settings import Settings

__all__ = [
    "Job",
    "Jobs",
    "Outcome",
    "cancel",
    "cancel_matching",
    "reschedule",
    "switch_recurring",
    "which",
]


@dataclass(frozen=True)
class Outcome:
    ok: bool
    text: str
    data: dict[str, Any] = field(default_factory=dict)
    form: dict[str, str] | None = None
    """What the page offers next: these fields posted again to the same action (a
    count's confirmation), with the button ``form["button"]``."""

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "text": self.text, **self.data}


def cancel(settings: Settings, message_id: str) -> Outcome:
    """Cancel every copy of ``message_id`` (``rmqdelay cancel``)."""
    from ..amqp.publisher import Publisher

    with Publisher(settings) as publisher:
        (result,) = publisher.cancel(message_id)
    return Outcome(result.outcome == "cancelled", result.describe(), result.to_json())


def cancel_matching(settings: Settings, fields: dict[str, str], expected: int | None) -> Outcome:
    """``rmqdelay cancel`` by filter: counted first (``expected`` None), with a form to
    confirm; then cancelled, unless more match now than the count shown."""
    from ..amqp.publisher import Publisher

    filters = filters_of(fields)
    with Publisher(settings) as publisher:
        result = publisher.cancel_matching(
            **filters,
            dry_run=expected is None,
            confirm=lambda found: expected is not None and found.messages <= expected,
        )
    data = result.to_json()
    if expected is None:
        if not result.messages:
            return Outcome(True, result.describe(), data)
        times = {k: v.isoformat() for k in ("due_before", "due_after") if (v := filters[k])}
        # the times as counted: "2h" again at the confirmation would be another time
        again = {**fields, **times, "expected": str(result.messages)}
        button = f"Cancel these {result.messages:,} messages"
        return Outcome(True, result.describe(), data, {**again, "button": button})
    if not result.confirmed:
        text = (
            f"{result.messages:,} messages match now, more than the {expected:,} counted: "
            "nothing cancelled; count again"
        )
        return Outcome(False, text, data)
    return Outcome(True, result.describe(), data)


FILTERS = ("destination", "due_before", "due_after", "headers", "key_prefix")
"""The fields of the *Cancel matching* form, as ``rmqdelay cancel`` names its filters."""


def filters_of(fields: dict[str, str]) -> dict[str, Any]:
    """``cancel_matching``'s filters from the form: times as ``--due-before`` reads
    them, headers one ``KEY=VALUE`` a line; ValueError naming the field."""
    from .pages import time_ms

    def text(name: str) -> str | None:
        return fields.get(name, "").strip() or None

    headers = {}
    for line in (fields.get("headers") or "").splitlines():
        if line.strip():
            name, equals, value = line.strip().partition("=")
            if not equals or not name:
                raise ValueError(f"headers: write each KEY=VALUE, got {line.strip()!r}")
            headers[name] = value
    before, after = (
        time_ms(text("due_before"), "due_before"),
        time_ms(text("due_after"), "due_after"),
    )
    return {
        "destination": text("destination"),
        "due_before": None if before is None else datetime_of_ms(before),
        "due_after": None if after is None else datetime_of_ms(after),
        "headers": headers,
        "key_prefix": fields.get("key_prefix") or None,
    }


def reschedule(settings: Settings, message_id: str, at: datetime | None) -> Outcome:
    """Move ``message_id`` to ``at``, or run it now when None (``rmqdelay reschedule``;
    the page works out "+1h" from the schedule it shows)."""
    from ..amqp.publisher import Publisher

    with Publisher(settings) as publisher:
        if at is None:
            result = publisher.reschedule(message_id, delay=0)
        else:
            result = publisher.reschedule(message_id, at=at)
    return Outcome(result.outcome == "rescheduled", result.describe(), result.to_json())


def switch_recurring(settings: Settings, name: str, op: Literal["pause", "resume"]) -> Outcome:
    """Pause or resume a recurring schedule (``rmqdelay recurring pause|resume``)."""
    from ..amqp.publisher import Publisher

    with Publisher(settings) as publisher:
        if op == "pause":
            result = publisher.pause_recurring(name)
        else:
            result = publisher.resume_recurring(name)
    return Outcome(result.outcome in ("paused", "resumed"), result.describe(), result.to_json())


def run_recurring_now(settings: Settings, name: str) -> Outcome:
    """Run a recurring schedule's pending occurrence now: a reschedule of it to now,
    which needs ``journal_bodies`` (the occurrence's body is published again)."""
    from ..amqp.publisher import Publisher

    with Publisher(settings) as publisher:
        schedules = {s.name: s for s in publisher.list_recurring()}
        schedule = schedules.get(name)
        if schedule is None:
            return Outcome(False, RecurringResult(name, "unknown").describe())
        pending = schedule.next_occurrence(now_ms())
        message_id = schedule.message_ids.get(pending) if pending is not None else None
        if message_id is None:
            return Outcome(False, f"{name}: no pending occurrence to run now")
        result = publisher.reschedule(message_id, delay=0)
    return Outcome(
        result.outcome == "rescheduled",
        f"{name}: occurrence {iso_of_ms(pending or 0)}: {result.describe()}",
        result.to_json(),
    )


@dataclass
class Job:
    """Long work (a replay, a purge) run in the background, with its progress."""

    id: str
    what: str
    total: int | None = None
    seen: int = 0
    done: bool = False
    outcome: Outcome | None = None
    started: float = field(default_factory=time.monotonic)

    def progress(self, seen: int) -> None:
        self.seen = seen

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "what": self.what,
            "total": self.total,
            "seen": self.seen,
            "done": self.done,
            "outcome": None if self.outcome is None else self.outcome.to_json(),
            "seconds": round(time.monotonic() - self.started, 1),
        }


class Jobs:
    """The background jobs of this dashboard (kept until it stops; few and small)."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def new(self, what: str) -> Job:
        with self._lock:
            job = Job(str(next(self._ids)), what)
            self._jobs[job.id] = job
        return job

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold the task until it ends (asyncio keeps only a weak reference)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def replay_parked(
    settings: Settings, job: Job, destination: str | None, message_id: str | None
) -> Outcome:
    """``rmqdelay parked replay``: each parked message of the filter goes back to its
    destination as attempt 1, once its copy is confirmed."""
    from ..amqp.parked_queue import ParkedQueue

    async with ParkedQueue(settings) as parked:
        job.total = await parked.count()
        report = await parked.replay(
            destination, delay=timedelta(0), progress=job.progress, message_id=message_id
        )
    from .refusals import explain_text

    text = f"replayed {report.replayed} message(s)"
    if report.skipped:
        why = "; ".join(
            f"{mid or '-'}: {explain_text(reason, settings)}" for mid, reason in report.skipped[:5]
        )
        text += f"; {len(report.skipped)} stayed parked ({why})"
    data = {"replayed": report.replayed, "skipped": [list(s) for s in report.skipped]}
    ok = not report.skipped and (message_id is None or report.replayed == 1)
    if message_id is not None and report.replayed == 0 and not report.skipped:
        text = f"{message_id}: not found in the parking queue (replayed or purged already?)"
    return Outcome(ok, text, data)


async def purge_parked(
    settings: Settings, job: Job, destination: str | None, message_id: str | None
) -> Outcome:
    """``rmqdelay parked purge``: delete the parked messages of the filter, for good."""
    from ..amqp.parked_queue import ParkedQueue

    async with ParkedQueue(settings) as parked:
        job.total = await parked.count()
        count = await parked.purge(destination, message_id=message_id, progress=job.progress)
    said = f"purged {count} parked message(s){which(destination, message_id)}"
    return Outcome(True, said, {"purged": count})


def which(destination: str | None, message_id: str | None) -> str:
    """The parked messages a replay or a purge takes, as its words say them."""
    return (f" of {destination!r}" if destination else "") + (
        f" with id {message_id!r}" if message_id else ""
    )
