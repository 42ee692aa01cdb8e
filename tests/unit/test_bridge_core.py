"""The x-delay bridge's pure core: names, the x-delay header, topology as data, and the
envelope that carries a message's routing key, properties and headers through the tiers
(checked through pamqp's decoder, as stage 2's consumers read them)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from rmqdelay import ConfigurationError, InvalidDestinationError, Settings
from rmqdelay.amqp.aio_sending import EncodedProperties
from rmqdelay.bridge.envelope import (
    CONTENT_TYPE,
    DELAY_HEADERS,
    PLUGIN_MAX_DELAY_MS,
    PROPERTY_NAMES,
    X_DELAY,
    X_OPT_DELIVERY_DELAY,
    X_OPT_DELIVERY_TIME,
    Inbound,
    carry,
    read_delay,
    unwrap,
    wrap,
)
from rmqdelay.bridge.names import bridge_names, bridge_topology, unwanted_bindings
from rmqdelay.core.routing import validate_destination

LAYOUT = Settings(max_delay="366d").layout
MAX = LAYOUT.max_delay_ms


def delay(value: object) -> Inbound:
    return read_delay({X_DELAY: value}, MAX)


# ---------------------------------------------------------------- x-delay


def test_no_x_delay_goes_at_once_as_with_the_plugin() -> None:
    assert read_delay(None, MAX) == Inbound(0)
    assert read_delay({}, MAX) == Inbound(0)
    assert read_delay({"other": 5}, MAX) == Inbound(0)


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (5000, 5000),
        (1, 1),
        (0, 0),
        (-5000, 0),  # the plugin's own delivered copies carry -delay: at once
        (1500.9, 1500),  # the plugin truncates floats
        (-0.5, 0),
        (Decimal("2500.7"), 2500),
        ("5000", 5000),  # the plugin reads an integer string
        ("+42", 42),
        ("-7", 0),
        (b"3000", 3000),
        (bytearray(b"12"), 12),
        (MAX, MAX),
        (PLUGIN_MAX_DELAY_MS + 1, PLUGIN_MAX_DELAY_MS + 1),  # held, where the plugin did not
    ],
)
def test_delays_the_plugin_took(value: object, ms: int) -> None:
    assert delay(value) == Inbound(ms)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("abc", "not a whole number"),
        ("1.5", "not a whole number"),
        ("5s", "not a whole number"),
        (" 5", "not a whole number"),
        ("", "not a whole number"),
        (True, "(bool) is not a number"),
        (None, "(NoneType) is not a number"),
        ({"a": 1}, "(dict) is not a number"),
        ([5000], "(list) is not a number"),
        (datetime(2030, 1, 1, tzinfo=timezone.utc), "(datetime) is not a number"),
        (math.inf, "not a finite number"),
        (math.nan, "not a finite number"),
        (Decimal("NaN"), "not a finite number"),
        (MAX + 1, "over max_delay"),
        ("99999999999999", "over max_delay"),
    ],
)
def test_bad_delays_are_parked_with_a_reason(value: object, words: str) -> None:
    inbound = delay(value)
    assert inbound.parked and inbound.delay_ms is None
    assert words in inbound.reason
    assert "x-delay" in inbound.reason


def test_over_max_delay_names_the_setting() -> None:
    reason = read_delay({X_DELAY: 10_000}, 5_000).reason
    assert "over max_delay 5s" in reason and "raise max_delay" in reason


@given(st.integers(min_value=-(2**63), max_value=2**63))
def test_an_integer_delay_is_held_exactly_parked_only_past_max_delay(ms: int) -> None:
    inbound = delay(ms)
    assert delay(str(ms)) == inbound  # as the plugin read an integer string
    if ms <= 0:
        assert inbound == Inbound(0)
    elif ms <= MAX:
        assert inbound == Inbound(ms)
    else:
        assert inbound.parked


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e9))
def test_a_float_delay_is_truncated(value: float) -> None:
    assert delay(value) == Inbound(max(0, math.trunc(value)))


# ---------------------------------------------------------------- AMQP 1.0 annotations

RECEIVED_US = 1_800_000_000_000_000  # a delivery's arrival, on a whole millisecond
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def at(ms_after: int, us: int = 0) -> dict[str, object]:
    """An ``x-opt-delivery-time`` so many ms (and µs) after RECEIVED_US, in Unix ms."""
    return {X_OPT_DELIVERY_TIME: (RECEIVED_US + ms_after * 1000 + us) // 1000}


@pytest.mark.parametrize(
    ("headers", "ms"),
    [
        ({X_OPT_DELIVERY_DELAY: 1500}, 1500),
        ({X_OPT_DELIVERY_DELAY: 1500.2}, 1501),  # rounded up, never early (x-delay truncates)
        ({X_OPT_DELIVERY_DELAY: Decimal("0.1")}, 1),
        ({X_OPT_DELIVERY_DELAY: "2000"}, 2000),
        ({X_OPT_DELIVERY_DELAY: -5}, 0),
        (at(2500), 2500),
        (at(-2500), 0),  # a time in the past: at once
        (at(0), 0),
        ({X_OPT_DELIVERY_TIME: float((RECEIVED_US + 1_000_400) / 1000)}, 1001),
        ({X_OPT_DELIVERY_TIME: str((RECEIVED_US // 1000) + 30)}, 30),
        # several: the latest of their times, so the message is early for none of them
        ({X_DELAY: 1000, X_OPT_DELIVERY_DELAY: 3000, **at(2000)}, 3000),
        ({X_DELAY: 4000, X_OPT_DELIVERY_DELAY: 3000, **at(2000)}, 4000),
        ({X_DELAY: 1000, X_OPT_DELIVERY_DELAY: 0, **at(5000)}, 5000),
        ({X_DELAY: -1, **at(-9000)}, 0),
    ],
)
def test_the_amqp_1_0_annotations_ask_as_x_delay_does(headers: dict[str, Any], ms: int) -> None:
    assert read_delay(headers, MAX, RECEIVED_US) == Inbound(ms)


def test_an_amqp_timestamp_is_taken_at_the_end_of_its_second() -> None:
    """RabbitMQ hands an AMQP 1.0 timestamp to 0-9-1 in whole seconds (the ms dropped):
    the bridge cannot know them, so it takes the last one (late by < 1 s, never early)."""
    second = datetime.fromtimestamp(RECEIVED_US // 1_000_000 + 3, tz=timezone.utc)
    assert read_delay({X_OPT_DELIVERY_TIME: second}, MAX, RECEIVED_US) == Inbound(3999)
    naive = second.replace(tzinfo=None)  # a naive one is UTC, as the AMQP libraries mean it
    assert read_delay({X_OPT_DELIVERY_TIME: naive}, MAX, RECEIVED_US) == Inbound(3999)


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        ({X_OPT_DELIVERY_DELAY: "soon"}, "x-opt-delivery-delay 'soon' is not a whole number"),
        ({X_OPT_DELIVERY_DELAY: True}, "x-opt-delivery-delay True (bool) is not a number"),
        ({X_OPT_DELIVERY_DELAY: math.nan}, "x-opt-delivery-delay nan is not a finite"),
        ({X_OPT_DELIVERY_TIME: "tomorrow"}, "x-opt-delivery-time 'tomorrow' is not a whole"),
        ({X_OPT_DELIVERY_TIME: {"a": 1}}, "x-opt-delivery-time {'a': 1} (dict) is not a number"),
        ({X_OPT_DELIVERY_DELAY: MAX + 1}, "x-opt-delivery-delay 31622400001 ms (366d1ms) is over"),
        ({**at(MAX + 1)}, "(366d1ms away) is over max_delay 366d"),
        # one that cannot be read parks the message, whatever the others ask
        ({X_DELAY: 5, X_OPT_DELIVERY_DELAY: "x"}, "x-opt-delivery-delay 'x' is not"),
        ({X_DELAY: "5s", **at(10)}, "x-delay '5s' is not a whole number"),
    ],
)
def test_annotations_that_cannot_be_held_are_parked_naming_the_header(
    headers: dict[str, Any], words: str
) -> None:
    inbound = read_delay(headers, MAX, RECEIVED_US)
    assert inbound.parked
    assert words in inbound.reason, inbound.reason


@given(st.integers(min_value=0, max_value=10**17), st.integers(min_value=-(10**9), max_value=MAX))
def test_a_delivery_time_is_never_early_and_late_by_under_a_millisecond(
    received_us: int, ahead_ms: int
) -> None:
    """Through carry(): the due time stage 1 asks the tiers for, counted from the arrival."""
    time_us = (received_us // 1000 + ahead_ms) * 1000
    headers = {X_OPT_DELIVERY_TIME: time_us // 1000}
    carried = carry("b.ex", MAX, "ex", "k", {"headers": headers}, b"", received_us=received_us)
    assert carried.request is not None
    due_us = (carried.request["at"] - EPOCH) // timedelta(microseconds=1)
    if ahead_ms > 0:
        assert time_us <= due_us < time_us + 1000
    else:
        assert due_us == received_us  # at once


# ---------------------------------------------------------------- names


def test_default_names() -> None:
    names = bridge_names(LAYOUT, "orders")
    assert names.exchange == "orders"
    assert names.delivery_exchange == "orders.delayed"
    assert names.destination == "bridge.orders"
    assert names.inbox == "rmqdelay.bridge.orders.inbox" == names.policy
    given_names = bridge_names(LAYOUT, "orders", delivery_exchange="out", destination="od")
    assert (given_names.delivery_exchange, given_names.destination) == ("out", "od")
    assert given_names.inbox == "rmqdelay.od.inbox"


@pytest.mark.parametrize(
    ("exchange", "delivery", "words"),
    [
        ("", None, "non-empty"),
        ("amq.direct", None, "'amq.' are RabbitMQ's"),
        ("orders", "orders", "must differ"),
        ("orders", "amq.topic", "'amq.' are RabbitMQ's"),
        ("x" * 256, None, "255 bytes"),
    ],
)
def test_bad_names_are_refused(exchange: str, delivery: str | None, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words.replace(".", r"\.")):
        bridge_names(LAYOUT, exchange, delivery_exchange=delivery)


def test_a_bad_destination_given_is_refused() -> None:
    with pytest.raises(InvalidDestinationError):
        bridge_names(LAYOUT, "orders", destination="a b")


@given(st.text(min_size=1, max_size=255).filter(lambda s: len(s.encode()) <= 255))
def test_any_exchange_name_makes_a_valid_destination_of_its_own(exchange: str) -> None:
    if exchange.startswith("amq."):
        return
    names = bridge_names(LAYOUT, exchange)
    assert validate_destination(LAYOUT, names.destination) == names.destination
    if "/" in exchange or " " in exchange or ":" in exchange:
        assert names.destination != "bridge." + exchange
    other = exchange + "x"
    if len(other.encode()) <= 255:
        assert bridge_names(LAYOUT, other).destination != names.destination


# ---------------------------------------------------------------- topology


@pytest.mark.parametrize(
    ("kind", "key", "arguments"),
    [("topic", "#", {}), ("fanout", "", {}), ("headers", "", {"x-match": "all"})],
)
def test_a_binding_leads_every_message_to_the_inbox(
    kind: str, key: str, arguments: dict[str, Any]
) -> None:
    names = bridge_names(LAYOUT, "ev")
    topology = bridge_topology(LAYOUT, names, kind)
    objects = topology.objects
    assert [(e.name, e.type, dict(e.arguments)) for e in objects.exchanges] == [
        ("ev", kind, {}),
        ("ev.delayed", kind, {}),
        # its destination is held (stage 2 waits out the last stretch), and says whose
        ("rmqdelay.held.bridge.ev", "fanout", {"rmqdelay-bridge": "ev"}),
    ]
    [binding] = objects.bindings
    assert (binding.source, binding.destination, binding.routing_key) == ("ev", names.inbox, key)
    assert dict(binding.arguments) == arguments
    assert topology.policy is None


def test_a_direct_exchange_gets_a_policy_not_an_argument() -> None:
    names = bridge_names(LAYOUT, "or.ders")
    topology = bridge_topology(LAYOUT, names, "direct")
    exchanges = {e.name: e for e in topology.objects.exchanges}
    assert exchanges["or.ders"].type == "direct" and not exchanges["or.ders"].arguments
    assert exchanges[names.inbox].type == "fanout"
    [binding] = topology.objects.bindings
    assert (binding.source, binding.destination) == (names.inbox, names.inbox)
    policy = topology.policy
    assert policy is not None
    assert policy.pattern == r"^or\.ders$" and policy.apply_to == "exchanges"
    assert dict(policy.definition) == {"alternate-exchange": names.inbox}


def test_the_inbox_is_a_quorum_queue_that_parks_what_keeps_failing() -> None:
    [inbox] = bridge_topology(LAYOUT, bridge_names(LAYOUT, "ev"), "topic").objects.queues
    args = inbox.arguments
    assert args["x-queue-type"] == "quorum"
    assert args["x-delivery-limit"] == LAYOUT.delivery_limit
    assert args["x-dead-letter-exchange"] == LAYOUT.parking
    assert args["x-dead-letter-strategy"] == "at-least-once"
    classic = Settings(queue_type="classic").layout
    [queue] = bridge_topology(classic, bridge_names(classic, "ev"), "topic").objects.queues
    assert queue.arguments["x-queue-type"] == "classic"
    assert "x-delivery-limit" not in queue.arguments


def test_an_unknown_type_names_the_choices() -> None:
    with pytest.raises(ConfigurationError, match="direct, topic, fanout, headers"):
        bridge_topology(LAYOUT, bridge_names(LAYOUT, "ev"), "x-delayed-message")


def test_unwanted_bindings_are_those_not_to_the_inbox() -> None:
    names = bridge_names(LAYOUT, "ev")
    found = unwanted_bindings(
        names,
        [
            {"source": "ev", "destination": names.inbox, "destination_type": "queue"},
            {"source": "ev", "destination": "q1", "destination_type": "queue", "routing_key": "a"},
            {"source": "ev", "destination": "x", "destination_type": "exchange", "routing_key": ""},
            {"source": "other", "destination": "q2", "destination_type": "queue"},
        ],
    )
    assert found == [("exchange", "x", ""), ("queue", "q1", "a")]


# ---------------------------------------------------------------- envelope


def decoded(encoded: bytes) -> Any:
    """Properties as aiormq reads them (pamqp): what stage 2's consumers get."""
    frame = pamqp_header.ContentHeader(0, 1, EncodedProperties(encoded, "m"))
    _consumed, _channel, parsed = pamqp_frame.unmarshal(pamqp_frame.marshal(frame, 1))
    assert isinstance(parsed, pamqp_header.ContentHeader)
    return parsed.properties


FULL = {
    "content_type": "text/plain",
    "content_encoding": "gzip",
    "delivery_mode": 1,
    "priority": 7,
    "correlation_id": "corr",
    "reply_to": "replies",
    "expiration": "60000",
    "message_id": "id-1",
    "timestamp": datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
    "type": "order.created",
    "user_id": "alice",
    "app_id": "shop",
    "cluster_id": "c1",
}
PAMQP_NAMES = {"type": "message_type"}


def test_the_envelope_keeps_every_property_and_header_but_the_delays() -> None:
    """A delivered copy keeps no delay: sent on to another bridge, it would wait again."""
    kept = {"tenant": "a", "n": -3, "nested": {"k": [1, "two"]}, "raw": b"\x00"}
    headers = {X_DELAY: 5000, X_OPT_DELIVERY_DELAY: 5, X_OPT_DELIVERY_TIME: 1, **kept}
    body = b"\x00the body\xff"
    wrapped = wrap("orders", "eu.new", {**FULL, "headers": headers}, "id-1", body)
    restored = unwrap(wrapped, "id-1")
    assert (restored.exchange, restored.routing_key, restored.body) == ("orders", "eu.new", body)
    assert (restored.message_id, restored.user_id) == ("id-1", "alice")
    props = decoded(restored.properties)
    for name, value in FULL.items():
        got = getattr(props, PAMQP_NAMES.get(name, name))
        if name == "timestamp":
            got = got.replace(tzinfo=timezone.utc)
        assert got == value, name
    assert props.headers == kept


def test_absent_properties_stay_absent_and_the_copy_gets_the_bridges_id() -> None:
    properties = {**dict.fromkeys(PROPERTY_NAMES), "headers": {X_DELAY: 1}}
    restored = unwrap(wrap("orders", "k", properties, "made-up-id", b""), "made-up-id")
    props = decoded(restored.properties)
    assert props.message_id == "made-up-id"
    assert props.headers is None and props.content_type is None
    assert props.delivery_mode is None and props.timestamp is None
    assert restored.user_id is None and restored.body == b""


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=20),
        st.one_of(
            st.integers(min_value=-(2**63), max_value=2**63 - 1),
            st.text(max_size=30),
            st.booleans(),
            st.none(),
            st.floats(allow_nan=False, allow_infinity=False),
            st.binary(max_size=10),
        ),
        max_size=8,
    ),
    st.text(max_size=255).filter(lambda s: len(s.encode()) <= 255),
    st.binary(max_size=300),
)
def test_headers_routing_keys_and_bodies_come_back_as_they_went(
    headers: dict[str, Any], routing_key: str, body: bytes
) -> None:
    restored = unwrap(wrap("ex", routing_key, {"headers": headers}, "id", body), "id")
    assert (restored.routing_key, restored.body) == (routing_key, body)
    expected = {k: v for k, v in headers.items() if k not in DELAY_HEADERS}
    got = decoded(restored.properties).headers or {}
    assert {k: bytes(v) if isinstance(v, bytearray) else v for k, v in got.items()} == expected


def test_carry_makes_the_usual_request_or_a_reason_to_park() -> None:
    headers = {X_DELAY: 1500, "tenant": "a"}
    carried = carry("bridge.ex", MAX, "ex", "k", {"headers": headers, "message_id": "m1"}, b"b")
    assert carried.message_id == "m1" and carried.body is not None
    request = carried.request
    assert request is not None
    assert request["destination"] == "bridge.ex" and request["message_id"] == "m1"
    assert request["delay"].total_seconds() == 1.5
    assert request["content_type"] == CONTENT_TYPE and "headers" not in request
    assert unwrap(request["body"], "m1").body == b"b"
    timed = carry("bridge.ex", MAX, "ex", "k", {"headers": headers}, b"b", received_us=10**15)
    assert timed.request is not None and "delay" not in timed.request
    assert timed.request["at"] == datetime(2001, 9, 9, 1, 46, 41, 500000, tzinfo=timezone.utc)
    made_up = carry("bridge.ex", MAX, "ex", "k", {"headers": None}, b"b")
    assert made_up.message_id and made_up.request is not None
    assert made_up.request["delay"].total_seconds() == 0
    bad = carry("bridge.ex", MAX, "ex", "k", {"headers": {X_DELAY: "soon"}}, b"b")
    assert bad.request is None and bad.body is not None and "'soon'" in bad.reason
    broken = carry("bridge.ex", MAX, "ex", "k", {"headers": {"k": 2**70}}, b"b")
    assert broken.request is None and broken.body is None
    assert broken.reason.startswith("cannot be carried: headers['k']")


def test_carry_takes_the_delay_its_caller_read_already() -> None:
    """Stage 1 reads each x-delay as the delivery arrives (its batch's linger depends on
    it): carry uses that reading, not a second one."""
    headers = {X_DELAY: 1500}
    read = read_delay(headers, MAX)
    assert carry("bridge.ex", MAX, "ex", "k", {"headers": headers}, b"b", inbound=read).request
    other = carry("bridge.ex", MAX, "ex", "k", {"headers": headers}, b"b", inbound=Inbound(250))
    assert other.request is not None and other.request["delay"].total_seconds() == 0.25
    parked = Inbound(None, "told so")
    told = carry("bridge.ex", MAX, "ex", "k", {"headers": headers}, b"b", inbound=parked)
    assert told.request is None and told.reason == "told so"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"plain body", "no envelope"),
        (b"rmqdb\x01\x05ab", "cut short"),
        (b"rmqdb\x01\x01e\x01k\x00\x00\x00\x00\x09ab", "cut short"),
        (b"rmqdb\x01\x01\xff\x00\x00\x00\x00\x00\x00", "garbled"),
    ],
)
def test_a_body_without_a_good_envelope_is_refused(data: bytes, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        unwrap(data, "id")
