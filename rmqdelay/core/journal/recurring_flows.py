"""Recurring schedules' calls as flows: add, pause, resume, remove, list.

Each reads the schedule journal to its end first (control records and occurrences,
:class:`~.recurring.RecurringBook`), then appends its control record, confirmed; ``add``
then publishes the first occurrence (keyed, ``ignore``) and ``remove`` cancels the
pending one. Written once for both publishers (:mod:`.journal_flows`' way).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from datetime import datetime
from typing import Any, Protocol, cast

from ...errors import RecurringError
from ..clock import datetime_of_ms, ms_of_datetime, now_ms
from ..durations import DurationLike, format_ms
from ..publishing.outgoing import PublishOptions, PublishResult
from ..routing import validate_destination
from .reading import append, load, load_ids, require_journal
from .records import JournalRecord
from .recurring import RecurringBook, RecurringResult, RecurringSchedule, control_record
from .rules import (
    RECURRING,
    Occurrence,
    Rule,
    State,
    chain_ms,
    new_chain,
    parse_rule,
    validate_name,
)
from .view import ScheduleView, plan_cancels

__all__ = ["add", "listed", "occurrence_options", "switch"]

Clock = Callable[[], int]
RecurringFlow = Generator[Any, Any, RecurringResult]


def _read(
    layout: Any, timeout: float, clock: Clock, name: str | None = None
) -> Generator[Any, Any, tuple[RecurringBook, ScheduleView]]:
    """The journal to its end (the latest checkpoint and the tail after it), folded for
    schedules and for what is pending; with ``name``, that schedule's occurrences'
    copies taken from the checkpoint too (:func:`_pending_of` asks for them)."""
    loaded = yield from load(layout, timeout=timeout, clock=clock)
    book, view = loaded.state.recurring, loaded.state.view
    schedule = book.schedules.get(name) if name is not None else None
    if schedule is not None:
        yield from load_ids(layout, loaded, schedule.message_ids.values(), timeout=timeout)
    return book, view


def _pending_of(view: ScheduleView, schedule: RecurringSchedule, now: int) -> list[JournalRecord]:
    """The schedule's occurrences still ahead and not cancelled (normally one)."""
    return [
        r
        for r in view.pending(now, destination=schedule.destination or None)
        if r.headers.get(RECURRING) == schedule.name
    ]


def occurrence_options(
    occurrence: Occurrence,
    headers: Mapping[str, Any] | None = None,
    properties: Mapping[str, Any] | None = None,
) -> PublishOptions:
    """How an occurrence is published: due at its time, its chain in its headers, keyed
    ``recurring:NAME@ms`` with ``ignore``, and an id of its own made of the key and the
    chain, so that publishing it again (a worker that died before its ack) is a resend
    of the same message, which the keys fold drops once one copy was handled."""
    return cast(
        PublishOptions,
        {
            **(properties or {}),
            "at": datetime_of_ms(occurrence.at_ms),
            "headers": {**(headers or {}), **occurrence.headers()},
            "message_id": f"{occurrence.key}:{occurrence.chain}",
            "key": occurrence.key,
            "on_conflict": "ignore",
        },
    )


class Publishes(Protocol):
    """What :func:`add` needs of a publisher's core (:mod:`..publishing.publisher`,
    which builds this flow: a Protocol, not an import, so the two do not import each
    other)."""

    layout: Any

    def prepare(self, *args: Any, **kwargs: Any) -> object: ...

    def publish(
        self, destination: str, body: object, options: PublishOptions
    ) -> Generator[Any, Any, PublishResult]: ...


def add(
    core: Publishes,
    name: str,
    destination: str,
    body: object,
    *,
    cron: str | None = None,
    tz: str | None = None,
    every: DurationLike | None = None,
    first_at: datetime | None = None,
    headers: Mapping[str, Any] | None = None,
    properties: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
    clock: Clock = now_ms,
) -> RecurringFlow:
    """Add a schedule and publish its first occurrence; ``exists`` when one of that name
    is there with the same rule and destination (its chain is started again if nothing
    of it is pending); a RecurringError when one is there with another."""
    layout = core.layout
    require_journal(layout, "recurring schedules")
    validate_name(name)
    validate_destination(layout, destination)
    now = clock()
    anchor = 0 if first_at is None or every is None else ms_of_datetime(first_at)
    rule = parse_rule(cron=cron, tz=tz, every=every, anchor_ms=anchor)
    gap = rule.longest_gap_ms(now)
    if gap > layout.max_delay_ms:
        raise RecurringError(
            f"{rule.describe()}: occurrences up to {format_ms(gap)} apart, longer than the "
            f"longest delay ({format_ms(layout.max_delay_ms)}); raise max_delay or fire more often"
        )
    book, view = yield from _read(layout, timeout, clock, name)
    known = book.schedules.get(name)
    state: State = "active"
    stamp = now
    if known is not None and book.effective(known)[0] != "removed":
        if known.rule != rule or known.destination != destination:
            raise RecurringError(
                f"a recurring schedule {name!r} exists ({known.rule.describe()} to "
                f"{known.destination!r}): remove it first, or pick another name"
            )
        pending = _pending_of(view, known, now)
        if pending:
            waiting = pending[0]
            return RecurringResult(
                name, "exists", rule.describe(), destination, waiting.due_at_ms, waiting.message_id
            )
        chain = known.chain  # nothing pending: start the same chain again
        state, stamp = book.effective(known)
        record: JournalRecord | None = None
    else:
        chain = new_chain(now)
        record = control_record(name, "add", now, rule=rule, chain=chain, destination=destination)
    first = _first(rule, now, None if first_at is None else ms_of_datetime(first_at))
    occurrence = Occurrence(name, first, rule, chain, state, stamp)  # type: ignore[arg-type]
    options = occurrence_options(occurrence, headers, properties)
    core.prepare(destination, body, **options)  # every check before the record goes out
    if record is not None:
        yield from append(layout, [record])
    result = yield from core.publish(destination, body, options)
    return RecurringResult(name, "added", rule.describe(), destination, first, result.message_id)


_SAID = {"pause": "paused", "resume": "resumed", "remove": "removed"}


def switch(
    layout: Any,
    name: str,
    op: str,
    *,
    timeout: float = 30.0,
    clock: Clock = now_ms,
) -> RecurringFlow:
    """``pause``, ``resume`` or ``remove`` a schedule; ``remove`` also cancels its
    pending occurrence. ``unknown`` when the journal knows of no such schedule (or, but
    for a second ``remove``, of none that was not removed)."""
    require_journal(layout, "recurring schedules")
    validate_name(name)
    book, view = yield from _read(layout, timeout, clock, name)
    known = book.schedules.get(name)
    if known is None:
        return RecurringResult(name, "unknown")
    if book.effective(known)[0] == "removed":
        if op != "remove":
            return RecurringResult(name, "unknown")
        # a second remove answers as the first did, as a second cancel does
        return RecurringResult(name, "removed", known.rule.describe(), known.destination)
    now = clock()
    # never stamped before what it changes: another host's clock may be ahead
    stamp = max(now, chain_ms(known.chain), book.effective(known)[1] + 1)
    pending = _pending_of(view, known, now)
    yield from append(layout, [control_record(name, op, stamp)])  # type: ignore[arg-type]
    cancelled: tuple[str, ...] = ()
    if op == "remove" and pending:
        ids = [r.message_id for r in pending]
        _results, tombstones = plan_cancels(view, ids, now)
        yield from append(layout, tombstones)
        cancelled = tuple(ids)
    return RecurringResult(
        name,
        _SAID[op],  # type: ignore[arg-type]
        known.rule.describe(),
        known.destination,
        pending[0].due_at_ms if pending and op != "remove" else None,
        pending[0].message_id if pending else None,
        cancelled,
    )


def listed(
    layout: Any, *, timeout: float = 30.0, clock: Clock = now_ms
) -> Generator[Any, Any, list[RecurringSchedule]]:
    """Every schedule not removed, by name, with its state (the chain's next and last
    occurrences from the records read)."""
    require_journal(layout, "recurring schedules")
    book, _view = yield from _read(layout, timeout, clock)
    return book.listed()


def _first(rule: Rule, now: int, first_at_ms: int | None) -> int:
    """The first occurrence: the next rule time, not before ``first_at`` if given (an
    ``every`` rule counts its intervals from ``first_at``)."""
    if first_at_ms is None or first_at_ms <= now:
        return rule.next_after(now)
    if rule.every_ms is not None:
        return first_at_ms
    return rule.next_after(first_at_ms - 1)
