"""The schedule journal's flows run in memory: each step answered by a stream in a list.

What the pika and aio-pika adapters do on a broker (tests/broker/test_journal_stream.py)
is only these two steps; every branch of what to read, when to stop, what to write and
which error to raise is here."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, TypeVar

import pytest

from rmqdelay import ConfigurationError, PublishError, Settings, TopologyError
from rmqdelay.core.clock import ms_of_datetime
from rmqdelay.core.journal import flows
from rmqdelay.core.journal.reading import Clock, JournalFlow, UntilMarker, append, run
from rmqdelay.core.journal.records import (
    RECORDS_PER_WRITE,
    JournalRecord,
    decode_records,
    encode_records,
)
from rmqdelay.core.journal.steps import (
    JOURNAL_TYPE,
    Append,
    JournalStep,
    Read,
    ReadEnd,
    StreamMessage,
    stream_offset,
)
from rmqdelay.core.layout import Layout
from rmqdelay.core.publishing.outgoing import Outcome, PublishResult
from rmqdelay.core.publishing.publisher import PublisherCore
from rmqdelay.core.steps import CheckExchange, CheckQueue, Send, Steps
from rmqdelay.errors import JournalError

T = TypeVar("T")
NOW = 1_800_000_000_000
MAX_DELAY_MS = 3_600_000


def _layout(journal: bool = True) -> Layout:
    return Settings(schedule_journal=journal, max_delay="1h", prefix="flows").layout


class Stream:
    """A journal stream in memory: ``(recorded at, body)`` per message (its offset its
    index), and every step seen. ``missing`` answers as a broker without the stream
    does; ``silent_after`` stops handing messages over after that many (the stream gave
    nothing more). There is no checkpoint stream: the flows read as a journal of before
    checkpoints is read (tests/unit/test_checkpoint_flows.py has both)."""

    def __init__(self, *, missing: bool = False, silent_after: int | None = None) -> None:
        self.messages: list[tuple[int, bytes]] = []
        self.steps: list[JournalStep] = []
        self.missing = missing
        self.silent_after = silent_after

    def do(self, step: JournalStep) -> bool | ReadEnd:
        self.steps.append(step)
        if step.stream.endswith(".checkpoints"):
            return False if isinstance(step, Append) else "missing"
        if isinstance(step, Append):
            if self.missing:
                return False
            self.messages += [(NOW, write.body) for write in step.writes]
            return True
        if self.missing:
            return "missing"
        start = step.start
        since = ms_of_datetime(start) if isinstance(start, datetime) else 0
        first = start if isinstance(start, int) else 0
        handed = [
            StreamMessage(offset, body, {})
            for offset, (at, body) in enumerate(self.messages)
            if offset >= first and at >= since
        ]
        for message in handed[: self.silent_after]:
            if step.take(message):
                return "done"
        return "silent"

    def journal_steps(self) -> list[JournalStep]:
        """The steps on the journal itself (the checkpoint stream's left out)."""
        return [s for s in self.steps if not s.stream.endswith(".checkpoints")]

    def add(self, *records: JournalRecord, at: int = NOW) -> None:
        self.messages += [(at, encode_records([r])) for r in records]

    def records(self) -> list[JournalRecord]:
        return [r for _, body in self.messages for r in decode_records(body)]


def _run(stream: Stream, flow: JournalFlow[T]) -> T:
    return run(flow, stream.do)


def _clock(*times: int) -> Clock:
    """A clock that gives ``times`` in turn, then the last one for ever."""
    given = list(times)
    return lambda: given.pop(0) if len(given) > 1 else given[0]


def _scheduled(message_id: str, due_ms: int, destination: str = "orders") -> JournalRecord:
    return JournalRecord("scheduled", message_id, destination, due_ms, recorded_at_ms=NOW)


# ------------------------------------------------------------------ read


def test_a_read_appends_its_marker_then_returns_every_record_before_it_in_order() -> None:
    stream = Stream()
    written = [_scheduled(f"m{i}", NOW + i) for i in range(5)]
    stream.add(*written)
    stream.add(JournalRecord("marker", "someone-elses-marker"))
    found = _run(stream, flows.read(_layout(), clock=lambda: NOW))
    assert found == written  # other readers' markers are skipped
    append, read = stream.steps
    assert isinstance(append, Append) and isinstance(read, Read)
    [marker] = decode_records(append.writes[0].body)
    assert marker.kind == "marker" and append.writes[0].message_id == marker.message_id
    assert append.stream == read.stream == "flows.schedule"
    assert read.start == stream_offset(NOW - MAX_DELAY_MS)  # the records of the last max_delay


def test_a_read_stops_at_its_own_marker_and_reports_progress() -> None:
    stream = Stream()
    stream.add(*(_scheduled(f"m{i}", NOW) for i in range(2500)))
    seen: list[int] = []
    found = _run(stream, flows.read(_layout(), since_ms=0, progress=seen.append))
    later = _scheduled("after-the-marker", NOW)
    stream.add(later)
    assert len(found) == 2500 and later not in found
    assert seen == [1000, 2000]
    read = stream.steps[-1]
    assert isinstance(read, Read)
    assert read == Read("flows.schedule", stream_offset(0), read.take, 30.0)


def test_the_offset_starts_a_second_early_as_amqp_timestamps_are_whole_seconds() -> None:
    assert stream_offset(1_700_000_000_999) == datetime(
        2023, 11, 14, 22, 13, 19, tzinfo=timezone.utc
    )
    assert stream_offset(0) == datetime(1970, 1, 1, tzinfo=timezone.utc)


def test_a_read_of_a_missing_stream_names_topology_apply() -> None:
    with pytest.raises(TopologyError, match="topology apply"):
        _run(Stream(missing=True), flows.read(_layout()))


def test_a_stream_that_never_reaches_the_marker_is_a_journal_error() -> None:
    stream = Stream(silent_after=0)
    with pytest.raises(JournalError, match="gave nothing for 2s"):
        _run(stream, flows.read(_layout(), timeout=2))


def test_with_the_journal_off_no_step_is_taken_and_the_error_names_the_setting() -> None:
    for flow in (
        flows.read(_layout(False)),
        flows.list_scheduled(_layout(False)),
        flows.cancel(_layout(False), ["x"]),
        append(_layout(False), [_scheduled("x", NOW)]),
        flows.probe(_layout(False)),
    ):
        stream = Stream()
        with pytest.raises(ConfigurationError, match="schedule_journal"):
            _run(stream, flow)
        assert stream.steps == []


def test_until_marker_goes_on_after_its_marker_for_a_tail() -> None:
    taken: list[JournalRecord] = []
    reader = UntilMarker("mine", taken.append)
    first, mine, later = _scheduled("a", 1), JournalRecord("marker", "mine"), _scheduled("b", 2)
    assert reader(encode_records([first])) is False
    assert reader(encode_records([mine])) is True and reader.reached
    assert reader(encode_records([later])) is False and reader.reached
    assert taken == [first, later] and reader.count == 2


# ------------------------------------------------------------------ append and probe


def test_an_append_writes_a_few_hundred_records_a_message() -> None:
    stream = Stream()
    records = [_scheduled(f"m{i}", NOW + i) for i in range(RECORDS_PER_WRITE * 2 + 1)]
    _run(stream, append(_layout(), records))
    [written] = stream.steps
    assert isinstance(written, Append)
    assert [w.message_id for w in written.writes] == ["m0", f"m{RECORDS_PER_WRITE}", "m1000"]
    assert written.writes[0].properties == {
        "message_id": "m0",
        "type": JOURNAL_TYPE,
        "content_type": "application/json",
        "delivery_mode": 2,
    }
    assert stream.records() == records


def test_an_append_of_nothing_takes_no_step_and_a_missing_stream_raises() -> None:
    stream = Stream()
    _run(stream, append(_layout(), []))
    assert stream.steps == []
    with pytest.raises(TopologyError, match="does not exist"):
        _run(Stream(missing=True), append(_layout(), [_scheduled("x", NOW)]))


def test_a_probe_appends_one_marker_that_readers_skip() -> None:
    stream = Stream()
    _run(stream, flows.probe(_layout(), clock=lambda: NOW))
    [marker] = stream.records()
    assert (marker.kind, marker.recorded_at_ms) == ("marker", NOW)
    assert _run(stream, flows.read(_layout())) == []


# ------------------------------------------------------------------ list and cancel


def test_list_shows_every_copy_ahead_not_cancelled_with_its_filters() -> None:
    stream = Stream()
    stream.add(
        _scheduled("past", NOW - 1),
        _scheduled("a", NOW + 30),
        _scheduled("b", NOW + 10, "emails"),
        _scheduled("a", NOW + 20),  # a second copy of a
        _scheduled("gone", NOW + 5),
        JournalRecord("cancelled", "gone", "orders", NOW + 5),
    )
    layout = _layout()

    def listed(**filters: Any) -> list[tuple[str, int]]:
        flow = flows.list_scheduled(layout, clock=lambda: NOW, **filters)
        return [(r.message_id, r.due_at_ms - NOW) for r in _run(stream, flow)]

    assert listed() == [("b", 10), ("a", 20), ("a", 30)]
    assert listed(destination="orders") == [("a", 20), ("a", 30)]
    assert listed(due_before_ms=NOW + 20) == [("b", 10)]
    assert listed(limit=1) == [("b", 10)]


def test_list_takes_now_after_reading() -> None:
    """A long read: what fell due meanwhile is not listed."""
    stream = Stream()
    stream.add(_scheduled("soon", NOW + 1_000), _scheduled("later", NOW + 9_000))
    clock = _clock(NOW, NOW + 5_000)  # the marker (and where to start), the fold
    found = _run(stream, flows.list_scheduled(_layout(), clock=clock))
    assert [r.message_id for r in found] == ["later"]


def test_cancel_answers_for_each_id_and_tombstones_those_still_ahead() -> None:
    stream = Stream()
    stream.add(_scheduled("ahead", NOW + 100), _scheduled("due", NOW - 100))
    stream.add(_scheduled("twice", NOW - 50), _scheduled("twice", NOW + 50))
    results = _run(
        stream,
        flows.cancel(_layout(), ["ahead", "due", "nobody", "twice", "ahead"], clock=lambda: NOW),
    )
    assert [(r.message_id, r.outcome) for r in results] == [
        ("ahead", "cancelled"),
        ("due", "too late"),
        ("nobody", "unknown"),
        ("twice", "cancelled"),
    ]
    assert results[3].cancelled_due_ms == (NOW + 50,) and results[3].copies == 2
    tombstones = [r for r in stream.records() if r.kind == "cancelled"]
    assert [(t.message_id, t.named_due_times()) for t in tombstones] == [
        ("ahead", (NOW + 100,)),
        ("twice", (NOW - 50, NOW + 50)),  # every copy, the one already due too
    ]
    again = _run(stream, flows.cancel(_layout(), ["ahead"], clock=lambda: NOW))
    assert again[0].outcome == "cancelled"  # a second cancel answers as the first did


def test_a_cancel_with_nothing_ahead_writes_nothing() -> None:
    stream = Stream()
    stream.add(_scheduled("due", NOW - 1))
    [result] = _run(stream, flows.cancel(_layout(), ["due"], clock=lambda: NOW))
    assert result.outcome == "too late"
    # the latest checkpoint (none), the marker, the read: no tombstone
    assert [type(s) for s in stream.journal_steps()] == [Append, Read]


def test_a_cancel_whose_tombstone_finds_no_stream_raises() -> None:
    """The stream went between the read and the write: the cancel must not say done."""
    stream = Stream()
    stream.add(_scheduled("ahead", NOW + 100))
    flow = flows.cancel(_layout(), ["ahead"], clock=lambda: NOW)

    def gone_after_read(step: JournalStep) -> object:
        if isinstance(step, Append) and stream.journal_steps():
            stream.missing = True
        return stream.do(step)

    with pytest.raises(TopologyError, match="does not exist"):
        run(flow, gone_after_read)


# ------------------------------------------------------------------ a publish's record


def _publish(
    core: PublisherCore, requests: list[dict[str, object]], journal_write: Outcome | None
) -> list[PublishResult] | BaseException:
    """``publish_many`` with every message confirmed and the journal write answered
    ``journal_write`` (None: confirmed too)."""
    steps = Steps(core.publish_many(requests))
    answer: object = None
    try:
        while (step := steps.next(answer)) is not None:
            if isinstance(step, (CheckQueue, CheckExchange)):
                answer = isinstance(step, CheckQueue)  # no destination is held here
                continue
            if isinstance(step, Read):  # is a checkpoint due? no checkpoint stream here
                answer = "missing"
                continue
            assert isinstance(step, Send)
            outcomes: list[Outcome] = []
            for prepared in step.batch:
                confirmed = PublishResult.of(core.finalize(prepared))
                outcomes.append(
                    journal_write or confirmed if prepared.journal_records else confirmed
                )
            answer = outcomes
    except BaseException as exc:
        return exc
    assert steps.value is not None
    return steps.value


def test_a_message_confirmed_whose_record_was_not_is_an_error_naming_list_and_cancel() -> None:
    """Delivered, but neither listed nor cancellable: the caller must hear of it."""
    core = PublisherCore(_layout())
    requests: list[dict[str, object]] = [
        {"destination": "orders", "body": b"x", "delay": 10, "message_id": f"m{i}"}
        for i in range(3)
    ]
    failed = _publish(core, requests, PublishError("the stream nacked"))
    assert isinstance(failed, PublishError)
    failures = failed.failures  # type: ignore[attr-defined]
    assert sorted(failures) == ["m0", "m1", "m2"]
    assert "confirmed but its schedule journal record was not" in str(failures["m0"])
    assert "the stream nacked" in str(failures["m0"])
    assert "`scheduled list` and `cancel` may not see it" in str(failures["m0"])
    fine = _publish(PublisherCore(_layout()), requests, None)
    assert [r.message_id for r in fine] == ["m0", "m1", "m2"]  # type: ignore[union-attr]
