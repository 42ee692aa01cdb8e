"""Writing a checkpoint, as a flow: the previous one and the tail after it, made one.

The writer holds what it must and streams the rest (:class:`~.state.Merge`):

1. the checkpoint stream's last message (:func:`~.reading.latest`): another writer's
   checkpoint under way (its last part younger than :data:`~.checkpoint.LEASE_MS`) is
   left to finish; otherwise its ``latest`` is the checkpoint to start from;
2. a ``begin``, then its offset found (the parts that follow come after it);
3. the journal from the previous checkpoint's end to a marker of its own: every record
   confirmed before it (the new checkpoint covers up to there; anything written meanwhile
   is in the next one's tail);
4. the previous ``core`` restored and the tail folded on it (copies the tail moves are
   read from the previous checkpoint then: their records are needed);
5. what is settled forgotten; the new ``core`` written; the previous ``copies`` and
   ``bodies`` read part by part and merged with the tail's; a ``commit`` naming it all.

A writer cut off anywhere leaves a checkpoint no pointer names: readers go on from the
previous one. Two writers at once write two equivalent checkpoints; readers take the one
committed last. Nothing is deleted: the stream's retention drops old checkpoints.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from ...errors import JournalError
from ..failures import journal_missing
from ..layout import Layout
from .checkpoint import (
    CHECKPOINT_TYPE,
    COPIES_AND_BODIES,
    CORE,
    GENESIS,
    HEADER,
    SETTLE_MS,
    Mark,
    Part,
    Pointer,
    Section,
    checkpoint_name,
    decode_copies,
    decode_entries,
    encode_copy,
    encode_entries,
    parts,
)
from .reading import (
    PARTS_PREFETCH,
    Clock,
    JournalFlow,
    Sections,
    latest,
    read_sections,
    read_tail,
    require_journal,
)
from .state import JournalState, Merge, Restorer, copies_merge
from .steps import Append, JournalWrite, Read, StreamMessage

__all__ = ["APPEND_PARTS", "Written", "heartbeat", "write"]

APPEND_PARTS = 16
"""Parts appended in one confirm window (about 4 MB)."""
READ_PARTS = 32
"""Previous parts read, then merged and written, at a time: what the writer holds."""
Outcome = Literal["written", "busy", "not due", "no checkpoint stream"]


@dataclass(frozen=True)
class Written:
    """What a write did: ``written`` (``pointer`` names the new checkpoint), ``busy``
    (another writer's is under way), ``not due``, or ``no checkpoint stream`` (a journal
    declared before checkpoints: ``topology apply`` adds the stream)."""

    outcome: Outcome
    pointer: Pointer | None = None
    tail_bytes: int = 0
    tail_records: int = 0
    gap: tuple[int, int] | None = None
    """Journal offsets deleted by its retention before a checkpoint covered them."""

    @property
    def gap_text(self) -> str | None:
        """What a gap means, for a log or a command to say (None: no gap)."""
        if self.gap is None:
            return None
        start, end = self.gap
        return (
            f"the journal's records between offsets {start} and {end} were deleted by its "
            "retention before a checkpoint covered them (raise journal_retention, and keep "
            "a worker running): what they scheduled, cancelled or keyed is not in the schedule"
        )


class _Out:
    """The new checkpoint's messages, appended a confirm window at a time."""

    def __init__(
        self, layout: Layout, checkpoint: str, writer: str, clock: Clock, previous: Pointer
    ) -> None:
        self.exchange = checkpoint_name(layout)
        self.checkpoint = checkpoint
        self.writer = writer
        self.clock = clock
        self.previous = previous
        self.pending: list[JournalWrite] = []
        self.sections: dict[str, list[int]] = {}

    def message(self, part: Part, index: int, body: bytes, latest: Pointer) -> JournalWrite:
        mark = Mark(self.checkpoint, part, index, self.clock(), self.writer, latest)
        return JournalWrite(
            body,
            f"{self.checkpoint}-{part}-{index}",
            CHECKPOINT_TYPE,
            {HEADER: mark.header()},
        )

    def add(self, section: Section, lines: Iterable[bytes]) -> JournalFlow[None]:
        counts = self.sections.setdefault(section, [0, 0, 0])
        for body, count in parts(lines):
            self.pending.append(self.message(section, counts[0], body, self.previous))
            counts[0] += 1
            counts[1] += count
            counts[2] += len(body)
            if len(self.pending) >= APPEND_PARTS:
                yield from self.flush()

    def flush(self) -> JournalFlow[None]:
        writes, self.pending = self.pending, []
        if writes and not (yield Append(self.exchange, writes)):
            raise JournalError(f"the checkpoint stream {self.exchange!r} refused a part")


def write(
    layout: Layout,
    *,
    writer: str,
    timeout: float,
    clock: Clock,
    due: Callable[[Mark | None], bool] = lambda _mark: True,
) -> JournalFlow[Written]:
    """Write a checkpoint of the journal, unless another writer is writing one or
    ``due`` (given the checkpoint stream's last message) says none is due."""
    require_journal(layout, "writing a checkpoint")
    found = yield from latest(layout, timeout)
    if found == "missing":
        return Written("no checkpoint stream")
    mark = found if isinstance(found, Mark) else None
    now = clock()
    if mark is not None and mark.busy(now) and mark.writer != writer:
        return Written("busy")
    if not due(mark):
        return Written("not due")
    previous = mark.latest if mark is not None else GENESIS
    out = _Out(layout, uuid.uuid4().hex, writer, clock, previous)
    if not (yield Append(out.exchange, [out.message("begin", 0, b"", previous)])):
        raise journal_missing(layout)
    offset = yield from _locate(layout, out.checkpoint, timeout)

    state = JournalState()
    if previous.complete:
        restorer = Restorer(state, ids=())  # the previous copies are merged, not held
        yield from read_sections(layout, previous, restorer.take, CORE, timeout=timeout)
    tail = yield from read_tail(layout, previous, state.add, timeout=timeout, clock=clock)
    moved = set(state.view.deferred)
    if previous.complete and moved:  # a move picks its copy: those records are needed
        found_copies = JournalState()
        loading = Restorer(found_copies, ids=moved)
        yield from read_sections(layout, previous, loading.take, COPIES_AND_BODIES, timeout=timeout)
        state.view.load(moved, found_copies.view.copies.values())
    state.expire(now, layout.max_delay_ms)

    yield from out.add("core", encode_entries(state.core_entries()))
    copies, bodies = copies_merge(state.view, now - SETTLE_MS)
    if previous.complete:
        yield from _merge_previous(layout, previous, out, copies, bodies, timeout)
    yield from out.add("copies", (encode_copy(r) for r in copies.finish()))
    yield from out.add("bodies", encode_entries(bodies.finish()))
    yield from out.flush()
    covers = tail.end if tail.end is not None else (previous.covers or 0)
    sections_written = {name: (c[0], c[1], c[2]) for name, c in out.sections.items()}
    pointer = Pointer(out.checkpoint, now, covers, offset, sections_written)
    if not (yield Append(out.exchange, [out.message("commit", 0, b"", pointer)])):
        raise journal_missing(layout)
    gap = None
    if previous.covers is not None and tail.first is not None and tail.first > previous.covers:
        gap = (previous.covers, tail.first)
    return Written("written", pointer, tail.bytes, tail.messages, gap)


LOCATE_WAIT_S = 2.0
"""How long the writer waits for more of the stream's last chunk while it looks for its
own ``begin`` there."""


def _locate(layout: Layout, checkpoint: str, timeout: float) -> JournalFlow[int]:
    """The offset of this writer's ``begin``, just appended and confirmed: in the stream's
    last chunk, unless others appended after it; then looked for further back, a wider
    stretch each time."""
    name = checkpoint_name(layout)
    found: list[int] = []
    earliest: list[int] = []

    def ours(message: StreamMessage) -> bool:
        if not earliest:
            earliest.append(message.offset)
        mark = Mark.of_header(message.headers.get(HEADER))
        if mark is not None and mark.id == checkpoint and mark.part == "begin":
            found.append(message.offset)
            return True
        return False

    yield Read(name, "last", ours, min(timeout, LOCATE_WAIT_S), prefetch=PARTS_PREFETCH)
    back = 64
    while not found and earliest and earliest[0] > 0:
        stop, start = earliest[0], max(0, earliest[0] - back)
        earliest.clear()

        def until_ours(message: StreamMessage, stop: int = stop) -> bool:
            return ours(message) or message.offset + 1 >= stop

        end = yield Read(name, start, until_ours, timeout, prefetch=PARTS_PREFETCH)
        if end != "done" or start == 0:
            break
        back *= 8
    if not found:
        raise JournalError(f"a checkpoint's begin was not found in {name!r} once confirmed")
    return found[0]


def _merge_previous(
    layout: Layout,
    previous: Pointer,
    out: _Out,
    copies: Merge,
    bodies: Merge,
    timeout: float,
) -> JournalFlow[None]:
    """The previous checkpoint's copies and bodies, read a few parts at a time, merged
    with the writer's and written on: the writer holds a few parts, never the state."""
    read: Sections | None = None
    while read is None or not read.complete:
        batch: list[tuple[Section, bytes]] = []
        read = yield from read_sections(
            layout,
            previous,
            lambda section, body: batch.append((section, body)),  # noqa: B023
            COPIES_AND_BODIES,
            timeout=timeout,
            resume=read,
            enough=lambda: len(batch) >= READ_PARTS,  # noqa: B023
        )
        for section, body in batch:
            if section == "copies":
                merged = copies.feed(decode_copies(body))
                yield from out.add("copies", (encode_copy(r) for r in merged))
            else:
                yield from out.add("bodies", encode_entries(bodies.feed(decode_entries(body))))
        if not batch:
            return


def heartbeat(layout: Layout, mark: Mark | None, *, writer: str, clock: Clock) -> JournalFlow[None]:
    """Say a writer is alive (:data:`~.checkpoint.HEARTBEAT_MS`), naming the latest
    checkpoint as the stream's last message did."""
    latest_pointer = mark.latest if mark is not None else GENESIS
    beat = uuid.uuid4().hex
    message = Mark(beat, "alive", 0, clock(), writer, latest_pointer)
    write_ = JournalWrite(b"", f"{beat}-alive", CHECKPOINT_TYPE, {HEADER: message.header()})
    if not (yield Append(checkpoint_name(layout), [write_])):
        raise journal_missing(layout)
