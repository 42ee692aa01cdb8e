"""Keyed publishes without a broker: validation, the records, the answers, the follower."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqdelay import ConfigurationError, InvalidMessageError, PublishError, Settings
from rmqdelay.core import clock
from rmqdelay.core.journal.key_flows import KeyFollower, keyed_line
from rmqdelay.core.journal.records import JournalRecord, encode_records
from rmqdelay.core.messages import ATTEMPT, DESTINATION, DUE_AT, KEY, amqp_properties
from rmqdelay.core.publishing.publisher import PublisherCore
from rmqdelay.core.publishing.templates import PropertyTemplates, plain_carried
from rmqdelay.core.wire import encode_properties
from rmqdelay.testing import InMemoryPublisher


def test_a_key_needs_an_explicit_choice() -> None:
    publisher = InMemoryPublisher()
    with pytest.raises(InvalidMessageError, match=r'on_conflict="ignore".*on_conflict="replace"'):
        publisher.publish("jobs", b"x", delay="1m", key="k")
    with pytest.raises(InvalidMessageError, match="without key="):
        publisher.publish("jobs", b"x", delay="1m", on_conflict="ignore")
    with pytest.raises(InvalidMessageError, match="must be"):
        publisher.publish("jobs", b"x", delay="1m", key="k", on_conflict="keep")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="non-empty str"):
        publisher.publish("jobs", b"x", delay="1m", key="", on_conflict="ignore")
    with pytest.raises(InvalidMessageError, match="give the key once"):
        publisher.publish(
            "jobs", b"x", delay="1m", key="k", on_conflict="ignore", headers={KEY: "other"}
        )
    assert publisher.sent == []


def test_a_key_needs_the_journal() -> None:
    publisher = InMemoryPublisher(Settings(schedule_journal=False))
    with pytest.raises(ConfigurationError, match="needs the schedule journal"):
        publisher.publish("jobs", b"x", delay="1m", key="k", on_conflict="ignore")


def test_outcomes_scheduled_ignored_replaced() -> None:
    publisher = InMemoryPublisher()
    first = publisher.publish("jobs", b"1", delay="1m", key="k", on_conflict="ignore")
    assert (first.outcome, first.generation, first.key) == ("scheduled", 1, "k")
    second = publisher.publish("jobs", b"2", delay="2m", key="k", on_conflict="ignore")
    assert (second.outcome, second.message_id, second.due_at_ms) == (
        "ignored",
        first.message_id,
        first.due_at_ms,
    )
    assert second.ignored_id == publisher.sent[1].message_id
    third = publisher.publish("jobs", b"3", delay="3m", key="k", on_conflict="replace")
    assert (third.outcome, third.generation, third.replaced_id) == ("replaced", 2, first.message_id)
    assert [s.headers[KEY] for s in publisher.sent] == ["k"] * 3
    recorded = [(r.key, r.on_conflict) for r in publisher.journal]
    assert recorded == [("k", "ignore"), ("k", "ignore"), ("k", "replace")]


def test_publish_many_answers_per_request() -> None:
    publisher = InMemoryPublisher()
    results = publisher.publish_many(
        [
            {
                "destination": "jobs",
                "body": b"a",
                "delay": "1m",
                "key": "a",
                "on_conflict": "ignore",
            },
            {"destination": "jobs", "body": b"b", "delay": "1m"},
            {
                "destination": "jobs",
                "body": b"c",
                "delay": "2m",
                "key": "a",
                "on_conflict": "ignore",
            },
        ]
    )
    assert [r.outcome for r in results] == ["scheduled", "scheduled", "ignored"]
    assert results[2].message_id == results[0].message_id
    assert results[1].key is None


def test_a_retry_carries_its_key_without_a_choice() -> None:
    """A worker's retry republishes the headers: recorded with the key, no ``m``, no
    read-back (it is the same message, not a new publish)."""
    publisher = InMemoryPublisher()
    first = publisher.publish("jobs", b"1", delay="1m", key="k", on_conflict="ignore")
    retry = publisher.publish(
        "jobs", b"1", delay="5m", headers=publisher.sent[0].headers, message_id=first.message_id
    )
    assert retry.key == "k" and retry.generation is None
    assert (publisher.journal[-1].key, publisher.journal[-1].on_conflict) == ("k", None)


def test_a_failed_keyed_publish_frees_its_key() -> None:
    publisher = InMemoryPublisher()
    publisher.fail_next("nack")
    with pytest.raises(PublishError):
        publisher.publish("jobs", b"1", delay="1m", key="k", on_conflict="ignore")
    assert [r.kind for r in publisher.journal] == ["scheduled", "cancelled"]
    again = publisher.publish("jobs", b"2", delay="1m", key="k", on_conflict="ignore")
    assert (again.outcome, again.generation) == ("scheduled", 2)


def test_the_follower_folds_each_message_once() -> None:
    record = JournalRecord("scheduled", "a", "jobs", 10_000, key="k", on_conflict="ignore")
    body = encode_records([record])
    follower = KeyFollower()
    follower.take(5, body)
    follower.take(5, body)  # a consumer reopened earlier gives it again
    follower.take(3, body)
    assert follower.next_offset == 6 and len(follower.book) == 1


def test_unkeyed_scheduled_lines_are_passed_over() -> None:
    plain = encode_records([JournalRecord("scheduled", "a", "jobs", 1)])
    keyed = encode_records([JournalRecord("scheduled", "a", "jobs", 1, key="k")])
    tomb = encode_records([JournalRecord("cancelled", "a", "jobs", 1)])
    assert (keyed_line(plain), keyed_line(keyed), keyed_line(tomb)) == (False, True, True)


def test_reschedule_later_is_a_record_earlier_a_fresh_copy() -> None:
    publisher = InMemoryPublisher(Settings(journal_bodies=True))
    first = publisher.publish("jobs", b"1", delay="10m", key="k", on_conflict="ignore")
    later = publisher.reschedule("k", delay="20m")
    assert (later.outcome, later.message_id, later.fresh_copy) == (
        "rescheduled",
        first.message_id,
        False,
    )
    assert len(publisher.sent) == 1 and publisher.journal[-1].kind == "rescheduled"
    earlier = publisher.reschedule(first.message_id, delay="1m")
    assert (earlier.outcome, earlier.fresh_copy) == ("rescheduled", True)
    fresh = publisher.sent[-1]
    assert (fresh.message_id, fresh.body, fresh.headers[KEY]) == (first.message_id, b"1", "k")
    assert fresh.due_at_ms == earlier.due_at_ms
    moved = publisher.journal[-1]
    assert (moved.kind, moved.fresh_copy, moved.due_at_ms) == ("rescheduled", True, fresh.due_at_ms)
    assert [r.due_at_ms for r in publisher.list_scheduled()] == [fresh.due_at_ms]


def test_an_earlier_copy_is_the_same_message_with_its_properties() -> None:
    """The fresh copy comes from the journal's record: its content type (a JSON body
    stays JSON for the handler) and the caller's properties travel with the body."""
    publisher = InMemoryPublisher(Settings(journal_bodies=True))
    first = publisher.publish(
        "jobs", {"order": 42}, delay="10m", correlation_id="c-1", app_id="shop", priority=3
    )
    earlier = publisher.reschedule(first.message_id, delay="1m")
    assert (earlier.outcome, earlier.fresh_copy) == ("rescheduled", True)
    original, fresh = publisher.sent
    assert fresh.json() == {"order": 42}
    assert dict(fresh.properties) == dict(original.properties)
    assert (fresh.properties["content_type"], fresh.properties["correlation_id"]) == (
        "application/json",
        "c-1",
    )


def test_reschedule_answers_when_it_cannot() -> None:
    publisher = InMemoryPublisher(Settings(journal_bodies=False))  # bodies are kept by default
    assert publisher.reschedule("nothing", delay="1m").outcome == "unknown"
    plain = publisher.publish("jobs", b"1", delay="10m")
    with pytest.raises(ConfigurationError, match="published with journal_bodies = false"):
        publisher.reschedule(plain.message_id, delay="1m")
    publisher.cancel(plain.message_id)
    assert publisher.reschedule(plain.message_id, delay="1h").outcome == "cancelled"
    due = publisher.publish("jobs", b"1", delay=0)
    time.sleep(0.005)  # past its due time, to the ms
    assert publisher.reschedule(due.message_id, delay="1h").outcome == "due"


def test_cancel_by_key_frees_the_key() -> None:
    publisher = InMemoryPublisher()
    first = publisher.publish("jobs", b"1", delay="10m", key="k", on_conflict="ignore")
    found = publisher.cancel(keys=["k", "other"])
    assert [(r.key, r.message_id, r.outcome) for r in found] == [
        ("k", first.message_id, "cancelled"),
        ("other", "", "unknown"),
    ]
    again = publisher.publish("jobs", b"2", delay="10m", key="k", on_conflict="ignore")
    assert (again.outcome, again.generation) == ("scheduled", 2)
    assert publisher.list_scheduled(key="k") == [publisher.journal[-1]]


@given(
    key=st.text(min_size=1, max_size=80),
    attempt=st.integers(1, 5),
    message_id=st.text(min_size=1, max_size=40),
    due=st.integers(2**31, 2**45),
)
def test_a_keyed_template_gives_the_same_bytes(
    key: str, attempt: int, message_id: str, due: int
) -> None:
    templates = PropertyTemplates()
    headers = {ATTEMPT: attempt, KEY: key}
    carried = plain_carried("application/json")
    sent = {**headers, DUE_AT: due, DESTINATION: "jobs"}
    want = encode_properties(amqp_properties(message_id, sent, carried))
    for _ in range(2):  # the template made, then used
        assert templates.encode(message_id, headers, carried, due, "jobs") == want


@pytest.mark.parametrize("body", [b"bytes", "text", {"json": 1}])
def test_the_keyed_fast_path_prepares_what_the_general_one_does(body: object) -> None:
    core = PublisherCore(Settings().layout)
    now = clock.now_us()
    fast = core.prepare("jobs", body, delay="1m", key="order-42", on_conflict="ignore", now=now)
    slow = core.prepare(
        "jobs",
        body,
        delay="1m",
        key="order-42",
        on_conflict="ignore",
        now=now,
        headers={},
        message_id=fast.message_id,
    )
    assert fast == slow


def test_repeated_reschedules_fold_only_what_is_new() -> None:
    """Each reschedule reads on from where the last stopped, on its own reader, and sees
    what came between (a cancel) as a whole read would."""
    publisher = InMemoryPublisher()
    sent = [publisher.publish("jobs", b"1", delay="10m") for _ in range(50)]
    taken: list[int] = []
    read = publisher._read

    def counting(step: Any) -> Any:
        if step.keep != "view":
            return read(step)
        offsets: list[int] = []

        def take(message: Any) -> bool:
            offsets.append(message.offset)
            return bool(step.take(message))

        answer = read(replace(step, take=take))
        taken.append(len(offsets))
        return answer

    publisher._read = counting  # type: ignore[method-assign]
    assert publisher.reschedule(sent[0].message_id, delay="20m").outcome == "rescheduled"
    publisher.cancel(sent[1].message_id)  # a full read of its own: the view hears it after
    assert publisher.reschedule(sent[1].message_id, delay="20m").outcome == "cancelled"
    assert publisher.reschedule(sent[2].message_id, delay="20m").outcome == "rescheduled"
    assert publisher.reschedule(sent[0].message_id, delay="30m").outcome == "rescheduled"
    # the first read the 50 records and its marker; each later one what came since:
    # the last reschedule's record, a cancel (its tombstone; the reader's marker), its marker
    assert taken[0] == 51 and max(taken[1:]) <= 4, taken
