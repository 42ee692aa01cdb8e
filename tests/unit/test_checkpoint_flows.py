"""Checkpoints written and read by the flows, on the in-memory broker's two streams.

The writer (rmqdelay/core/journal/writer.py) and every reader (reading.py, flows.py, the
keyed publish's and the reschedule's followers), step by step: what they read, what they
answer, and what happens when a writer is cut off, two write at once, a reader starts
during a checkpoint, or records come while one is written. The answers are held to a
fold of the whole journal (:func:`read_view` of a journal without checkpoints)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from rmqdelay import InMemoryPublisher, Settings
from rmqdelay.core.clock import now_ms
from rmqdelay.core.journal import flows
from rmqdelay.core.journal.checkpoint import (
    GENESIS,
    HEADER,
    LEASE_MS,
    QUIET_MS,
    SETTLE_MS,
    Mark,
    checkpoint_name,
)
from rmqdelay.core.journal.reading import append, latest, load
from rmqdelay.core.journal.records import JournalRecord
from rmqdelay.core.journal.steps import Append, Read, StreamMessage
from rmqdelay.core.journal.writer import Written, heartbeat, write
from rmqdelay.core.steps import Flow, Steps

T = TypeVar("T")
MIN = 60_000
NOW = 1_900_000_000_000
SETTINGS = Settings(prefix="ckpt-flows", max_delay="1d")
LAYOUT = SETTINGS.layout


class Broker:
    """The in-memory publisher's broker, with every message a read handed over counted
    per stream."""

    def __init__(self) -> None:
        self.publisher = InMemoryPublisher(SETTINGS)
        self.taken: dict[str, int] = {}
        read = self.publisher._read

        def counting(step: Read) -> Any:
            def take(message: StreamMessage) -> bool:
                self.taken[step.stream] = self.taken.get(step.stream, 0) + 1
                return step.take(message)

            return read(replace(step, take=take))

        self.publisher._read = counting  # type: ignore[method-assign]

    def run(self, flow: Flow[T]) -> T:
        return self.publisher._run(flow)

    def read_from_journal(self, do: Callable[[], T]) -> tuple[T, int, int]:
        """What ``do`` answers, and how many journal and checkpoint messages it read."""
        self.taken.clear()
        answer = do()
        journal = self.taken.get(f"{LAYOUT.prefix}.schedule", 0)
        return answer, journal, self.taken.get(checkpoint_name(LAYOUT), 0)

    def add(self, *records: JournalRecord) -> None:
        self.run(append(LAYOUT, list(records)))

    def write(self, at: int, writer: str = "w1") -> Written:
        return self.run(write(LAYOUT, writer=writer, timeout=5, clock=lambda: at))

    def listed(self, now: int, **filters: Any) -> list[str]:
        rows = self.run(flows.list_scheduled(LAYOUT, clock=lambda: now, **filters))
        return [f"{r.message_id}@{(r.due_at_ms - NOW) // MIN}" for r in rows]


def scheduled(message_id: str, due_min: int, at_min: int = 0, **fields: Any) -> JournalRecord:
    return JournalRecord(
        "scheduled",
        message_id,
        fields.pop("destination", "orders"),
        NOW + due_min * MIN,
        recorded_at_ms=NOW + at_min * MIN,
        **fields,
    )


def history(broker: Broker, count: int) -> None:
    """Records of messages delivered long ago (an hour before NOW and earlier)."""
    broker.add(*(scheduled(f"old{i}", -60 - i % 30, -61 - i % 30) for i in range(count)))


# ------------------------------------------------------------------ readers


def test_readers_start_from_the_checkpoint_and_read_only_the_tail() -> None:
    broker = Broker()
    history(broker, 3000)
    broker.add(*(scheduled(f"p{i}", 10 + i) for i in range(20)))
    whole = broker.listed(NOW)
    assert len(whole) == 20
    written = broker.write(NOW)
    assert written.outcome == "written" and written.pointer is not None
    # the delivered history is not in it: 20 copies, no more
    assert written.pointer.entries("copies") == 20
    broker.add(scheduled("new", 5), JournalRecord("cancelled", "p0", "orders", NOW + 10 * MIN))
    listed, journal, parts = broker.read_from_journal(lambda: broker.listed(NOW))
    assert listed == ["new@5", *[w for w in whole if not w.startswith("p0@")]]
    assert journal <= 3  # the tail: two records and the reader's own marker
    assert parts >= 1
    # a cancel reads the checkpoint's copies for its id, and answers as before
    [result], journal, _ = broker.read_from_journal(
        lambda: broker.run(flows.cancel(LAYOUT, ["p3"], clock=lambda: NOW))
    )
    assert (result.outcome, result.due_at_ms) == ("cancelled", NOW + 13 * MIN)
    assert journal <= 4  # and the marker the list before appended
    [again] = broker.run(flows.cancel(LAYOUT, ["old5"], clock=lambda: NOW))
    assert again.outcome == "unknown"  # settled long ago: forgotten, as past max_delay before


def test_a_first_page_reads_the_checkpoints_copies_only_as_far_as_it_needs() -> None:
    broker = Broker()
    # enough pending copies for several parts of the copies section
    broker.add(*(scheduled(f"p{i:05d}", 10 + i // 100, destination="d") for i in range(20_000)))
    written = broker.write(NOW)
    assert written.pointer is not None and written.pointer.parts("copies") >= 8
    page, _, parts = broker.read_from_journal(lambda: broker.listed(NOW, limit=5))
    assert page == [f"p{i:05d}@10" for i in range(5)]
    assert parts <= 3  # the pointer, the core's and the first copies' parts, no more
    whole, _, all_parts = broker.read_from_journal(lambda: broker.listed(NOW))
    assert len(whole) == 20_000 and all_parts > written.pointer.parts("copies")
    # the tail can take copies off the first page: the page still has five
    broker.add(
        *(
            JournalRecord("cancelled", f"p{i:05d}", "d", NOW + (10 + i // 100) * MIN)
            for i in range(300)
        )
    )
    assert broker.listed(NOW, limit=5) == [f"p{i:05d}@13" for i in range(300, 305)]


def test_keys_and_reschedules_start_from_the_checkpoint() -> None:
    """On the wall clock: the in-memory publisher records with it."""
    broker = Broker()
    publisher = broker.publisher
    first = publisher.publish("orders", b"1", delay="2h", key="k", on_conflict="ignore")
    moved = publisher.publish("orders", b"m", delay="2h")
    written = broker.write(now_ms())
    assert written.pointer is not None and written.pointer.entries("core") == 1  # the key's
    fresh = InMemoryPublisher(SETTINGS)
    fresh._broker = publisher._broker  # another process, the same broker
    again = fresh.publish("orders", b"2", delay="3h", key="k", on_conflict="ignore")
    assert (again.outcome, again.message_id) == ("ignored", first.message_id)
    assert fresh.reschedule(moved.message_id, delay="4h").outcome == "rescheduled"
    assert fresh.reschedule("k", delay="5h").outcome == "rescheduled"
    rows = fresh.list_scheduled()
    assert {r.message_id for r in rows} == {first.message_id, moved.message_id}


def test_a_second_checkpoint_merges_the_first_with_the_tail() -> None:
    broker = Broker()
    broker.add(*(scheduled(f"p{i}", 10 + i) for i in range(50)))
    broker.write(NOW)
    broker.add(
        scheduled("q", 15),
        JournalRecord("cancelled", "p1", "orders", NOW + 11 * MIN),
        JournalRecord(
            "rescheduled", "p2", "orders", NOW + 90 * MIN, cancels_due_ms=(NOW + 12 * MIN,)
        ),
    )
    expected = broker.listed(NOW + 20 * MIN)
    second = broker.write(NOW + 20 * MIN)
    assert second.pointer is not None
    # copies due more than the margin before the second one's time are left out
    settled = [i for i in range(50) if NOW + (10 + i) * MIN < NOW + 20 * MIN - SETTLE_MS]
    assert second.pointer.entries("copies") == 51 - len(settled)
    assert broker.listed(NOW + 20 * MIN) == expected
    assert "p2@90" in expected


# ------------------------------------------------------------------ writers


def _until(flow: Flow[T], do: Callable[[Any], Any], last: Callable[[Any], bool]) -> Steps[T]:
    """Carry out a flow's steps up to the first that ``last`` holds for, and leave it
    there (a process killed once that step was done)."""
    steps = Steps(flow)
    step = steps.next()
    while step is not None:
        answer = do(step)
        if last(step):
            return steps
        step = steps.next(answer)
    raise AssertionError("the flow ended before the step it was to stop at")


def _part(name: str) -> Callable[[Any], bool]:
    """Whether a step appends a checkpoint part of section ``name``."""

    def appends(step: Any) -> bool:
        if not isinstance(step, Append):
            return False
        marks = [Mark.of_header(w.headers.get(HEADER)) for w in step.writes]
        return any(m is not None and m.part == name for m in marks)

    return appends


def test_a_writer_cut_off_half_way_leaves_the_previous_checkpoint_to_readers() -> None:
    broker = Broker()
    broker.add(*(scheduled(f"p{i}", 10 + i) for i in range(30)))
    first = broker.write(NOW)
    broker.add(scheduled("later", 5))
    expected = broker.listed(NOW)
    # a second writer, killed once it wrote its begin, its core and its copies
    flow = write(LAYOUT, writer="w2", timeout=5, clock=lambda: NOW + 1)
    _until(flow, broker.publisher._do, _part("copies"))
    mark = broker.run(latest(LAYOUT, 5))
    assert isinstance(mark, Mark) and mark.part != "commit"
    assert first.pointer is not None and mark.latest.id == first.pointer.id
    assert broker.listed(NOW) == expected  # from the first one, and the tail
    # another writer waits out the cut-off one's lease, then writes
    assert broker.write(NOW + 2, writer="w3").outcome == "busy"
    third = broker.write(NOW + 2 + LEASE_MS, writer="w3")
    assert third.outcome == "written"
    assert broker.listed(NOW) == expected


def test_two_writers_at_once_write_two_equivalent_checkpoints() -> None:
    broker = Broker()
    broker.add(*(scheduled(f"p{i}", 10 + i) for i in range(30)))
    expected = broker.listed(NOW)
    one = Steps(write(LAYOUT, writer="a", timeout=5, clock=lambda: NOW))
    two = Steps(write(LAYOUT, writer="b", timeout=5, clock=lambda: NOW))
    step_one, step_two = one.next(), two.next()
    # both read the stream's last message before either began: neither sees the other
    while step_one is not None or step_two is not None:
        if step_one is not None:
            step_one = one.next(broker.publisher._do(step_one))
        if step_two is not None:
            step_two = two.next(broker.publisher._do(step_two))
    assert one.value is not None and two.value is not None
    assert (one.value.outcome, two.value.outcome) == ("written", "written")
    assert one.value.pointer is not None and two.value.pointer is not None
    assert one.value.pointer.sections == two.value.pointer.sections
    assert broker.listed(NOW) == expected


def test_records_written_during_a_checkpoint_are_in_the_next_tail() -> None:
    broker = Broker()
    broker.add(*(scheduled(f"p{i}", 10 + i) for i in range(30)))
    steps = Steps(write(LAYOUT, writer="a", timeout=5, clock=lambda: NOW))
    step = steps.next()
    added = False
    while step is not None:
        answer = broker.publisher._do(step)
        if not added and isinstance(step, Read) and step.stream == f"{LAYOUT.prefix}.schedule":
            broker.add(scheduled("during", 7))  # once the writer read to its marker
            added = True
        step = steps.next(answer)
    assert steps.value is not None and steps.value.outcome == "written"
    assert added and steps.value.pointer is not None
    assert steps.value.pointer.entries("copies") == 30  # not "during": after its marker
    assert "during@7" in broker.listed(NOW)


def test_a_reader_during_a_checkpoint_uses_the_previous_one() -> None:
    broker = Broker()
    broker.add(*(scheduled(f"p{i}", 10 + i) for i in range(30)))
    broker.add(JournalRecord("cancelled", "p4", "orders", NOW + 14 * MIN))  # in the core
    first = broker.write(NOW)
    broker.add(scheduled("x", 3))
    expected = broker.listed(NOW)
    flow = write(LAYOUT, writer="b", timeout=5, clock=lambda: NOW)
    half = _until(flow, broker.publisher._do, _part("core"))
    assert half.value is None
    loaded = broker.run(load(LAYOUT, timeout=5, clock=lambda: NOW))
    assert first.pointer is not None and loaded.pointer.id == first.pointer.id
    assert broker.listed(NOW) == expected


def test_a_heartbeat_names_the_latest_checkpoint_and_keeps_publishers_from_writing() -> None:
    broker = Broker()
    broker.add(scheduled("a", 10))
    written = broker.write(NOW)
    before = broker.run(latest(LAYOUT, 5))
    assert isinstance(before, Mark)
    broker.run(heartbeat(LAYOUT, before, writer="w", clock=lambda: NOW))
    mark = broker.run(latest(LAYOUT, 5))
    assert isinstance(mark, Mark) and mark.part == "alive"
    assert written.pointer is not None and mark.latest == written.pointer
    assert not mark.quiet(NOW + QUIET_MS - 1) and mark.quiet(NOW + QUIET_MS)


def test_a_publisher_writes_a_checkpoint_when_no_writer_spoke_for_a_while() -> None:
    publisher = InMemoryPublisher(SETTINGS)
    publisher.publish("orders", b"x", delay="1h")
    # an old heartbeat: nothing has written a checkpoint since
    old = Mark("beat", "alive", 0, 0, "gone", GENESIS)
    message = StreamMessage(0, b"", {HEADER: old.header()})
    publisher._broker.checkpoints.append(message)
    publisher.core._checkpoint_check_ms = 0
    publisher.publish("orders", b"y", delay="1h")
    found = publisher._run(latest(LAYOUT, 5))
    assert isinstance(found, Mark) and found.part == "commit"
    assert found.latest.entries("copies") == 2
    # a writer that spoke recently keeps the next publish from writing one
    publisher.core._checkpoint_check_ms = 0
    publisher.publish("orders", b"z", delay="1h")
    assert publisher._run(latest(LAYOUT, 5)) == found


def test_the_journal_without_a_checkpoint_stream_is_read_as_before_checkpoints() -> None:
    broker = Broker()
    broker.publisher._broker.journal_exists = True
    broker.add(scheduled("a", 10), scheduled("b", 20))
    assert broker.listed(NOW) == ["a@10", "b@20"]
    loaded = broker.run(load(LAYOUT, timeout=5, clock=lambda: NOW))
    assert not loaded.pointer.complete  # no checkpoint yet: from now - max_delay
