"""The x-delay bridge's pure core: names, the x-delay header, topology as data, and the
envelope that carries a message's routing key, properties and headers through the tiers."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from rmqdelay import ConfigurationError, InvalidDestinationError, Settings
from rmqdelay.amqp.aio_publisher import EncodedProperties
from rmqdelay.core.bridge import (
    ENVELOPE,
    PLUGIN_MAX_DELAY_MS,
    PROPERTY_NAMES,
    X_DELAY,
    Inbound,
    bridge_names,
    bridge_topology,
    envelope,
    read_delay,
    restore,
    unwanted_bindings,
)
from rmqdelay.core.routing import validate_destination
from rmqdelay.core.wire import encode_properties

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


def through_the_wire(headers: dict[str, Any]) -> Any:
    """Encode as rmqdelay does, decode as aiormq does (pamqp): what stage 2 reads."""
    encoded = encode_properties({"headers": headers, "message_id": "m"})
    frame = pamqp_header.ContentHeader(0, 1, EncodedProperties(encoded, "m"))
    _consumed, _channel, parsed = pamqp_frame.unmarshal(pamqp_frame.marshal(frame, 1))
    assert isinstance(parsed, pamqp_header.ContentHeader)
    return parsed.properties.headers


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


def test_the_envelope_keeps_every_property_and_header_but_x_delay() -> None:
    headers = {X_DELAY: 5000, "tenant": "a", "n": -3, "nested": {"k": [1, "two"]}, "raw": b"\x00"}
    table = envelope("orders", "eu.new", FULL, headers)
    restored = restore(through_the_wire({ENVELOPE: table}), "fallback")
    assert (restored.exchange, restored.routing_key) == ("orders", "eu.new")
    props = dict(restored.properties)
    restored_headers = props.pop("headers")
    stamp = props.pop("timestamp")
    assert props == {k: v for k, v in FULL.items() if k != "timestamp"}
    assert stamp.replace(tzinfo=timezone.utc) == FULL["timestamp"]
    assert X_DELAY not in restored_headers
    assert restored_headers["tenant"] == "a" and restored_headers["n"] == -3
    assert restored_headers["nested"] == {"k": [1, "two"]}
    assert bytes(restored_headers["raw"]) == b"\x00"
    assert restored.message_id == "id-1" and restored.user_id == "alice"
    encode_properties(restored.properties)  # stage 2 can send it


def test_absent_properties_stay_absent_and_the_copy_gets_the_bridges_id() -> None:
    table = envelope("orders", "k", dict.fromkeys(PROPERTY_NAMES), {X_DELAY: 1})
    restored = restore(through_the_wire({ENVELOPE: table}), "made-up-id")
    assert restored.properties == {"message_id": "made-up-id", "headers": None}
    assert restored.user_id is None


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
)
def test_headers_and_routing_keys_come_back_as_they_went(
    headers: dict[str, Any], routing_key: str
) -> None:
    table = envelope("ex", routing_key, {}, headers)
    restored = restore(through_the_wire({ENVELOPE: table}), "id")
    assert restored.routing_key == routing_key
    expected = {k: v for k, v in headers.items() if k != X_DELAY}
    got = restored.properties["headers"] or {}
    assert {k: bytes(v) if isinstance(v, bytearray) else v for k, v in got.items()} == expected


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        (None, "no rmqdelay-bridge header"),
        ({ENVELOPE: "x"}, "no rmqdelay-bridge header"),
        ({ENVELOPE: {"v": 2}}, "version 2"),
        ({ENVELOPE: {"v": 1, "exchange": "e"}}, "no 'routing-key'"),
        ({ENVELOPE: {"v": 1, "exchange": "e", "routing-key": "", "headers": 3}}, "tables"),
    ],
)
def test_a_message_without_a_good_envelope_is_refused(headers: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        restore(headers, "id")
