"""A publisher's folded view of the journal, kept between reschedules and read on.

A reschedule decides on the whole schedule (was the message handled, cancelled, moved,
replaced under its key?). The publisher keeps a fold: the latest checkpoint's core
(tombstones, keys, moves) and the journal after it, followed on a consumer the adapter
keeps open (a :class:`~.steps.Read` with ``keep``: reader ``view``); each reschedule
appends its marker and reads only what came since, then takes the checkpoint's copies
of the message it moves (:func:`load_copies`; the view keeps them). A fold older than
:data:`REBUILD_MS` starts again from the latest checkpoint, so what it holds stays the
state and a short tail, however long the publisher lives.

Pure: the adapters carry out the steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ...errors import JournalError
from ..clock import now_ms
from ..failures import journal_missing
from ..layout import Layout
from ..steps import Flow
from .checkpoint import COPIES_AND_BODIES, Pointer
from .reading import Clock, append, load_core, new_marker, read_sections
from .records import decode_records, journal_name
from .state import JournalState, Restorer
from .steps import Read, Start, StreamMessage, stream_offset
from .view import ScheduleView

__all__ = ["REBUILD_MS", "VIEW_READER", "ViewFollower", "load_copies", "read_on", "view_follower"]

VIEW_READER = "view"
"""The reschedules' kept consumer, apart from the keyed publishes'."""
REBUILD_MS = 10 * 60_000
"""A fold this old starts again from the latest checkpoint."""


@dataclass
class ViewFollower:
    """The journal folded as far as this publisher has read it, and where it stands."""

    started_ms: int
    view: ScheduleView = field(default_factory=ScheduleView)
    pointer: Pointer | None = None
    """The checkpoint the fold started from; None before the first read."""
    next_offset: int | None = None
    """The offset of the first stream message not folded yet; None before the first."""
    expected: set[str] = field(default_factory=set)
    """Markers appended and not read back yet."""
    seen: set[str] = field(default_factory=set)
    """Markers read back and not yet claimed by the call that waits for them."""

    def take(self, offset: int, body: bytes) -> None:
        """Fold a stream message once (a consumer reopened at an earlier offset repeats
        what it gave before: skipped)."""
        if self.next_offset is not None and offset < self.next_offset:
            return
        self.next_offset = offset + 1
        for record in decode_records(body):
            if record.kind != "marker":
                self.view.add(record)
            elif record.message_id in self.expected:
                self.expected.discard(record.message_id)
                self.seen.add(record.message_id)


def view_follower(
    layout: Layout, follower: ViewFollower | None, clock: Clock = now_ms
) -> ViewFollower:
    """``follower`` to read on, or a new one when there is none or it is older than
    :data:`REBUILD_MS`. Concurrent calls (asyncio) must share the one this returns before
    they read: each feeds every reader's markers into it (:func:`read_on`)."""
    now = clock()
    if follower is None or now - follower.started_ms > REBUILD_MS:
        follower = ViewFollower(started_ms=now)
    return follower


def read_on(
    layout: Layout,
    follower: ViewFollower,
    *,
    timeout: float,
    clock: Clock = now_ms,
) -> Flow[ViewFollower]:
    """The follower read on to the journal's end (a marker of its own, appended now);
    a new one first takes the latest checkpoint's core."""
    if follower.pointer is None:
        pointer, entries = yield from load_core(layout, timeout=timeout)
        if follower.pointer is None:  # no concurrent call restored one first
            if pointer.complete:
                follower.view.loaded = set()
            for entry in entries:
                follower.view.restore(entry)
            follower.pointer = pointer
            follower.next_offset = pointer.covers
    now = clock()
    record = new_marker(now)
    marker = record.message_id
    follower.expected.add(marker)
    name = journal_name(layout)
    try:
        yield from append(layout, [record])

        def take(message: StreamMessage) -> bool:
            follower.take(message.offset, message.body)
            return marker in follower.seen

        start: Start = (
            follower.next_offset
            if follower.next_offset is not None
            else stream_offset(now - layout.max_delay_ms)
        )
        end = yield Read(
            name, start, take, timeout, keep=VIEW_READER, reached=lambda: marker in follower.seen
        )
    finally:
        follower.expected.discard(marker)
        follower.seen.discard(marker)
    if end == "missing":
        raise journal_missing(layout)
    if end != "done":
        raise JournalError(f"the stream {name!r} gave nothing for {timeout:g}s; try again")
    return follower


def load_copies(
    layout: Layout, follower: ViewFollower, message_ids: Iterable[str], *, timeout: float
) -> Flow[None]:
    """Take the checkpoint's copies (and bodies) of ``message_ids`` into the view, once."""
    view, pointer = follower.view, follower.pointer
    if view.loaded is None or pointer is None:
        return
    wanted = set(message_ids) - view.loaded
    if not wanted:
        return
    found = JournalState()
    restorer = Restorer(found, ids=wanted)
    yield from read_sections(layout, pointer, restorer.take, COPIES_AND_BODIES, timeout=timeout)
    view.load(wanted, found.view.copies.values())
