"""The x-delay bridge against a real broker: publishers written for the delayed-message
plugin (pika, exactly as the plugin's README publishes: a header ``x-delay`` in ms, to
the exchange), consumers bound to the delivery exchange.

The tests share the module's delay topology; each declares a bridge of its own
(exchanges named after the test) and runs it in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import REGISTRY

from rmqdelay import Publisher
from rmqdelay.bridge.names import bridge_names
from rmqdelay.errors import TopologyError
from tests.helpers.bridge_helpers import (
    BridgeCase,
    assert_on_time,
    bridge_case,
    parked,
    wait_parked,
)
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.cli import run_cli, settings_env
from tests.helpers.worker_helpers import TestTopology, wait_until


@pytest.fixture
def case(shared_topology: TestTopology, amqp_url: str) -> Iterator[BridgeCase]:
    with bridge_case(shared_topology, amqp_url) as found:
        yield found


# ---------------------------------------------------------------- routing by type


@pytest.mark.parametrize("inbox_process", [True, False], ids=["inbox-process", "inbox-thread"])
async def test_topic_routes_by_key_after_the_delay_with_everything_it_came_with(
    case: BridgeCase, inbox_process: bool
) -> None:
    case.declare("topic")
    eu, us = case.bind("eu.#"), case.bind("us.*")
    stamp = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    headers = {
        "tenant": "acme",
        "n": -3,
        "big": 2**40,
        "flag": True,
        "nothing": None,
        "raw": b"\x00\xff",
        "price": Decimal("12.50"),
        "when": stamp,
        "nested": {"k": [1, "two", {"deep": False}]},
    }
    full = {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "delivery_mode": 1,
        "priority": 4,
        "correlation_id": "corr-1",
        "reply_to": "replies",
        "expiration": "600000",
        "message_id": f"{case.prefix}-eu",
        "timestamp": 1_900_000_000,
        "type": "order.created",
        "user_id": "guest",
        "app_id": "shop",
        "cluster_id": "c1",
    }
    async with case.running(inbox_process=inbox_process):
        sent = case.publish("eu.order.new", b'{"id": 1}', 1500, headers, **full)
        case.publish("us.order", b"us", 700, message_id=f"{case.prefix}-us")
        [(_at_us, key_us, props_us, body_us)] = await case.collect(us, 1, 30)
        [(at, key, props, body)] = await case.collect(eu, 1, 30)
    assert (key_us, body_us, props_us.message_id) == ("us.order", b"us", f"{case.prefix}-us")
    assert (key, body) == ("eu.order.new", b'{"id": 1}')
    assert_on_time(sent, 1500, at)
    for name, value in full.items():
        assert getattr(props, name) == value, name
    got = dict(props.headers)
    got["when"] = got["when"].replace(tzinfo=timezone.utc)  # pika 1.3 reads it naive (UTC)
    assert got == headers  # Decimal("12.50") == Decimal("12.5"): the same value
    assert "x-delay" not in props.headers
    assert case.ready(eu) == 0 and case.ready(us) == 0  # each once, and only where it matched


async def test_direct_routes_by_key_through_its_alternate_exchange_policy(
    case: BridgeCase, admin: BrokerAdmin
) -> None:
    declared = case.declare("direct")
    assert any("policy" in note for note in declared.notes)
    exchange = admin._get(f"exchanges/%2F/{case.names.exchange}")
    assert exchange["policy"] == case.names.policy and exchange["type"] == "direct"
    a, b = case.bind("a"), case.bind("b")
    async with case.running():
        sent = case.publish("a", b"for a", 800)
        case.publish("b", b"for b", 400)
        case.publish("nobody", b"lost?", 200, message_id=f"{case.prefix}-nobody")
        [(at, key, _props, body)] = await case.collect(a, 1, 30)
        await case.collect(b, 1, 30)
        [lost] = await wait_parked(case.settings, case.names.destination, 1)
    assert (key, body) == ("a", b"for a")
    assert_on_time(sent, 800, at)
    assert lost.message_id == f"{case.prefix}-nobody"
    assert "unroutable" in lost.reason and repr(case.names.delivery_exchange) in lost.reason
    assert "'nobody'" in lost.reason


async def test_fanout_and_headers_route_as_their_types_do(case: BridgeCase) -> None:
    case.declare("fanout")
    one, two = case.bind(), case.bind()
    headers_case = BridgeCase(
        case.settings,
        bridge_names(case.settings.layout, f"{case.prefix}.hx"),
        case.prefix + ".h",
        case.url,
    )
    try:
        headers_case.declare("headers")
        red = headers_case.bind("", {"x-match": "any", "colour": "red"})
        async with case.running(), headers_case.running():
            case.publish("ignored", b"to all", 300)
            headers_case.publish("", b"red", 300, {"colour": "red"})
            headers_case.publish("", b"blue", 300, {"colour": "blue"})
            for queue in (one, two):
                [(_at, _key, _props, body)] = await case.collect(queue, 1, 30)
                assert body == b"to all"
            [(_at, _key, props, body)] = await headers_case.collect(red, 1, 30)
            assert body == b"red" and props.headers == {"colour": "red"}
            [blue] = await wait_parked(case.settings, headers_case.names.destination, 1)
            assert "unroutable" in blue.reason
        assert headers_case.ready(red) == 0
    finally:
        headers_case.close()


# ---------------------------------------------------------------- x-delay values


async def test_x_delay_values_are_read_as_the_plugin_read_them_or_parked(
    case: BridgeCase,
) -> None:
    case.declare("topic")
    queue = case.bind("#")
    cases: dict[str, object] = {
        "none": None,  # no header: at once
        "negative": -5000,  # at once
        "zero": 0,
        "decimal": Decimal("600.9"),  # truncated, as the plugin truncated floats: 600 ms
        "string": "700",
    }
    bad: dict[str, object] = {
        "word": "abc",
        "bool": True,
        "table": {"ms": 5},
        "huge": 400 * 24 * 3600 * 1000,  # over the module's max_delay of 1h
    }
    async with case.running():
        sent = {k: case.publish(k, k.encode(), v, message_id=k) for k, v in cases.items()}
        for k, v in bad.items():
            case.publish(k, k.encode(), v, message_id=f"{case.prefix}-{k}")
        arrived = {key: at for at, key, _p, _b in await case.collect(queue, len(cases), 30)}
        found = await wait_parked(case.settings, case.names.destination, len(bad))
    for key in ("none", "negative", "zero"):
        assert arrived[key] - sent[key] < 3, key
    assert_on_time(sent["decimal"], 600, arrived["decimal"])
    assert_on_time(sent["string"], 700, arrived["string"])
    counted = {
        outcome: REGISTRY.get_sample_value(
            "rmqdelay_bridge_messages_total",
            {"exchange": case.names.exchange, "outcome": outcome},
        )
        for outcome in ("scheduled", "parked")
    }
    assert counted == {"scheduled": len(cases), "parked": len(bad)}  # --metrics-port serves
    reasons = {p.message_id: p.reason for p in found}
    assert set(reasons) == {f"{case.prefix}-{k}" for k in bad}
    assert "'abc' is not a whole number" in reasons[f"{case.prefix}-word"]
    assert "(bool) is not a number" in reasons[f"{case.prefix}-bool"]
    assert "(dict) is not a number" in reasons[f"{case.prefix}-table"]
    assert "over max_delay 1h" in reasons[f"{case.prefix}-huge"]
    assert case.ready(queue) == 0


async def test_a_parked_message_is_delivered_by_replay_once_a_queue_is_bound(
    case: BridgeCase,
) -> None:
    case.declare("direct")
    async with case.running():
        case.publish("late-binder", b"wait for me", 100, message_id=f"{case.prefix}-lb")
        await wait_parked(case.settings, case.names.destination, 1)
        queue = case.bind("late-binder")
        replay = ["parked", "replay", "-d", case.names.destination]
        result = await asyncio.to_thread(run_cli, settings_env(case.settings), *replay)
        assert result.returncode == 0, result.stderr
        [(_at, key, props, body)] = await case.collect(queue, 1, 30)
    assert (key, body, props.message_id) == ("late-binder", b"wait for me", f"{case.prefix}-lb")
    assert not await parked(case.settings, case.names.destination)


# ---------------------------------------------------------------- journal


async def test_scheduled_list_and_cancel_work_for_bridged_messages(case: BridgeCase) -> None:
    case.declare("topic")
    queue = case.bind("#")
    keep, drop = f"{case.prefix}-keep", f"{case.prefix}-drop"
    async with case.running():
        sent = case.publish("k", b"keep", 2500, message_id=keep)
        case.publish("k", b"drop", 2500, message_id=drop)
        with Publisher(case.settings) as publisher:

            def listed() -> set[str]:
                found = publisher.list_scheduled(destination=case.names.destination)
                return {r.message_id for r in found}

            await wait_until(lambda: {keep, drop} <= listed(), 20, "both in scheduled list")
            [result] = publisher.cancel(drop)
        assert result.outcome == "cancelled"
        [(at, _key, props, body)] = await case.collect(queue, 1, 30)
        assert (props.message_id, body) == (keep, b"keep")
        assert_on_time(sent, 2500, at)
        await asyncio.sleep(1.0)  # the cancelled copy was due with the kept one
    assert case.ready(queue) == 0


# ---------------------------------------------------------------- declare


def test_declare_is_idempotent_and_warns_about_queues_still_bound_to_the_exchange(
    case: BridgeCase,
) -> None:
    case.declare("topic")
    stray = f"{case.prefix}.stray"
    case.channel.queue_declare(stray, durable=True)
    case.channel.queue_bind(stray, case.names.exchange, "orders.#")
    again = case.declare("topic")
    [warning] = again.warnings
    assert repr(stray) in warning and "'orders.#'" in warning
    assert repr(case.names.delivery_exchange) in warning and "at once" in warning
    declare = ["bridge", "declare", "--exchange", case.names.exchange, "--type", "topic"]
    result = run_cli(settings_env(case.settings), *declare)
    assert result.returncode == 0, result.stderr
    assert repr(case.names.delivery_exchange) in result.stdout
    assert f"warning: queue {stray!r}" in result.stderr


def test_declare_refuses_another_type_naming_the_fix(case: BridgeCase) -> None:
    case.declare("topic")
    with pytest.raises(TopologyError, match=r"exists with type=.*topic.*give --type its type"):
        case.declare("direct")


def test_declare_refuses_to_replace_another_policy(case: BridgeCase, admin: BrokerAdmin) -> None:
    pattern = "^" + case.names.exchange.replace(".", r"\.") + "$"
    name = f"{case.prefix}.theirs"
    theirs = admin.policy(name, pattern, {"alternate-exchange": "elsewhere"}, apply_to="exchanges")
    with theirs, pytest.raises(TopologyError, match=f"has the policy '{name}'"):
        case.declare("direct")


def test_run_names_what_is_missing_and_the_command_that_declares_it(case: BridgeCase) -> None:
    run = ["bridge", "run", "--exchange", case.names.exchange]
    result = run_cli(settings_env(case.settings), *run)
    assert result.returncode == 1
    assert f"queue {case.names.inbox!r}" in result.stderr
    assert f"exchange {case.names.delivery_exchange!r}" in result.stderr
    assert f"run `rmqdelay bridge declare --exchange {case.names.exchange} --type" in result.stderr
    assert "Traceback" not in result.stderr and "WARNING" not in result.stderr


# ---------------------------------------------------------------- stage 1 in a process


async def test_the_inbox_process_names_a_missing_inbox_and_stops_when_told(
    case: BridgeCase,
) -> None:
    """What the thread says, the process says (a missing inbox stops the worker, naming
    the command); told to stop, it stops consuming and ends, without the bridge taking
    that for a lost connection. (Its end with a killed bridge: test_bridge_kill.)"""
    from rmqdelay.bridge.app import Bridge, _Child
    from rmqdelay.errors import WorkerError

    inbox = Bridge(case.settings, case.names.exchange, inbox_process=True).inbox
    with pytest.raises(WorkerError, match=f"inbox queue {case.names.inbox!r} does not exist"):
        await _Child.start(inbox, [], asyncio.Event())
    case.declare("topic")
    lost = asyncio.Event()
    child = await _Child.start(inbox, [], lost)
    try:
        consumers = case.channel.queue_declare(case.names.inbox, passive=True).method
        assert consumers.consumer_count == 1
        await asyncio.to_thread(child.stop, 20)
        assert child.process.exitcode == 0
        method = case.channel.queue_declare(case.names.inbox, passive=True).method
        assert method.consumer_count == 0
        await asyncio.sleep(0.1)
        assert not lost.is_set()
    finally:
        if child.process.is_alive():
            child.process.kill()


# ---------------------------------------------------------------- stage 1's wait


@contextlib.contextmanager
def _stage_one(
    case: BridgeCase, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, Any]]:
    """An opened stage 1 (the carrier, and its connection) on pika's private path or its
    public one, stopped and closed after the block."""
    from rmqdelay.amqp import pika_private
    from rmqdelay.bridge import inbox as bridge_inbox

    monkeypatch.setattr(pika_private, "FAST", fast)
    case.declare("topic")
    carrier = bridge_inbox.InboxCarrier(case.settings, case.names)
    carrier.open()
    try:
        assert carrier._fast is fast
        assert carrier._connection is not None
        yield carrier, carrier._connection
    finally:
        carrier.stop()
        if carrier._connection is not None:
            carrier._connection.close()


@pytest.mark.parametrize("fast", [True, False], ids=["pika-private", "pika-public"])
def test_an_idle_inbox_takes_a_message_as_it_comes_not_at_the_end_of_its_wait(
    case: BridgeCase, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing in hand, stage 1 waits for the first message, and is done waiting
    once it comes (its batch then lingers LINGER_US for others): an ``x-delay`` of 0 is
    not held for the rest of the idle wait, on pika's private path or its public one."""
    with _stage_one(case, fast, monkeypatch) as (carrier, connection):
        carrier.idle_s = 60.0  # the whole wait, were the message not to end it
        later = threading.Timer(0.5, case.publish, ("k", b"now", 0))
        later.start()
        started = time.monotonic()
        while not carrier._pending and time.monotonic() - started < 60:
            carrier._wait(connection)
        waited = time.monotonic() - started
        later.join(30)  # its publish confirmed before the case's connection closes
        assert len(carrier._pending) == 1
        assert waited < 20, f"the first message ended the wait after {waited:.1f} s"


@pytest.mark.parametrize("fast", [True, False], ids=["pika-private", "pika-public"])
def test_a_batch_lingers_no_longer_than_its_shortest_delay_allows(
    case: BridgeCase, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch in hand waits ``LINGER_US`` for others, unless a message with a shorter
    delay comes: an ``x-delay`` of 0 ends the linger at once, though the first message
    of the batch could have waited a minute."""
    from rmqdelay.bridge import inbox as bridge_inbox

    monkeypatch.setattr(bridge_inbox, "LINGER_US", 60_000_000)
    with _stage_one(case, fast, monkeypatch) as (carrier, connection):
        case.publish("k", b"later", 3_600_000)
        started = time.monotonic()
        while not carrier._pending and time.monotonic() - started < 30:
            carrier._wait(connection)
        assert len(carrier._pending) == 1
        later = threading.Timer(0.5, case.publish, ("k", b"now", 0))
        later.start()
        started = time.monotonic()
        carrier._wait(connection)  # the linger: 60 s, were the second not to end it
        while len(carrier._pending) < 2 and time.monotonic() - started < 60:
            carrier._wait(connection)
        carrier._wait(connection)  # the batch is due now: no wait
        waited = time.monotonic() - started
        later.join(30)  # its publish confirmed before the case's connection closes
        assert len(carrier._pending) == 2
        assert waited < 20, f"the x-delay 0 message ended the linger after {waited:.1f} s"
