"""The schedule journal's calls as flows, written once for every adapter: ``scheduled
list``, ``cancel``, a probe, a raw read.

As a publish is (:mod:`..publishing.outgoing`), a journal call is a generator that yields the only
two things needing a broker, :class:`~.steps.Append` (append, confirmed) and
:class:`~.steps.Read` (consume a stream until told to stop), and gets their answers back.
What to read, when to stop, the cancel plan, the filters and every error are here; the
pika and aio-pika adapters and the in-memory publisher only carry out the two steps.
Every call starts from the latest checkpoint and reads the journal after it
(:mod:`.reading`), so it pays for what is pending and a bounded tail, never for what was
delivered before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from ...errors import JournalError
from ..clock import now_ms
from ..failures import journal_missing
from ..layout import Layout
from .checkpoint import COPIES, CORE, GENESIS, Mark, Section, decode_copies, decode_entries
from .reading import (
    Clock,
    JournalFlow,
    Sections,
    UntilMarker,
    append,
    latest,
    load,
    load_ids,
    new_marker,
    read_sections,
    read_tail,
    require_journal,
)
from .records import JournalRecord
from .state import JournalState
from .steps import Read, stream_offset
from .view import CancelResult, ScheduleView, plan_cancels

__all__ = [
    "cancel",
    "list_scheduled",
    "probe",
    "read",
    "read_view",
    "scheduled_rows",
]


def probe(layout: Layout, clock: Clock = now_ms) -> JournalFlow[None]:
    """Append a marker (readers skip it) and wait for its confirm: a stream confirms a
    write once a majority of its replicas have it, which a node cut off from the
    cluster's majority cannot get, though it still accepts connections."""
    yield from append(layout, [new_marker(clock())])


def read(
    layout: Layout,
    *,
    since_ms: int | None = None,
    timeout: float = 30.0,
    progress: Callable[[int], None] | None = None,
    clock: Clock = now_ms,
) -> JournalFlow[list[JournalRecord]]:
    """Every record of the journal itself from ``since_ms`` (default: now - max_delay) to
    now, in order, checkpoints left aside: what was written, for a test or a tool."""
    name = require_journal(layout, "reading the schedule")
    records: list[JournalRecord] = []
    now = clock()
    marker = new_marker(now)
    yield from append(layout, [marker])
    until = UntilMarker(marker.message_id, records.append, progress)
    start = now - layout.max_delay_ms if since_ms is None else since_ms
    end = yield Read(name, stream_offset(start), lambda m: until(m.body), timeout)
    if end == "missing":
        raise journal_missing(layout)
    if end != "done":
        raise JournalError(f"the stream {name!r} gave nothing for {timeout:g}s; try again")
    return records


def read_view(
    layout: Layout, *, timeout: float = 30.0, clock: Clock = now_ms
) -> JournalFlow[ScheduleView]:
    """The journal folded whole: every copy, tombstone, key and move (the checkpoint's
    copies and the tail's)."""
    loaded = yield from load(layout, copies=True, timeout=timeout, clock=clock)
    return loaded.state.view


def list_scheduled(
    layout: Layout,
    *,
    destination: str | None = None,
    due_before_ms: int | None = None,
    limit: int | None = None,
    timeout: float = 30.0,
    progress: Callable[[int], None] | None = None,
    clock: Clock = now_ms,
    key: str | None = None,
) -> JournalFlow[list[JournalRecord]]:
    """Every copy still ahead and not cancelled, soonest first (while the journal was on);
    ``key``: only those with this key.

    One id can wait as several copies, each its own record (a publish sent again after
    its confirm failed, a retry): each copy still ahead is listed, and a record that
    came late hides none (:class:`~.view.ScheduleView`).
    """
    rows = yield from scheduled_rows(
        layout,
        destination=destination,
        due_before_ms=due_before_ms,
        limit=limit,
        timeout=timeout,
        progress=progress,
        clock=clock,
        key=key,
    )
    return [record for record, _generation in rows[:limit]]


FIRST_COPIES = 256
"""A first page reads the checkpoint's copies until this many (or ``limit``, if more)
match its filters, then four times as many each time the tail left too few."""


def scheduled_rows(
    layout: Layout,
    *,
    destination: str | None = None,
    due_before_ms: int | None = None,
    limit: int | None = None,
    timeout: float = 30.0,
    progress: Callable[[int], None] | None = None,
    clock: Clock = now_ms,
    key: str | None = None,
) -> JournalFlow[list[tuple[JournalRecord, int | None]]]:
    """:func:`list_scheduled`, each copy with its key's generation (None: no key), for
    ``scheduled list``.

    With a ``limit``, the checkpoint's copies are read soonest first only as far as the
    page needs (:func:`_first_pages`): the rows are at least ``limit`` (all there are, if
    fewer), the first ``limit`` exactly those of the whole journal, for the caller to cut;
    without one, all of them."""
    if limit is None:
        loaded = yield from load(
            layout, copies=True, timeout=timeout, clock=clock, progress=progress
        )
        view = loaded.state.view
    else:
        view = yield from _first_pages(
            layout, limit, destination, due_before_ms, key, timeout, clock, progress
        )
    found = view.pending(clock(), destination=destination, due_before_ms=due_before_ms)
    if key is not None:
        found = [r for r in found if r.key == key]
    return [(r, None if r.key is None else _generation(view, r)) for r in found]


def _first_pages(
    layout: Layout,
    limit: int,
    destination: str | None,
    due_before_ms: int | None,
    key: str | None,
    timeout: float,
    clock: Clock,
    progress: Callable[[int], None] | None,
) -> JournalFlow[ScheduleView]:
    """A view whose first ``limit`` pending copies are those of the whole journal.

    The checkpoint's copies come soonest first: read up to a copy C, they hold every
    copy before C. The tail (read first, kept) can cancel, hide or move some of those;
    so the view is made of the core, the copies read and the tail, and answers when at
    least ``limit`` pending copies come before C (or none is left to read); otherwise
    four times as many copies are read, and the view made again."""
    found = yield from latest(layout, timeout)
    mark = found if isinstance(found, Mark) else None
    pointer = mark.latest if mark is not None else GENESIS
    core: list[dict[str, Any]] = []
    copies: list[JournalRecord] = []
    if pointer.complete:
        yield from read_sections(
            layout,
            pointer,
            lambda _s, body: core.extend(decode_entries(body)),
            CORE,
            timeout=timeout,
        )
    tail: list[JournalRecord] = []
    yield from read_tail(
        layout, pointer, tail.append, timeout=timeout, clock=clock, progress=progress
    )
    now = clock()

    def matches(r: JournalRecord) -> bool:
        return (
            r.due_at_ms > now
            and (destination is None or r.destination == destination)
            and (due_before_ms is None or r.due_at_ms < due_before_ms)
            and (key is None or r.key == key)
        )

    need = max(FIRST_COPIES, limit)
    read: Sections | None = None
    while True:
        if pointer.complete and (read is None or not read.complete):
            matching = [sum(matches(r) for r in copies)]

            def take(_section: Section, body: bytes) -> None:
                part = decode_copies(body)
                copies.extend(part)
                matching[0] += sum(matches(r) for r in part)  # noqa: B023

            read = yield from read_sections(
                layout,
                pointer,
                take,
                COPIES,
                timeout=timeout,
                resume=read,
                enough=lambda: matching[0] >= need,  # noqa: B023
            )
        state = JournalState()
        for entry in core:
            state.restore(entry)
        for record in copies:
            state.view.restore_copy(record)
        for record in tail:
            state.add(record)
        if read is None or read.complete or not copies:
            return state.view
        last = (copies[-1].due_at_ms, copies[-1].message_id)
        before = [
            r
            for r in state.view.pending(now, destination=destination, due_before_ms=due_before_ms)
            if (r.due_at_ms, r.message_id) <= last and (key is None or r.key == key)
        ]
        if len(before) >= limit:
            return state.view
        need *= 4


def _about(message_ids: Iterable[str]) -> Callable[[bytes], bool]:
    """Which of the tail's lines a cancel of ``message_ids`` folds: every line but the
    plain ``scheduled`` records of other messages, most of a journal, skipped undecoded.
    Those touch only their own id; a keyed one (its key's verdicts hide or free a copy),
    a tombstone, claim, done or move (each may settle a key's generation) and the
    markers are all kept."""
    names = [json.dumps(message_id).encode() for message_id in message_ids]
    return lambda line: (
        b'"k":"scheduled"' not in line or b'"key":' in line or any(name in line for name in names)
    )


def _generation(view: ScheduleView, record: JournalRecord) -> int | None:
    """A keyed copy's generation (scheduled_rows asks only for those)."""
    entry = view.keys.by_id.get(record.message_id)
    return getattr(entry, "number", None)


def cancel(
    layout: Layout,
    message_ids: Iterable[str],
    *,
    keys: Iterable[str] = (),
    timeout: float = 30.0,
    clock: Clock = now_ms,
) -> JournalFlow[list[CancelResult]]:
    """Tombstone every copy of each id; say for each: ``cancelled`` when any copy is
    still ahead (``cancelled_due_ms`` names them), ``too late`` when every copy is due
    already (no tombstone), ``unknown`` without a record (:func:`plan_cancels`).

    ``keys``: cancel the current message of each key (its latest generation), answered
    after the ids, each result naming its key; a cancelled key is free again. The
    checkpoint's copies are read for these ids alone."""
    ids = list(message_ids)
    keys = list(dict.fromkeys(keys))
    loaded = yield from load(layout, timeout=timeout, clock=clock, wants=_about(ids))
    view = loaded.state.view
    current = {key: view.keys.current(key) for key in keys}
    keyed = [g.message_id for g in current.values() if g is not None]
    # a tombstone names copies, never bodies: those parts are left unread
    yield from load_ids(layout, loaded, [*ids, *keyed], timeout=timeout, sections=COPIES)
    results, tombstones = plan_cancels(view, [*ids, *keyed], clock())
    yield from append(layout, tombstones)
    by_id = {r.message_id: r for r in results}
    answers = [by_id[message_id] for message_id in dict.fromkeys(ids)]
    for key, generation in current.items():
        if generation is None:
            answers.append(CancelResult("", "unknown", key=key))
        else:
            answers.append(replace(by_id[generation.message_id], key=key))
    return answers
