"""Reading the journal: the latest checkpoint, then the tail after it, as flows.

Every reader does the same three things, each a :class:`~.steps.Read` an adapter carries
out (:mod:`.steps`):

1. :func:`latest`: the checkpoint stream's last message, whose mark names the latest
   complete checkpoint (:mod:`.checkpoint`); none on a journal from before checkpoints;
2. :func:`read_sections`: the parts of that checkpoint it needs (a worker the small
   ``core``; ``scheduled list`` the ``copies`` too, soonest first, as far as it needs);
3. :func:`read_tail`: the journal from the offset the checkpoint covers to a marker of
   the reader's own (a stream has no end to ask for): everything confirmed before it.

:func:`load` does all three into a :class:`~.state.JournalState`; :func:`load_ids`
takes the copies of a few ids afterwards (a cancel's, a reschedule's), so a reader reads
the copies section only when it must, and keeps of it only what it asked for.

Without a checkpoint (a journal from before them, or none written yet) a reader reads
the journal from now - ``max_delay``, as every reader did before checkpoints.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

from ...errors import JournalError
from ..failures import journal_missing, journal_off
from ..layout import Layout
from ..steps import Flow, run_flow
from .checkpoint import (
    COPIES,
    COPIES_AND_BODIES,
    CORE,
    GENESIS,
    HEADER,
    SECTIONS,
    Mark,
    Pointer,
    Section,
    checkpoint_name,
    decode_entries,
)
from .records import (
    RECORDS_PER_WRITE,
    JournalRecord,
    decode_lines,
    decode_records,
    encode_records,
    journal_name,
)
from .state import JournalState, Restorer
from .steps import (
    Append,
    JournalStep,
    JournalWrite,
    Read,
    StreamMessage,
    stream_offset,
)

__all__ = [
    "LATEST_TIMEOUT_S",
    "PROGRESS_EVERY",
    "Clock",
    "JournalFlow",
    "Loaded",
    "Sections",
    "Tail",
    "UntilMarker",
    "append",
    "latest",
    "load",
    "load_core",
    "load_ids",
    "load_sections",
    "new_marker",
    "read_sections",
    "read_tail",
    "require_journal",
    "run",
]

T = TypeVar("T")
Clock = Callable[[], int]
"""Unix ms now: :func:`~rmqdelay.core.clock.now_ms`, or a test's own."""
JournalFlow = Generator[JournalStep, Any, T]
"""A journal call as steps for an adapter to carry out; its return value is the call's."""

PROGRESS_EVERY = 1000
"""A read reports its progress every this many records."""
PARTS_PREFETCH = 16
"""A checkpoint's parts a reader holds unacked (each about 256 KB)."""
LATEST_TIMEOUT_S = 5.0
"""How long the checkpoint stream's last message is waited for: it comes at once unless
the stream is empty (``topology apply`` writes one; a stream declared by hand may not)."""


def run(flow: JournalFlow[T], do: Callable[[JournalStep], object]) -> T:
    """Carry out a flow with ``do`` answering each step (a test's adapter)."""
    return run_flow(cast("Flow[T]", flow), lambda step: do(cast(JournalStep, step)))


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


class UntilMarker:
    """What a reader makes of the journal's messages: every record in order to
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


# ---------------------------------------------------------------- the checkpoint


def latest(layout: Layout, timeout: float) -> JournalFlow[Mark | Literal["missing"] | None]:
    """The checkpoint stream's last message's mark (its ``latest`` names the checkpoint
    to start from); None when the stream is empty, ``missing`` when there is none (a
    journal declared before checkpoints: ``topology apply`` adds it)."""
    found: list[Mark] = []

    def take(message: StreamMessage) -> bool:
        mark = Mark.of_header(message.headers.get(HEADER))
        if mark is not None:
            found.append(mark)
        return mark is not None

    stream = checkpoint_name(layout)
    end = yield Read(stream, "last", take, min(timeout, LATEST_TIMEOUT_S), prefetch=1)
    if end == "missing":
        return "missing"
    return found[0] if found else None


@dataclass
class Sections:
    """How far a read of a checkpoint's sections went."""

    next_offset: int
    """The checkpoint stream offset after the last part read: where to go on from."""
    parts: dict[str, int] = field(default_factory=dict)
    """Parts read, per section."""
    complete: bool = False
    """Every part of the sections asked for was read."""


def read_sections(
    layout: Layout,
    pointer: Pointer,
    take_part: Callable[[Section, bytes], None],
    sections: Collection[Section],
    *,
    timeout: float,
    resume: Sections | None = None,
    enough: Callable[[], bool] | None = None,
) -> JournalFlow[Sections]:
    """Hand ``take_part`` each part of ``sections`` of the checkpoint ``pointer`` names, in
    order, from its begin (or where ``resume``, an earlier read's answer, stopped), until
    all were read or ``enough`` says so after a part. Raises JournalError when the
    checkpoint is no longer in the stream (its retention deleted it)."""
    assert pointer.offset is not None
    wanted = {s: pointer.parts(s) for s in sections}
    done = Sections(pointer.offset, {s: 0 for s in sections}) if resume is None else resume
    done.complete = all(done.parts.get(s, 0) >= n for s, n in wanted.items())
    if done.complete:
        return done
    start = done.next_offset
    first = [-1]

    def take(message: StreamMessage) -> bool:
        if first[0] < 0:
            first[0] = message.offset
        done.next_offset = message.offset + 1
        mark = Mark.of_header(message.headers.get(HEADER))
        if mark is None or mark.id != pointer.id:
            return False  # another checkpoint's part, or a heartbeat
        if mark.part == "commit":
            return True
        if mark.part in wanted:
            done.parts[mark.part] = done.parts.get(mark.part, 0) + 1
            take_part(mark.part, message.body)
        if all(done.parts.get(s, 0) >= n for s, n in wanted.items()):
            done.complete = True
            return True
        return enough is not None and enough()

    end = yield Read(checkpoint_name(layout), start, take, timeout, prefetch=PARTS_PREFETCH)
    if end == "missing":
        raise journal_missing(layout)
    if resume is None and first[0] > pointer.offset:
        raise JournalError(
            f"checkpoint {pointer.id} is no longer in {checkpoint_name(layout)!r} (its "
            "retention deleted it): raise journal_retention, then read again"
        )
    if end != "done":
        raise JournalError(
            f"the checkpoint stream {checkpoint_name(layout)!r} gave nothing for {timeout:g}s "
            f"while checkpoint {pointer.id} was read; try again"
        )
    return done


def load_core(
    layout: Layout, *, timeout: float
) -> JournalFlow[tuple[Pointer, list[dict[str, Any]]]]:
    """The latest checkpoint, and the entries of its core (none without one): where a
    follower of the journal (a worker, a keyed publish) starts. Kept for the caller to
    restore, as a concurrent caller (asyncio) may have restored another's first."""
    entries: list[dict[str, Any]] = []
    pointer = yield from load_sections(
        layout, lambda _section, body: entries.extend(decode_entries(body)), CORE, timeout=timeout
    )
    return pointer, entries


def load_sections(
    layout: Layout,
    take_part: Callable[[Section, bytes], None],
    sections: Collection[Section],
    *,
    timeout: float,
) -> JournalFlow[Pointer]:
    """The latest checkpoint's ``sections``, each part to ``take_part``; returns the
    checkpoint's pointer (GENESIS, and nothing read, when there is none yet)."""
    found = yield from latest(layout, timeout)
    pointer = found.latest if isinstance(found, Mark) else GENESIS
    if pointer.complete:
        yield from read_sections(layout, pointer, take_part, sections, timeout=timeout)
    return pointer


# ---------------------------------------------------------------- the tail


@dataclass
class Tail:
    """What a read of the journal after a checkpoint found."""

    messages: int = 0
    bytes: int = 0
    first: int | None = None
    """The offset of the first message read."""
    end: int | None = None
    """The offset after the last message read: where the next read goes on."""


def read_tail(
    layout: Layout,
    pointer: Pointer,
    on_record: Callable[[JournalRecord], None],
    *,
    timeout: float,
    clock: Clock,
    progress: Callable[[int], None] | None = None,
    wants: Callable[[bytes], bool] | None = None,
) -> JournalFlow[Tail]:
    """Every record after ``pointer``'s checkpoint (or, without one, from now -
    ``max_delay``) to now, in order, to ``on_record``: a marker appended, then the
    journal read until it comes back."""
    name = require_journal(layout, "reading the schedule")
    now = clock()
    marker = new_marker(now)
    yield from append(layout, [marker])
    until = UntilMarker(marker.message_id, on_record, progress, wants)
    tail = Tail()

    def take(message: StreamMessage) -> bool:
        if tail.first is None:
            tail.first = message.offset
        tail.messages += 1
        tail.bytes += len(message.body)
        tail.end = message.offset + 1
        return until(message.body)

    start = (
        pointer.covers if pointer.covers is not None else stream_offset(now - layout.max_delay_ms)
    )
    end = yield Read(name, start, take, timeout)
    if end == "missing":
        raise journal_missing(layout)
    if end != "done":
        raise JournalError(f"the stream {name!r} gave nothing for {timeout:g}s; try again")
    return tail


# ---------------------------------------------------------------- both


@dataclass
class Loaded:
    """What a reader read: its state, the checkpoint it began from, the tail after it."""

    state: JournalState
    pointer: Pointer
    """The checkpoint it began from (:data:`~.checkpoint.GENESIS`: none)."""
    mark: Mark | None
    """The checkpoint stream's last message, when read (None: no checkpoint stream, or
    an empty one): who wrote last, and when (:meth:`~.checkpoint.Mark.quiet`)."""
    tail: Tail

    @property
    def gap(self) -> tuple[int, int] | None:
        """The journal offsets between the checkpoint's end and the first record read,
        when the journal's retention deleted them before a checkpoint covered them."""
        covers, first = self.pointer.covers, self.tail.first
        if covers is None or first is None or first <= covers:
            return None
        return covers, first


def load(
    layout: Layout,
    *,
    copies: bool = False,
    bodies: bool = True,
    timeout: float,
    clock: Clock,
    progress: Callable[[int], None] | None = None,
    wants: Callable[[bytes], bool] | None = None,
    copy_lines: Callable[[bytes], bool] | None = None,
) -> JournalFlow[Loaded]:
    """The journal folded: the latest checkpoint's core (its copies too with ``copies``,
    and their bodies unless not ``bodies``), then the tail after it (its lines ``wants``
    says yes to, markers among them; all by default); ``copy_lines``: which of the
    checkpoint's copies to decode (all by default). Without ``copies`` the state holds
    the tail's copies alone (:attr:`~.view.ScheduleView.loaded`): :func:`load_ids` adds
    some."""
    require_journal(layout, "reading the schedule")
    found = yield from latest(layout, timeout)
    mark = found if isinstance(found, Mark) else None
    pointer = mark.latest if mark is not None else GENESIS
    state = JournalState()
    if pointer.complete:
        sections = (SECTIONS if bodies else (*CORE, *COPIES)) if copies else CORE
        restorer = Restorer(state, ids=None if copies else (), lines=copy_lines)
        yield from read_sections(layout, pointer, restorer.take, sections, timeout=timeout)
        if copies:
            state.view.loaded = None
    tail = yield from read_tail(
        layout, pointer, state.add, timeout=timeout, clock=clock, progress=progress, wants=wants
    )
    return Loaded(state, pointer, mark, tail)


def load_ids(
    layout: Layout,
    loaded: Loaded,
    message_ids: Iterable[str],
    *,
    timeout: float,
    sections: Collection[Section] = COPIES_AND_BODIES,
) -> JournalFlow[None]:
    """Add the checkpoint's copies (and, unless ``sections`` leaves them out, their
    bodies) of ``message_ids`` to a state :func:`load` read without them: the sections
    read through, only the parts that name one of the ids decoded."""
    view = loaded.state.view
    if view.loaded is None:
        return
    wanted = set(message_ids) - view.loaded
    if not wanted:
        return
    if loaded.pointer.complete:
        found = JournalState()
        restorer = Restorer(found, ids=wanted)
        yield from read_sections(layout, loaded.pointer, restorer.take, sections, timeout=timeout)
        view.load(wanted, found.view.copies.values())
    else:
        view.load(wanted, ())
