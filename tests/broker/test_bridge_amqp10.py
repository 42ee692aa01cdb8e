"""The bridge reads AMQP 1.0 delivery times: ``x-opt-delivery-delay`` (ms) and
``x-opt-delivery-time`` (Unix ms), as an AMQP 1.0 client sets them as message
annotations (RabbitMQ 4 hands them to the bridge's 0-9-1 consumer as headers), and as a
0-9-1 publisher can set them as headers on any version. Never early, the latest of
several, parked with the header's name when unreadable; the delivered copy keeps none.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timezone
from urllib.parse import unquote, urlsplit

import pytest

from tests.helpers.bridge_helpers import BridgeCase, assert_on_time, bridge_case, wait_parked
from tests.helpers.worker_helpers import TestTopology

DELAY_HEADERS = {"x-delay", "x-opt-delivery-delay", "x-opt-delivery-time"}


@pytest.fixture
def case(shared_topology: TestTopology, amqp_url: str) -> Iterator[BridgeCase]:
    with bridge_case(shared_topology, amqp_url) as found:
        yield found


def ms_now() -> int:
    return time.time_ns() // 1_000_000


async def test_0_9_1_headers_named_as_the_annotations_are_read_on_every_version(
    case: BridgeCase,
) -> None:
    case.declare("topic")
    queue = case.bind("#")
    whole_second = (ms_now() // 1000 + 3) * 1000
    async with case.running():
        sent = {
            "delay": (case.publish("delay", b"1", headers={"x-opt-delivery-delay": 1500}), 1500),
            "time": (at := time.time(), 0),
            "several": (case.publish("several", b"3", 500, {"x-opt-delivery-delay": 2500}), 2500),
        }
        due_ms = ms_now() + 2000
        case.publish("time", b"2", headers={"x-opt-delivery-time": due_ms})
        stamp = datetime.fromtimestamp(whole_second / 1000, tz=timezone.utc)
        case.publish("stamp", b"4", headers={"x-opt-delivery-time": stamp})
        case.publish("past", b"5", headers={"x-opt-delivery-time": ms_now() - 60_000})
        bad = {"x-opt-delivery-delay": "soon"}
        case.publish("bad", b"6", headers=bad, message_id=f"{case.prefix}-bad")
        received = {key: (got, props) for got, key, props, _ in await case.collect(queue, 5, 30)}
        [parked] = await wait_parked(case.settings, case.names.destination, 1)
    for key in ("delay", "several"):
        assert_on_time(sent[key][0], sent[key][1], received[key][0])
    assert received["time"][0] >= due_ms / 1000 > at
    # a timestamp names a whole second (AMQP 0-9-1's): taken at its end, never early
    assert received["stamp"][0] >= (whole_second + 999) / 1000
    assert received["past"][0] - at < 3  # a time gone by: at once
    for _got, props in received.values():
        assert not DELAY_HEADERS & set(props.headers or {})  # no second delay downstream
    assert parked.message_id == f"{case.prefix}-bad"
    assert "x-opt-delivery-delay 'soon' is not a whole number" in parked.reason
    assert case.ready(queue) == 0


def amqp10(url: str) -> dict[str, object]:
    """qpid-proton's BlockingConnection arguments for an ``amqp://`` URL (vhost ``/``)."""
    parts = urlsplit(url)
    return {
        "url": f"amqp://{parts.hostname}:{parts.port or 5672}",
        "user": unquote(parts.username or "guest"),
        "password": unquote(parts.password or "guest"),
        "allowed_mechs": "PLAIN",
        "allow_insecure_mechs": True,
        "virtual_host": "vhost:/",
    }


async def test_an_amqp_1_0_clients_delivery_times_are_kept(
    case: BridgeCase, broker_version: tuple[int, ...]
) -> None:
    """A real AMQP 1.0 client (qpid-proton), as RabbitMQ 4's own clients and the Tanzu
    Delayed Queue's users send: annotations, symbol keys, a data section for the body."""
    if broker_version < (4, 0):
        pytest.skip("AMQP 1.0 is RabbitMQ 4's own; 0-9-1 headers are tested on every version")
    from proton import Message, symbol, timestamp
    from proton.utils import BlockingConnection

    case.declare("direct")
    queue = case.bind("k")
    connection = BlockingConnection(**amqp10(case.url))  # type: ignore[arg-type]
    sender = connection.create_sender(f"/exchanges/{case.names.exchange}/k")
    whole_second = (ms_now() // 1000 + 3) * 1000

    def send(name: str, annotations: dict[object, object]) -> float:
        at = time.time()
        message = Message(
            body=name.encode(),
            inferred=True,  # bytes as a data section: a 0-9-1 consumer gets them as sent
            id=f"{case.prefix}-{name}",
            annotations={symbol(k): v for k, v in annotations.items()},
            durable=True,
        )
        sender.send(message)  # settled by the broker: accepted
        return at

    async with case.running():
        try:
            delay_at = send("delay", {"x-opt-delivery-delay": 1500})
            due_ms = ms_now() + 2000
            time_at = send("time", {"x-opt-delivery-time": due_ms})
            send("stamp", {"x-opt-delivery-time": timestamp(whole_second + 400)})
            late_at = send("several", {"x-opt-delivery-delay": 2500, "x-opt-delivery-time": 1})
        finally:
            connection.close()
        got = {p.message_id: (at, p, b) for at, _k, p, b in await case.collect(queue, 4, 30)}
    name = f"{case.prefix}-"
    assert {k: body for k, (_a, _p, body) in got.items()} == {
        name + k: k.encode() for k in ("delay", "time", "stamp", "several")
    }
    assert_on_time(delay_at, 1500, got[name + "delay"][0])
    assert got[name + "time"][0] >= due_ms / 1000 > time_at
    # RabbitMQ hands an AMQP timestamp to 0-9-1 in whole seconds: the end of that second
    assert got[name + "stamp"][0] >= (whole_second + 999) / 1000
    assert_on_time(late_at, 2500, got[name + "several"][0])
    for _at, props, _body in got.values():
        assert not DELAY_HEADERS & set(props.headers or {})
    assert case.ready(queue) == 0
