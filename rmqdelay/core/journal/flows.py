"""The schedule journal's reads and writes as flows, written once for every adapter.

As a publish is (:mod:`.outgoing`), a journal call is a generator that yields the only
two things needing a broker, :class:`~.steps.Append` (append, confirmed) and
:class:`~.steps.Read` (consume the stream from a time on until told to stop),
and gets their answers back. What to read, when to stop, the cancel plan, the filters
and every error are here; the pika and aio-pika adapters and the in-memory publisher
only carry out the two steps. A reader cannot ask a stream where its end is, so
:func:`read` appends a marker of its own first, and reads until it comes back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Generator, Iterable
from dataclasses import replace
from typing import Any, TypeVar, cast

from ...errors import JournalError
from ..clock import now_ms
from ..failures import journal_missing, journal_off
from ..layout import Layout
from ..steps import Flow, run_flow
from .records import (
    RECORDS_PER_WRITE,
    JournalRecord,
    decode_lines,
    decode_records,
    encode_records,
    journal_name,
)
from .steps import Append, JournalStep, JournalWrite, Read
from .view import CancelResult, ScheduleView, plan_cancels

__all__ = [
    "PROGRESS_EVERY",
    "JournalFlow",
    "UntilMarker",
    "append",
    "cancel",
    "list_scheduled",
    "new_marker",
    "probe",
    "read",
    "read_view",
    "require_journal",
    "run",
    "scheduled_rows",
]

T = TypeVar("T")
Clock = Callable[[], int]
"""Unix ms now: :func:`~rmqdelay.core.clock.now_ms`, or a test's own."""

PROGRESS_EVERY = 1000
"""A read reports its progress every this many records."""
JournalFlow = Generator[JournalStep, Any, T]
"""A journal call as steps for an adapter to carry out; its return value is the call's."""


def run(flow: JournalFlow[T], do: Callable[[JournalStep], object]) -> T:
    """Carry out a flow with ``do`` answering each step (a test's adapter)."""
    return run_flow(cast("Flow[T]", flow), lambda step: do(cast(JournalStep, step)))


class UntilMarker:
    """What a reader makes of the stream's messages: every record in order to
    ``on_record``, markers skipped, until its own marker (``marker_id``) comes back.

    Called with each body; returns True for the body that held the marker, after which
    it goes on taking records (a tail follows the journal past its marker).
    """

    def __init__(
        self,
        marker_id: str,
        on_record: Callable[[JournalRecord], None],
        progress: Callable[[int], None] | None = None,
        wants: Callable[[bytes], bool] | None = None,
        on_marker: Callable[[str], None] | None = None,
    ) -> None:
        self.marker_id = marker_id
        self.on_record = on_record
        self.progress = progress
        self.wants = wants
        """Lines it returns False for are counted, not decoded (see ``Tombstones.wants``)."""
        self.on_marker = on_marker
        """Told the id of every marker read, its own and others' (a reader that appends
        markers of its own later, to know it has read to the end again)."""
        self.count = 0
        self.reached = False

    def __call__(self, body: bytes) -> bool:
        found = False
        if self.wants is None:
            records = decode_records(body)
        else:
            lines = body.split(b"\n")
            kept = [line for line in lines if self.wants(line)]
            self.count += len(lines) - len(kept)
            records = decode_lines(kept)
        on_record, progress = self.on_record, self.progress
        for record in records:
            if record.kind == "marker":
                found = found or record.message_id == self.marker_id
                if self.on_marker is not None:
                    self.on_marker(record.message_id)
                continue
            self.count += 1
            on_record(record)
            if progress is not None and self.count % PROGRESS_EVERY == 0:
                progress(self.count)
        self.reached = self.reached or found
        return found


def require_journal(layout: Layout, what: str) -> str:
    """The stream's name; a clear error when the settings turned the journal off."""
    if not layout.journal:
        raise journal_off(what)
    return journal_name(layout)


def new_marker(at_ms: int) -> JournalRecord:
    """A marker record of a reader's own: readers skip every marker but theirs."""
    return JournalRecord("marker", f"marker-{uuid.uuid4()}", recorded_at_ms=at_ms)


def _writes(records: list[JournalRecord]) -> list[JournalWrite]:
    """Records grouped into stream messages: one round trip for a cancel of many ids."""
    chunks = [records[i : i + RECORDS_PER_WRITE] for i in range(0, len(records), RECORDS_PER_WRITE)]
    return [JournalWrite(encode_records(chunk), chunk[0].message_id) for chunk in chunks]


def append(layout: Layout, records: list[JournalRecord]) -> JournalFlow[None]:
    """Append records, a few hundred to a write, every write confirmed."""
    name = require_journal(layout, "writing to the schedule journal")
    if records and not (yield Append(name, _writes(records))):
        raise journal_missing(layout)


def probe(layout: Layout, clock: Clock = now_ms) -> JournalFlow[None]:
    """Append a marker (readers skip it) and wait for its confirm: a stream confirms a
    write once a majority of its replicas have it, which a node cut off from the
    cluster's majority cannot get, though it still accepts connections."""
    yield from append(layout, [new_marker(clock())])


def _read_into(
    layout: Layout,
    on_record: Callable[[JournalRecord], None],
    *,
    since_ms: int | None,
    timeout: float,
    progress: Callable[[int], None] | None,
    clock: Clock,
) -> JournalFlow[None]:
    """Every record from ``since_ms`` (default: now - max_delay) to now, in order, to
    ``on_record``: append a marker, then read until it comes back."""
    name = require_journal(layout, "reading the schedule")
    start = clock() - layout.max_delay_ms if since_ms is None else since_ms
    marker = new_marker(clock())
    yield from append(layout, [marker])
    end = yield Read(name, start, UntilMarker(marker.message_id, on_record, progress), timeout)
    if end == "missing":
        raise journal_missing(layout)
    if end != "done":
        raise JournalError(f"the stream {name!r} gave nothing for {timeout:g}s; try again")


def read(
    layout: Layout,
    *,
    since_ms: int | None = None,
    timeout: float = 30.0,
    progress: Callable[[int], None] | None = None,
    clock: Clock = now_ms,
) -> JournalFlow[list[JournalRecord]]:
    """Every record from ``since_ms`` (default: now - max_delay) to now, in order."""
    records: list[JournalRecord] = []
    yield from _read_into(
        layout, records.append, since_ms=since_ms, timeout=timeout, progress=progress, clock=clock
    )
    return records


def _view(
    layout: Layout, timeout: float, progress: Callable[[int], None] | None, clock: Clock
) -> JournalFlow[ScheduleView]:
    """The journal read to its end and folded as it comes (no list of 100,000 records)."""
    view = ScheduleView()
    yield from _read_into(
        layout, view.add, since_ms=None, timeout=timeout, progress=progress, clock=clock
    )
    return view


def read_view(
    layout: Layout, *, timeout: float = 30.0, clock: Clock = now_ms
) -> JournalFlow[ScheduleView]:
    """The journal read to its end and folded: copies, tombstones, keys and moves."""
    return (yield from _view(layout, timeout, None, clock))


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
    came late hides none (:class:`~rmqdelay.core.journal.view.ScheduleView`).
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
    return [record for record, _generation in rows]


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
    ``scheduled list``."""
    view = yield from _view(layout, timeout, progress, clock)
    found = view.pending(clock(), destination=destination, due_before_ms=due_before_ms)
    if key is not None:
        found = [r for r in found if r.key == key]
    if limit is not None:
        found = found[:limit]
    return [(r, None if r.key is None else _generation(view, r)) for r in found]


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
    after the ids, each result naming its key; a cancelled key is free again."""
    ids = list(message_ids)
    keys = list(dict.fromkeys(keys))
    view = yield from _view(layout, timeout, None, clock)
    current = {key: view.keys.current(key) for key in keys}
    keyed = [g.message_id for g in current.values() if g is not None]
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
