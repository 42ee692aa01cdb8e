"""The publish path's shortcuts give exactly the bytes of the general code they skip.

Each fast path (frames written by rmqdelay, property templates, the journal's usual
line, the field table's common entries, the message id) is checked against the slow,
general code it stands in for, or against the client library's own encoder.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pika.frame
import pika.spec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqdelay import Settings
from rmqdelay.amqp.publisher import pika_properties
from rmqdelay.core import wire
from rmqdelay.core.journal import JournalRecord, encode_record, encode_scheduled
from rmqdelay.core.messages import ATTEMPT, CARRIED, DESTINATION, DUE_AT, amqp_properties
from rmqdelay.core.publisher_core import PublisherCore
from rmqdelay.core.templates import PropertyTemplates, new_message_id
from rmqdelay.errors import InvalidMessageError

CORE = PublisherCore(Settings(max_delay="2h").layout)
texts = st.text(max_size=40)
short_names = st.text("abcdefghijklmnopqrstuvwxyz-._0123456789", min_size=1, max_size=40)


@given(
    channel=st.integers(1, 2047),
    exchange=short_names,
    key=short_names,
    body=st.binary(max_size=300),
    frame_max=st.sampled_from([64, 100, 4096, wire.FRAME_MAX]),
    mandatory=st.booleans(),
)
def test_publish_frames_are_pikas_frames(
    channel: int, exchange: str, key: str, body: bytes, frame_max: int, mandatory: bool
) -> None:
    prepared = CORE.prepare("orders", body, delay="5m", correlation_id="c-1")
    properties = prepared.encoded_properties
    method = pika.spec.Basic.Publish(exchange=exchange, routing_key=key, mandatory=mandatory)
    expected = [
        pika.frame.Method(channel, method).marshal(),
        pika.frame.Header(channel, len(body), pika_properties(prepared)).marshal(),
    ]
    step = frame_max - 8
    expected += [
        pika.frame.Body(channel, body[i : i + step]).marshal() for i in range(0, len(body), step)
    ]
    got = wire.encode_publish(
        channel, exchange, key, properties, body, mandatory=mandatory, frame_max=frame_max
    )
    assert got == b"".join(expected)


def test_publish_frames_refuse_a_key_amqp_cannot_carry() -> None:
    with pytest.raises(InvalidMessageError, match="routing key"):
        wire.encode_publish(1, "x", "k" * 256, b"\x00\x00", b"")


optional_text = st.none() | st.text(max_size=20) | st.just("application/json")


@given(
    destination=short_names,
    attempt=st.integers(-(2**40), 2**40),
    carried=st.fixed_dictionaries({name: optional_text for name in CARRIED if name != "priority"}),
    priority=st.none() | st.integers(0, 255),
    message_id=st.text(min_size=1, max_size=60),
    due_ms=st.integers(0, 2**50),
)
def test_a_property_template_gives_the_general_encoders_bytes(
    destination: str,
    attempt: int,
    carried: dict[str, Any],
    priority: int | None,
    message_id: str,
    due_ms: int,
) -> None:
    carried = {**carried, "priority": priority}
    headers = {ATTEMPT: attempt}
    sent = {**headers, DUE_AT: due_ms, DESTINATION: destination}
    expected = wire.encode_properties(amqp_properties(message_id, sent, carried))
    templates = PropertyTemplates()
    for _ in range(2):  # the template's first use and a reuse
        assert templates.encode(message_id, headers, carried, due_ms, destination) == expected  # type: ignore[arg-type]


def test_a_template_is_reused_only_for_the_same_shape() -> None:
    templates = PropertyTemplates()
    carried: Any = {"content_type": "text/plain"}
    first = templates.encode("a", {ATTEMPT: 1}, carried, 2**40, "orders")
    other = templates.encode("a", {ATTEMPT: 2}, carried, 2**40, "orders")
    assert first != other
    assert templates.encode("b", {ATTEMPT: 1}, carried, 2**40 + 1, "emails") != first


def test_a_value_that_holds_a_marker_still_encodes_right() -> None:
    """A carried value may contain the template's marker bytes: the general path then."""
    marker = "rmqdelay\x01template\x01message-id"
    carried: Any = {"correlation_id": marker, "content_type": "x"}
    templates = PropertyTemplates()
    got = templates.encode("id-1", {ATTEMPT: 1}, carried, 2**40, "orders")
    sent = {ATTEMPT: 1, DUE_AT: 2**40, DESTINATION: "orders"}
    assert got == wire.encode_properties(amqp_properties("id-1", sent, carried))


table_values = st.one_of(
    st.text(max_size=20),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(places=2, min_value=Decimal(-1000), max_value=Decimal(1000)),
)


@given(st.dictionaries(st.text(max_size=300), table_values, max_size=6))
def test_the_tables_fast_entries_match_the_checked_ones(table: dict[str, Any]) -> None:
    try:
        expected = b"".join(wire._entry("headers", k, v, ()) for k, v in table.items())
    except InvalidMessageError as error:
        with pytest.raises(InvalidMessageError) as raised:
            wire._table("headers", table)
        assert str(raised.value) == str(error)
        return
    assert wire._table("headers", table) == len(expected).to_bytes(4, "big") + expected


@given(
    message_id=st.text(min_size=1, max_size=40),
    destination=short_names,
    due=st.integers(0, 2**50),
    attempt=st.integers(1, 1000),
    size=st.integers(0, 2**30),
    recorded=st.integers(0, 2**50),
)
def test_the_journals_usual_line_is_encode_records(
    message_id: str, destination: str, due: int, attempt: int, size: int, recorded: int
) -> None:
    record = JournalRecord(
        "scheduled",
        message_id,
        destination,
        due,
        attempt=attempt,
        body_size=size,
        recorded_at_ms=recorded,
    )
    assert encode_scheduled(message_id, destination, due, attempt, size, recorded) == (
        encode_record(record)
    )


def test_a_journal_write_holds_one_line_per_message_whatever_the_path() -> None:
    plain = CORE.prepare("orders", b"abc", delay="1m")
    with_headers = CORE.prepare("orders", b"abcd", delay="2m", headers={"tenant": "t-1"})
    write = CORE.journal_write([plain, with_headers], now_ms=7)
    lines = write.body.split(b"\n")
    assert len(lines) == write.journal_records == 2
    assert b'"h":{"tenant":"t-1"}' in lines[1] and b'"h"' not in lines[0]


def test_message_ids_are_version_4_uuids_and_differ() -> None:
    ids = [new_message_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


@given(
    destination=short_names.filter(lambda d: ".." not in d and d[0] not in "._" and d[-1] != "."),
    body=st.binary(max_size=50)
    | st.text(max_size=20)
    | st.dictionaries(st.text(max_size=5), st.integers()),
    delay=st.integers(0, 3600) | st.floats(0, 3600),
    now=st.integers(0, 2**50),
)
def test_a_plain_publish_prepares_what_the_general_path_prepares(
    destination: str, body: Any, delay: float, now: int
) -> None:
    """No headers, id or properties given: the short path; with its id given back, the
    general one. Everything but the path must match."""
    core = PublisherCore(Settings(max_delay="2h").layout)
    plain = core.prepare(destination, body, delay=delay, now=now)
    general = core.prepare(destination, body, delay=delay, now=now, message_id=plain.message_id)
    assert plain == general
