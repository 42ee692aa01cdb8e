"""The publish path's shortcuts give exactly the bytes of the general code they skip.

Each fast path (frames written by rmqdelay, property templates, the journal's usual
line, the field table's common entries, the message id) is checked against the slow,
general code it stands in for, or against the client library's own encoder.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pika.frame
import pika.spec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqdelay import Settings
from rmqdelay.amqp.pika_confirms import _up_to
from rmqdelay.amqp.publisher import pika_properties
from rmqdelay.core import wire
from rmqdelay.core.journal.records import JournalRecord, encode_record, encode_scheduled
from rmqdelay.core.layout import DIGITS, Layout
from rmqdelay.core.messages import ATTEMPT, CARRIED, DESTINATION, DUE_AT, amqp_properties
from rmqdelay.core.plan import digits_for, plan_delay, plan_route
from rmqdelay.core.publishing import templates
from rmqdelay.core.publishing.outgoing import Draft, Drafts, Prepared, PublishResult, WithRecords
from rmqdelay.core.publishing.publisher import PublisherCore
from rmqdelay.core.publishing.templates import PropertyTemplates, new_message_id
from rmqdelay.core.steps import Send
from rmqdelay.errors import DelayError, InvalidMessageError

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
    # with its body (journal_bodies, the default) and the properties kept with it
    body, properties = message_id.encode()[:size], {"content_type": destination}
    assert encode_scheduled(
        message_id, destination, due, attempt, size, recorded, "k", "ignore", body, properties
    ) == encode_record(
        replace(record, key="k", on_conflict="ignore", body=body, properties=properties)
    )
    assert encode_scheduled(message_id, destination, due, attempt, size, recorded, body=b"") == (
        encode_record(replace(record, body=b""))
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
    # every variant digit a uuid4 can have shows up, and only those
    assert {text[19] for text in ids} == set("89ab")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_never_sends_its_parents_next_ids() -> None:
    """Ids are made ahead a few at a time: a child forked with some left makes its own."""
    templates._IDS.clear()  # whatever earlier tests left, the next call makes a fresh batch
    new_message_id()  # the parent now holds ids made ahead
    ahead = list(templates._IDS)
    assert ahead, "ids are made ahead"
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        try:
            os.write(write, ",".join(new_message_id() for _ in range(3)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        made = pipe.read().split(",")
    os.waitpid(child, 0)
    assert len(made) == 3 and not set(made) & set(ahead)
    assert new_message_id() == ahead[0], "the parent goes on with its own"


def test_threads_never_take_the_same_id() -> None:
    taken: list[list[str]] = [[] for _ in range(4)]

    def take(into: list[str]) -> None:
        into.extend(new_message_id() for _ in range(3000))

    threads = [threading.Thread(target=take, args=(into,)) for into in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = [i for into in taken for i in into]
    assert len(set(ids)) == len(ids) == 12_000


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


def _holds_every_field(made: object) -> None:
    """Made by :func:`rmqdelay.core.frozen.make`: every field in its ``__dict__`` (none
    left to a class default) and equal to what ``__init__`` makes of them."""
    names = {f.name for f in dataclasses.fields(made)}  # type: ignore[arg-type]
    assert vars(made).keys() == names
    assert made == type(made)(**vars(made))


def test_the_objects_a_publish_makes_hold_every_field() -> None:
    core = PublisherCore(Settings(max_delay="2h").layout)
    plain = core.prepare("orders", b"abc", delay="1m")
    keyed = core._prepare_keyed("orders", b"abc", "1m", None, None, "k-1", "ignore")
    for prepared in (plain, keyed):
        _holds_every_field(prepared)
        out = core.finalize(prepared)
        _holds_every_field(out)
        _holds_every_field(out.plan)
        _holds_every_field(PublishResult.of(out))
    assert keyed.key == "k-1" and keyed.on_conflict == "ignore"
    assert PublishResult.of(core.finalize(keyed)).key == "k-1"


@st.composite
def positional_layouts(draw: st.DrawFn) -> Layout:
    return Settings(
        resolution=f"{draw(st.sampled_from([1, 10, 1000]))}ms",
        radix=draw(st.integers(2, 16)),
        max_delay=f"{draw(st.integers(1, 400 * 86_400_000))}ms",
    ).layout


@given(positional_layouts(), st.data())
def test_a_plans_short_path_is_digits_for(layout: Layout, data: st.DataObject) -> None:
    """No named tier: plan_delay writes the digits itself; digits_for's are the same."""
    delay_us = data.draw(st.integers(-(10**6), layout.max_delay_ms * 1000))
    plan = plan_delay(layout, delay_us, "orders")
    digits = digits_for(layout, plan.units)
    assert plan.digits == digits
    positions = zip(layout.positions, digits, strict=True)
    assert plan.hops == tuple(p.tiers[d - 1] for p, d in positions if d)
    assert plan.routing_key == ".".join([*(DIGITS[d] for d in digits), "orders"])


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    """Positional, or with a named tier (plan_route then takes plan_delay's way)."""
    named = draw(st.sampled_from([[], ["15m"], ["1m", "1h"]]))
    return Settings(
        resolution=f"{draw(st.sampled_from([1, 10, 1000]))}ms",
        radix=draw(st.integers(2, 16)),
        max_delay=f"{draw(st.integers(2 * 3_600_000, 400 * 86_400_000))}ms",
        named_tiers=named,
    ).layout


@given(layouts(), st.data())
def test_a_route_is_what_the_plan_says(layout: Layout, data: st.DataObject) -> None:
    """The async publisher routes by plan_route and keeps no plan: the exchange, the
    key it publishes with, the routing key and the hops are the plan's."""
    now = data.draw(st.integers(0, 2**41))
    delay_us = data.draw(st.integers(-(10**6), layout.max_delay_ms * 1000))
    plan = plan_delay(layout, delay_us, "orders")
    route = plan_route(layout, now + delay_us, now, "orders")
    assert route == (plan.exchange, plan.publish_key, plan.routing_key, len(plan.hops), now)


def test_a_route_over_the_maximum_raises_as_the_plan_does() -> None:
    layout = CORE.layout
    over = layout.max_delay_ms * 1000 + 1
    with pytest.raises(DelayError) as planned:
        plan_delay(layout, over, "orders")
    with pytest.raises(DelayError) as routed:
        plan_route(layout, over + 5, 5, "orders")
    assert str(routed.value) == str(planned.value)


def test_a_routed_result_is_the_finalized_ones() -> None:
    """What the async publisher returns from a slot's message and route is what
    ``PublishResult.of(finalize(...))`` returns, journal writes included; finalize at
    the route's time gives the same plan again (for an error's words)."""
    plain = CORE.prepare("orders", b"abc", delay="1m")
    keyed = CORE._prepare_keyed("orders", b"abc", "1m", None, None, "k-1", "ignore")
    now = CORE.prepare("orders", b"abc", delay=0)
    write = CORE.journal_write([plain, keyed])
    for prepared in (plain, keyed, now, write):
        route = CORE.route(prepared)
        out = CORE.finalize(prepared, route.planned_at_us)
        assert (out.exchange, out.routing_key) == (route.exchange, route.publish_key)
        result = PublishResult.routed(prepared, route.routing_key, route.hops)
        assert result == PublishResult.of(out)
        _holds_every_field(result)


def test_a_batchs_journal_writes_are_made_when_first_read() -> None:
    messages = [CORE.prepare("orders", b"x", delay="1m") for _ in range(5)]
    made: list[int] = []

    def write(chunk: Sequence[Prepared]) -> Prepared:
        made.append(len(chunk))
        return CORE.journal_write(chunk, now_ms=7)

    batch = WithRecords(messages, write, 2)
    assert len(batch) == 8 and made == []
    assert batch[:5] == messages and batch[-4] is messages[4] and made == []
    first = batch[5]
    assert made == [2] and first.journal_records == 2
    assert batch[5] is first and batch.write(0) is first and made == [2]
    assert list(batch)[5:] == [first, batch[6], batch[7]] and made == [2, 2, 1]
    assert batch[-1].journal_records == 1
    with pytest.raises(IndexError):
        batch[8]


def test_a_batch_whose_records_are_not_the_usual_line_has_them_made_first() -> None:
    """A record that may fail to encode (headers of the caller's) is made before the
    first message goes out; the usual line, as the sender reaches it."""
    core = PublisherCore(Settings(max_delay="2h").layout)
    core.known_destinations.add("orders")
    core._journal_checked = True
    for headers, made_first in ((None, False), ({"tenant": "t-1"}, True)):
        requests = [
            {"destination": "orders", "body": b"x", "delay": 60, "headers": headers}
            for _ in range(3)
        ]
        flow = core.publish_many(requests)
        step = next(flow)
        assert isinstance(step, Send) and isinstance(step.batch, WithRecords)
        assert (step.batch._writes[0] is not None) is made_first
        flow.close()


def test_publish_many_prepares_a_plain_request_as_prepare_does() -> None:
    """Its short way round ``prepare(**request)`` keeps prepare's errors."""
    core = PublisherCore(Settings(max_delay="2h").layout)
    with pytest.raises(TypeError):
        next(core.publish_many([{"destination": "orders", "delay": 1}]))
    with pytest.raises(DelayError, match="either delay= or at="):
        next(core.publish_many([{"destination": "orders", "body": b"", "delay": 1, "at": 1}]))
    with pytest.raises(TypeError, match="'bogus'"):
        next(core.publish_many([{"destination": "orders", "body": b"", "bogus": 1}]))


def test_a_multiple_confirm_settles_the_tags_up_to_its_own() -> None:
    pending = dict.fromkeys([4, 5, 7, 9])
    assert _up_to(pending, 7) == [4, 5, 7]
    assert _up_to(pending, 3) == [] and _up_to(pending, 100) == [4, 5, 7, 9]


def test_publish_manys_plain_messages_are_made_as_the_sender_reads_them() -> None:
    """Checked before anything is sent (a bad one raises at once), made when read."""
    core = PublisherCore(Settings(max_delay="2h", schedule_journal=False).layout)
    core.known_destinations.add("orders")
    with pytest.raises(DelayError):
        next(
            core.publish_many(
                [
                    *[{"destination": "orders", "body": b"x", "delay": 1}] * 3,
                    {"destination": "orders", "body": b"x", "delay": -1},
                ]
            )
        )
    requests = [{"destination": "orders", "body": b"x", "delay": d} for d in (30, 10, 20)]
    flow = core.publish_many(requests)
    step = next(flow)
    assert isinstance(step, Send) and isinstance(step.batch, Drafts)
    assert [type(item) for item in step.batch.items] == [Draft] * 3
    first = step.batch[0]
    assert isinstance(first, Prepared) and step.batch[0] is first
    assert step.batch.items[0] is first and type(step.batch.items[1]) is Draft
    sent = list(step.batch)
    assert sent[0] is first and [p.due_at_us for p in sent] == sorted(p.due_at_us for p in sent)
    # iterating makes them in place, as indexing does: read again, the same objects
    assert step.batch.items == sent and all(step.batch[i] is sent[i] for i in range(3))
    outs = [PublishResult.of(core.finalize(p)) for p in sent]
    try:
        flow.send(outs)
    except StopIteration as stop:
        results = stop.value
    # in the order asked: the first request (30 s) was sent last
    assert [r.message_id for r in results] == [
        sent[2].message_id,
        sent[0].message_id,
        sent[1].message_id,
    ]
