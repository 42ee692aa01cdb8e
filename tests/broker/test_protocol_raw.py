"""docs/protocol.md followed with plain pika: messages published straight into the tiers,
without rmqdelay's publisher, reach rmqdelay's worker at their due time, never early.

The publishing side uses only pika, the management API and
:mod:`tests.helpers.protocol_port` (the page written as code, no rmqdelay import): the
layout is read from the tier queues as §1 says, the plan is §2-3's, the properties §4's,
the confirms §5's and the journal records §6's. The module's shared topology (its
default layout: 10 ms, radix 16, max_delay 1h) is what it publishes into.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
import pytest

from rmqdelay import Context, Delivery, Publisher, Settings, Settled, WorkerHook
from rmqdelay.amqp.management import ManagementApi
from tests.helpers.brokerctl import BrokerAdmin, with_login
from tests.helpers.protocol_port import (
    PortLayout,
    due_ms,
    headers,
    journal_line,
    layout_from_queues,
)
from tests.helpers.worker_helpers import TestTopology, WorkerCase, wait_until

# delays in ms: straight to the work queue, one hop, two, three, four, and a few that
# share tiers; all under 4 s, so the module stays short
DELAYS_MS = [0, 10, 250, 1230, 2500, 3333, 3010, 1999]


@dataclass
class Sent:
    message_id: str
    delay_ms: int
    due_ms: int
    body: Any
    hops: int


def read_layout(settings: Settings) -> PortLayout:
    """§1: the layout from the tier queues' names and TTLs; max_delay from the settings."""
    prefix = settings.prefix
    queues = ManagementApi.for_settings(settings, timeout=10).queues(f"{prefix}.tier.")
    read = layout_from_queues(
        prefix, [(q["name"], int(q["arguments"]["x-message-ttl"])) for q in queues]
    )
    assert read["top"] >= 1
    return PortLayout(
        prefix=prefix,
        resolution_ms=read["resolution_ms"],
        radix=read["radix"],
        max_delay_ms=settings.layout.max_delay_ms,
        named_tiers_ms=tuple(read["named_tiers_ms"]),
    )


class RawPublisher:
    """§4-6 with a pika BlockingConnection: confirms, mandatory, the journal record."""

    def __init__(self, url: str, layout: PortLayout) -> None:
        self.layout = layout
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()  # §5.2: every basic_publish waits for its confirm
        self.checked: set[str] = set()

    def close(self) -> None:
        self.connection.close()

    def publish(
        self, destination: str, body: bytes, content_type: str, delay_ms: int, *, journal: bool
    ) -> Sent:
        if destination not in self.checked:  # §5.1: the work queue exists
            self.channel.queue_declare(self.layout.work_queue(destination), passive=True)
            self.checked.add(destination)
        start_us = time.time_ns() // 1000
        due = due_ms(start_us, delay_ms * 1000)
        message_id = str(uuid.uuid4())
        # §4: plan what is left of the delay when it is sent
        plan = self.layout.plan(delay_ms * 1000 - (time.time_ns() // 1000 - start_us), destination)
        properties = pika.BasicProperties(
            delivery_mode=2,
            message_id=message_id,
            content_type=content_type,
            headers=headers(due, destination),
        )
        self.channel.basic_publish(
            plan["exchange"], plan["publish_key"], body, properties, mandatory=True
        )
        if journal:  # §6, confirmed like the message
            record = journal_line(message_id, destination, due, len(body), time.time_ns() // 10**6)
            journal_properties = pika.BasicProperties(
                delivery_mode=2,
                content_type="application/json",
                type="rmqdelay-journal",
                message_id=f"journal-{uuid.uuid4()}",
            )
            self.channel.basic_publish(
                f"{self.layout.prefix}.schedule", "", record, journal_properties, mandatory=True
            )
        return Sent(message_id, delay_ms, due, body, len(plan["hops"]))


Raw = tuple[WorkerCase, RawPublisher]


@pytest.fixture
def raw(shared_topology: TestTopology, amqp_url: str, admin: BrokerAdmin) -> Iterator[Raw]:
    """The worker case, and a raw publisher logged in as a user with §5's permissions
    only: write on the tier exchanges, the journal and the default exchange, read on the
    work queues."""
    case = shared_topology.worker("raw")
    layout = read_layout(case.settings)
    prefix = re.escape(layout.prefix)
    user, secret = f"{shared_topology.prefix}-raw", uuid.uuid4().hex
    write = rf"^({prefix}\.tier\..*|{prefix}\.schedule|amq\.default)$"
    read = rf"^{prefix}\.work\..*$"  # for the passive check, from RabbitMQ 4.2.6 on
    admin.add_user(user, secret, configure="^$", write=write, read=read, vhost=admin.vhost)
    publisher = RawPublisher(with_login(amqp_url, user, secret), layout)
    yield case, publisher
    publisher.close()


async def test_raw_messages_are_delivered_at_their_due_time(raw: Raw) -> None:
    (dest, settings, app, calls), publisher = raw
    assert publisher.layout.radix == settings.radix
    assert publisher.layout.resolution_ms == settings.layout.resolution_ms

    @app.handler(dest)
    async def handle(msg: Any, ctx: Context) -> None:  # no annotation: by content type
        calls.record(msg, ctx)

    async with app.running():
        sent: list[tuple[Sent, Any]] = []
        for n, delay in enumerate(DELAYS_MS):
            value: Any
            if n % 2:
                body, content_type, value = f"text {n}".encode(), "text/plain", f"text {n}"
            else:
                value = {"n": n, "delay_ms": delay}
                body, content_type = json.dumps(value).encode(), "application/json"
            sent.append((publisher.publish(dest, body, content_type, delay, journal=False), value))
        await wait_until(lambda: len(calls) >= len(sent), 20, f"{len(sent)} handler calls")

    hops = [s.hops for s, _ in sent]
    assert min(hops) == 0 and max(hops) == 3, hops  # the default exchange, and three tiers
    for message, value in sent:
        (call,) = calls.of(message.message_id)
        assert call.value == value
        assert call.attempt == 1
        assert call.due_at is not None
        assert round(call.due_at.timestamp() * 1000) == message.due_ms
        assert call.at * 1000 >= message.due_ms, f"{message.delay_ms} ms delay handled early"
        assert call.lateness is not None
        # a generous sanity bound: bench/ measures lateness
        assert call.lateness.total_seconds() < 3, (message.delay_ms, call.lateness)


class Outcomes(WorkerHook):
    """What the worker did with each message id."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        self.seen[delivery.message_id] = settled.outcome


async def test_raw_records_are_listed_and_a_cancel_skips_the_copy(raw: Raw) -> None:
    (dest, settings, app, calls), publisher = raw
    outcomes = Outcomes()
    app.add_hook(outcomes)

    @app.handler(dest)
    async def handle(msg: dict[str, Any], ctx: Context) -> None:
        calls.record(msg, ctx)

    async with app.running():
        kept = publisher.publish(dest, b'{"keep": 1}', "application/json", 1500, journal=True)
        dropped = publisher.publish(dest, b'{"keep": 0}', "application/json", 1500, journal=True)
        with Publisher(settings) as rmqdelay_publisher:
            listed = {
                s.message_id: s.due_at_ms
                for s in rmqdelay_publisher.list_scheduled(destination=dest)
            }
            assert listed == {kept.message_id: kept.due_ms, dropped.message_id: dropped.due_ms}
            [result] = rmqdelay_publisher.cancel(dropped.message_id)
            assert result.outcome == "cancelled"
            assert result.cancelled_due_ms == (dropped.due_ms,)
        await wait_until(
            lambda: len(outcomes.seen) >= 2, 20, lambda: f"2 outcomes: {outcomes.seen}"
        )
    assert outcomes.seen == {kept.message_id: "acked", dropped.message_id: "cancelled"}
    assert [c.value for c in calls.of(kept.message_id)] == [{"keep": 1}]
    assert calls.of(dropped.message_id) == []


def test_what_the_broker_refuses_comes_back(raw: Raw) -> None:
    """§5.3: a delay of 0 to a destination without a work queue is returned; a tier
    exchange that does not exist closes the channel with 404."""
    (dest, _settings, _app, _calls), publisher = raw
    layout = publisher.layout
    properties = pika.BasicProperties(delivery_mode=2, message_id=str(uuid.uuid4()))
    with pytest.raises(pika.exceptions.UnroutableError):
        publisher.channel.basic_publish(
            "", layout.work_queue(f"{dest}-none"), b"x", properties, mandatory=True
        )
    plan = layout.plan(250_000, dest)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        publisher.channel.basic_publish(
            plan["exchange"] + "-missing", plan["publish_key"], b"x", properties, mandatory=True
        )
    assert closed.value.reply_code == 404
