"""The x-delay bridge's destination is held: its messages skip the tiers' lowest digits
and reach the bridge's delivery side up to a hold window early, which waits out the
rest before it publishes to ``DNAME``. Never early, fewer hops."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rmqdelay import plan_delay
from rmqdelay.amqp.topology_manager import TopologyManager
from rmqdelay.bridge.app import Bridge
from rmqdelay.worker.delivery import Delivery
from rmqdelay.worker.hooks import Settled, WorkerHook
from tests.helpers.bridge_helpers import BridgeCase, assert_on_time, bridge_case
from tests.helpers.worker_helpers import TestTopology

DELAYS_MS = [1000, 2000, 2700, 4000, 5500]
"""Under one hold window (5.12 s): straight to the work queue; over it: one hop."""


@pytest.fixture
def case(shared_topology: TestTopology, amqp_url: str) -> Iterator[BridgeCase]:
    with bridge_case(shared_topology, amqp_url) as found:
        yield found


class Hops(WorkerHook):
    """The tiers each copy went through (its ``x-death`` entries), by message id."""

    def __init__(self) -> None:
        self.hops: dict[str, int] = {}

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        self.hops[delivery.message_id] = len(delivery.headers.get("x-death") or [])


async def test_x_delay_messages_arrive_never_early_with_fewer_hops(case: BridgeCase) -> None:
    declared = case.declare("topic")
    assert "(held:" in declared.describe()[1]
    marker = case.settings.layout.held_marker(case.names.destination)
    with TopologyManager(case.settings) as manager:  # the bridge's own marker: not stale
        assert marker not in manager.stale_markers([case.names.destination])
    queue = case.bind("#")
    hops = Hops()
    bridge = Bridge(case.settings, case.names.exchange, hooks=[hops])
    sent: dict[str, tuple[float, int]] = {}
    async with bridge.running(concurrency=4):
        for n, ms in enumerate(DELAYS_MS):
            message_id = f"{case.prefix}-{n}"
            sent[message_id] = (case.publish("k", b"x", ms, message_id=message_id), ms)
        received = await case.collect(queue, len(DELAYS_MS), 30)
    layout, destination = case.settings.layout, case.names.destination
    for at, _key, props, _body in received:
        sent_at, ms = sent[props.message_id]
        assert_on_time(sent_at, ms, at)  # never early
        plain = len(plan_delay(layout, ms * 1000, destination).hops)
        assert hops.hops[props.message_id] < plain, (ms, hops.hops, plain)
    assert {m: hops.hops[m] for m in sent} == {
        f"{case.prefix}-{n}": 0 if ms < layout.hold_ms else 1 for n, ms in enumerate(DELAYS_MS)
    }
    assert case.ready(queue) == 0
