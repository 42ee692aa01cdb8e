"""A publisher's folded view of the journal, kept between reschedules and read on.

A reschedule decides on the whole journal (was the message handled, cancelled, moved,
replaced under its key?), and reading it whole each time cost every call the journal's
length: 400 reschedules on a journal of a few thousand records took 45-104 s under
CI's load. The publisher keeps the fold (:class:`~.view.ScheduleView`) and the stream
offset it has read to, and each reschedule appends its marker and reads only what came
since, on a consumer the adapter keeps open (:class:`~.steps.Follow`, reader
``view``). A fold older than ``max_delay`` is dropped and read again from the stream, so
it holds what a whole read would, never more than two windows of the journal.

Pure: the adapters carry out the steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import JournalError
from ..clock import now_ms
from ..failures import journal_missing
from ..layout import Layout
from ..steps import Flow
from .flows import Clock, append, new_marker
from .records import decode_records, journal_name
from .steps import Follow
from .view import ScheduleView

__all__ = ["ViewFollower", "read_on", "view_follower"]

VIEW_READER = "view"
"""The Follow steps' reader: a consumer of its own, apart from the keyed publishes'."""


@dataclass
class ViewFollower:
    """The journal folded as far as this publisher has read it, and where it stands."""

    started_ms: int
    """When the fold began: it read from ``started_ms - max_delay``."""
    view: ScheduleView = field(default_factory=ScheduleView)
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
    ``max_delay``. Concurrent calls (asyncio) must share the one this returns before
    they read: each feeds every reader's markers into it (:func:`read_on`)."""
    now = clock()
    if follower is None or now - follower.started_ms > layout.max_delay_ms:
        follower = ViewFollower(started_ms=now)
    return follower


def read_on(
    layout: Layout,
    follower: ViewFollower,
    *,
    timeout: float,
    clock: Clock = now_ms,
) -> Flow[ViewFollower]:
    """The follower read on to the journal's end (a marker of its own, appended now)."""
    now = clock()
    record = new_marker(now)
    marker = record.message_id
    follower.expected.add(marker)
    name = journal_name(layout)
    try:
        yield from append(layout, [record])

        def take(offset: int, body: bytes) -> bool:
            follower.take(offset, body)
            return marker in follower.seen

        end = yield Follow(
            name,
            follower.started_ms - layout.max_delay_ms,
            follower.next_offset,
            take,
            timeout,
            lambda: marker in follower.seen,
            reader=VIEW_READER,
        )
    finally:
        follower.expected.discard(marker)
        follower.seen.discard(marker)
    if end == "missing":
        raise journal_missing(layout)
    if end != "done":
        raise JournalError(f"the stream {name!r} gave nothing for {timeout:g}s; try again")
    return follower
