"""Selective purge (``cancel_matching``): the filters, every copy, keys, reschedules,
recurring occurrences, the count before the write, on the in-memory publishers (the
same flows as the real ones; tests/broker/test_purge.py runs them on a broker)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqdelay import Settings
from rmqdelay.core.journal.purge import PurgeResult, Selection, _text
from rmqdelay.core.journal.records import JournalRecord, encode_record
from rmqdelay.testing import AsyncInMemoryPublisher, InMemoryPublisher


def memory() -> InMemoryPublisher:
    return InMemoryPublisher(Settings(max_delay="1d"))


def pending_ids(stub: InMemoryPublisher) -> set[str]:
    return {r.message_id for r in stub.list_scheduled()}


def test_each_filter_selects_alone_and_together() -> None:
    stub = memory()
    now = stub.now()
    stub.publish("orders", b"", delay="1m", message_id="o1", headers={"tenant": "a", "n": 7})
    stub.publish("orders", b"", delay="10m", message_id="o2", headers={"tenant": "b"})
    stub.publish("orders", b"", delay="20m", message_id="o3", key="order-3", on_conflict="ignore")
    stub.publish("emails", b"", delay="5m", message_id="e1", headers={"tenant": "a"})
    stub.publish("emails", b"", delay="30m", message_id="e2", key="mail-2", on_conflict="ignore")

    before = stub.journal[:]
    dry = stub.cancel_matching(destination="orders", dry_run=True)
    assert stub.journal == before  # a dry run writes nothing
    assert dry.dry_run and dry.cancelled == 0 and dry.copies == 3
    assert dry.describe().startswith("would cancel 3 message(s) (3 copies, due ")
    assert stub.cancel_matching(destination="orders", dry_run=True).messages == 3
    assert stub.cancel_matching(destination="emails", dry_run=True).by_destination == {"emails": 2}
    assert stub.cancel_matching(due_before=now + timedelta(minutes=6), dry_run=True).messages == 2
    assert stub.cancel_matching(due_after=now + timedelta(minutes=10), dry_run=True).messages == 3
    assert stub.cancel_matching(headers={"tenant": "a"}, dry_run=True).messages == 2
    assert stub.cancel_matching(headers={"n": "7"}, dry_run=True).messages == 1  # as text
    assert stub.cancel_matching(key_prefix="order-", dry_run=True).messages == 1
    assert stub.cancel_matching(key_prefix="", dry_run=True).messages == 2  # every keyed one
    both = stub.cancel_matching(destination="emails", headers={"tenant": "a"})
    assert (both.messages, both.cancelled, both.copies) == (1, 1, 1)
    assert pending_ids(stub) == {"o1", "o2", "o3", "e2"}


def test_a_message_is_cancelled_whole_every_copy() -> None:
    """A copy sent again (a retry, a publish repeated after a failed confirm) and a
    rescheduled message leave nothing behind, whichever copy matched."""
    stub = memory()
    now = stub.now()
    stub.publish("orders", b"", delay="1m", message_id="twice")
    stub.publish("orders", b"", delay="40m", message_id="twice")  # a second copy
    stub.publish("orders", b"", delay="2m", message_id="moved", key="k-moved", on_conflict="ignore")
    assert stub.reschedule("moved", delay="50m").outcome == "rescheduled"
    stub.publish("orders", b"", delay="3m", message_id="stays")
    result = stub.cancel_matching(destination="orders", due_after=now + timedelta(minutes=30))
    assert (result.messages, result.cancelled) == (2, 2)
    # the copies still ahead, those the filter did not select too: twice@1m and @40m,
    # and moved's copy waiting in the tiers at 2m (a later time is a record, not a copy)
    assert result.copies == 3
    assert pending_ids(stub) == {"stays"}
    assert stub.cancel(*("twice", "moved"))[0].outcome == "cancelled"  # as cancel answers
    assert stub.cancel_matching(destination="orders", due_after=now).messages == 1  # stays


def test_the_count_comes_first_and_is_what_is_cancelled() -> None:
    stub = memory()
    for n in range(5):
        stub.publish("orders", b"", delay=f"{n + 1}m", message_id=f"m{n}")
    seen: list[PurgeResult] = []

    def no(found: PurgeResult) -> bool:
        seen.append(found)
        return False

    refused = stub.cancel_matching(destination="orders", confirm=no)
    assert not refused.confirmed and refused.cancelled == 0 and seen[0].messages == 5
    assert len(pending_ids(stub)) == 5
    done = stub.cancel_matching(destination="orders", confirm=lambda r: r.messages == 5)
    assert done.confirmed and done.cancelled == 5 and not pending_ids(stub)
    assert "cancelled 5 of 5 message(s) (5 copies, due " in done.describe()
    assert done.to_json()["by_destination"] == {"orders": 5}


def test_recurring_occurrences_are_left_alone_and_counted() -> None:
    stub = memory()
    stub.add_recurring("daily", "reports", b"", every="1h")
    stub.publish("reports", b"", delay="5m", message_id="one-off")
    result = stub.cancel_matching(destination="reports")
    assert (result.messages, result.recurring) == (1, 1)
    assert "recurring remove" in result.describe()
    assert [s.name for s in stub.list_recurring()] == ["daily"]
    assert any(r.key and r.key.startswith("recurring:") for r in stub.list_scheduled())


def test_no_filter_is_refused_naming_the_filters() -> None:
    with pytest.raises(ValueError, match=r"needs a filter .*destination"):
        memory().cancel_matching()
    with pytest.raises(ValueError, match="needs a filter"):
        memory().cancel_matching(headers={})


async def test_the_async_publisher_offers_the_same() -> None:
    stub = AsyncInMemoryPublisher(Settings(max_delay="1d"))
    await stub.publish("orders", b"", delay="1m", headers={"tenant": "a"})
    assert (await stub.cancel_matching(headers={"tenant": "a"})).cancelled == 1
    assert await stub.list_scheduled() == []


RECORD = st.builds(
    JournalRecord,
    kind=st.just("scheduled"),
    message_id=st.text("ab", min_size=1, max_size=2),
    destination=st.sampled_from(["orders", "emails"]),
    due_at_ms=st.integers(min_value=1, max_value=100),
    headers=st.dictionaries(st.sampled_from(["t", "n"]), st.sampled_from(["a", "b", 1, True])),
    key=st.one_of(st.none(), st.sampled_from(["order-1", "mail-1"])),
)


@settings(max_examples=300)
@given(
    RECORD,
    st.one_of(st.none(), st.sampled_from(["orders", "emails"])),
    st.one_of(st.none(), st.integers(min_value=0, max_value=101)),
    st.one_of(st.none(), st.integers(min_value=0, max_value=101)),
    st.dictionaries(st.sampled_from(["t", "n"]), st.sampled_from(["a", "b", "1", "true"])),
    st.one_of(st.none(), st.sampled_from(["", "order", "mail-1", "x"])),
)
def test_a_selection_matches_when_every_filter_given_does(
    record: JournalRecord,
    destination: str | None,
    before: int | None,
    after: int | None,
    headers: dict[str, str],
    key_prefix: str | None,
) -> None:
    selection = Selection(destination, before, after, headers, key_prefix)

    def text(value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)  # the sampled values: text and numbers

    each = [
        destination is None or record.destination == destination,
        before is None or record.due_at_ms < before,
        after is None or record.due_at_ms > after,
        all(k in record.headers and text(record.headers[k]) == v for k, v in headers.items()),
        key_prefix is None or (record.key is not None and record.key.startswith(key_prefix)),
    ]
    assert selection.matches(record) == all(each)


TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6)


@settings(max_examples=500)
@given(
    st.builds(
        JournalRecord,
        kind=st.just("scheduled"),
        message_id=TEXT.filter(bool),
        destination=TEXT,
        due_at_ms=st.integers(min_value=1, max_value=10**13),
        headers=st.dictionaries(
            TEXT,
            st.one_of(
                TEXT,
                st.integers(),
                st.booleans(),
                st.none(),
                st.dictionaries(TEXT, st.integers(), max_size=2),
            ),
            max_size=3,
        ),
        key=st.one_of(st.none(), TEXT),
    ),
    st.data(),
)
def test_the_byte_test_lets_by_every_line_whose_copy_matches(
    record: JournalRecord, data: st.DataObject
) -> None:
    """A purge decodes only the checkpoint lines its byte test lets by: every copy that
    matches must be among them, however its text is written (escaped or raw UTF-8)."""
    headers = {k: _text(v) for k, v in record.headers.items()}  # as a user would write them
    selection = Selection(
        data.draw(st.sampled_from([None, record.destination])),
        None,
        None,
        data.draw(st.dictionaries(st.sampled_from(sorted(headers) or [""]), TEXT, max_size=2))
        if not headers or data.draw(st.booleans())
        else dict(list(headers.items())[:1]),
        data.draw(st.sampled_from([None, (record.key or "")[:2]])),
    )
    test = selection.lines()
    if test is None or not selection.matches(record):
        return
    line = encode_record(record)
    assert test(line)
    raw = json.dumps(json.loads(line), ensure_ascii=False)  # other writers: raw UTF-8,
    assert test(raw.encode())
    for char, escaped in (("/", "\\/"), ("<", "\\u003c"), ("&", "\\u0026")):
        raw = raw.replace(char, escaped)  # PHP's slashes, Go's HTML-safe characters
    assert test(raw.encode())
