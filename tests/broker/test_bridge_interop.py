"""The x-delay bridge with a publisher in another language: Node's amqplib
(``tests/interop/node/publish.js``), written as for the delayed-message plugin (an
``x-delay`` header, the plugin's exchange name); only its ``assertExchange`` type changed.

``node`` and ``npm`` must be on the PATH; the package's locked dependencies are installed
on first use (``make interop-deps`` does the same). Without them the tests skip, except
under ``CI``, where they fail.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from tests.helpers.bridge_helpers import BridgeCase, assert_on_time, bridge_case
from tests.helpers.worker_helpers import TestTopology

NODE_DIR = Path(__file__).resolve().parents[1] / "interop" / "node"


@pytest.fixture(scope="session")
def node_publisher() -> Path:
    """``publish.js``, its dependencies installed (``npm ci``, once, under a lock: two
    suites may run side by side)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        why = "node and npm are needed for the Node interop tests (tests/interop/node)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must have them", pytrace=False)
        pytest.skip(why)
    with open(NODE_DIR / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (NODE_DIR / "node_modules" / "amqplib" / "package.json").exists():
            subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund"],
                cwd=NODE_DIR,
                check=True,
                capture_output=True,
                timeout=600,
            )
    return NODE_DIR / "publish.js"


def publish_node(
    script: Path, case: BridgeCase, kind: str, messages: list[dict[str, Any]]
) -> list[float]:
    """Publish with amqplib; the time (s) just before each publish, in order."""
    spec = {"url": case.url, "exchange": case.names.exchange, "type": kind, "messages": messages}
    done = subprocess.run(
        ["node", str(script)],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["index"] for line in lines] == list(range(len(messages)))
    return [line["sentAt"] / 1000 for line in lines]


async def aio_get(case: BridgeCase, queue: str) -> Any:
    """One message of ``queue``, polled for, read by aio-pika (pamqp's decoder)."""
    connection = await aio_pika.connect(case.url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        deadline = time.monotonic() + 30
        while (message := await declared.get(no_ack=True, fail=False)) is None:
            assert time.monotonic() < deadline, f"nothing arrived in {queue}"
            await asyncio.sleep(0.05)
        return message
    finally:
        await connection.close()


@pytest.fixture
def case(shared_topology: TestTopology, amqp_url: str) -> Iterator[BridgeCase]:
    with bridge_case(shared_topology, amqp_url) as found:
        yield found


# the first run on a fresh machine installs the Node packages (npm ci, up to 600 s)
@pytest.mark.timeout(900)
async def test_a_node_publisher_gets_the_seeds_in_due_order_never_early(
    case: BridgeCase, node_publisher: Path
) -> None:
    """The seeds' case, 5, 4, 3, 2, 1 s published in that order, arrives 1 to 5, each at
    its time; routing by key on a direct exchange; amqplib's header and property types."""
    case.declare("direct")
    seeds, other, types = case.bind("seed"), case.bind("other"), case.bind("types")
    headers = {
        "tenant": "acme",
        "count": 7,
        "ratio": 1.5,
        "big": 2**40,
        "flag": True,
        "tags": ["a", 1],
        "meta": {"k": "v"},
        "nothing": None,
    }
    options = {
        "contentType": "application/json",
        "contentEncoding": "utf-8",
        "correlationId": "corr-1",
        "replyTo": "replies",
        "messageId": f"{case.prefix}-3",
        "timestamp": 1_900_000_000,
        "type": "order.created",
        "appId": "shop",
        "priority": 5,
        "persistent": True,
        "expiration": "600000",
    }
    messages: list[dict[str, Any]] = [
        {
            "routingKey": "seed",
            "body": f"seed {s}",
            "delay": s * 1000,
            "options": options if s == 3 else {"messageId": f"{case.prefix}-{s}"},
        }
        for s in (5, 4, 3, 2, 1)
    ]
    messages.append({"routingKey": "types", "body": "t", "delay": 100, "headers": headers})
    messages += [
        {"routingKey": "other", "body": "float", "delay": 1500.7, "options": {"messageId": "f"}},
        {"routingKey": "other", "body": "string", "delay": "1200", "options": {"messageId": "s"}},
    ]
    async with case.running():
        sent = publish_node(node_publisher, case, "direct", messages)
        arrived, extra, typed = await asyncio.gather(
            case.collect(seeds, 5, 30), case.collect(other, 2, 30), aio_get(case, types)
        )
    bodies = [body for _at, _key, _props, body in arrived]
    assert bodies == [f"seed {s}".encode() for s in (1, 2, 3, 4, 5)]
    for (at, key, _props, _body), s in zip(arrived, (1, 2, 3, 4, 5), strict=True):
        assert key == "seed"
        assert_on_time(sent[(5, 4, 3, 2, 1).index(s)], s * 1000, at)
    # x-delay removed, every value as amqplib sent it (read by aio-pika: pika's decoder
    # turns a double into an int)
    assert typed.headers == headers
    props = arrived[2][2]
    assert (props.content_type, props.content_encoding) == ("application/json", "utf-8")
    assert (props.correlation_id, props.reply_to, props.message_id) == (
        "corr-1",
        "replies",
        f"{case.prefix}-3",
    )
    assert (props.type, props.app_id, props.priority) == ("order.created", "shop", 5)
    assert (props.delivery_mode, props.expiration) == (2, "600000")
    assert props.timestamp == 1_900_000_000  # pika reads the property as an int
    timed = {props.message_id: (at, body) for at, _key, props, body in extra}
    assert_on_time(sent[6], 1500, timed["f"][0])  # a float x-delay is truncated
    assert_on_time(sent[7], 1200, timed["s"][0])  # an integer string is read
    assert case.ready(seeds) == 0 and case.ready(other) == 0 and case.ready(types) == 0
