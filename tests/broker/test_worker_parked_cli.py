"""``rmqdelay parked list / replay / purge`` against parked messages on a real broker."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from rmqdelay.amqp.aio_publisher import AsyncPublisher
from rmqdelay.core.handling.retry import Backoff
from rmqdelay.settings import Settings
from rmqdelay.worker.context import Context
from tests.helpers.cli import invoke, settings_env
from tests.helpers.worker_helpers import (
    TestTopology,
    drain,
    parking_queue,
    queue_depth,
    wait_until,
    work_queue,
)


async def cli(settings: Settings, *args: str) -> tuple[int, str]:
    """Run the CLI in a thread (it runs its own event loop); return code and output."""
    result = await asyncio.to_thread(invoke, settings_env(settings), *args)
    return result.exit_code, result.output


async def wait_parked(settings: Settings, count: int) -> None:
    parking = parking_queue(settings)
    for _ in range(200):
        if await queue_depth(settings, parking) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {count} messages were parked")


async def test_parked_list_then_replay_delivers_them_back(shared_topology: TestTopology) -> None:
    worker_case = shared_topology.worker("orders", "emails")
    orders, settings, app, calls = worker_case
    emails = shared_topology.dest("emails")
    broken = True

    @app.handler(orders, max_attempts=2, backoff=Backoff.constant("50ms"))
    async def handle(msg: dict[str, Any], ctx: Context) -> None:
        calls.record(msg, ctx)
        if broken:
            raise RuntimeError("payment service down")

    async with worker_case.running(concurrency=3) as publisher:
        sent = await publisher.publish_many(
            {"destination": orders, "body": {"order": i}, "delay": 0, "headers": {"k": i}}
            for i in range(3)
        )
        ids = {s.message_id for s in sent}
        await wait_parked(settings, 3)

        code, output = await cli(settings, "parked", "list", "--json")
        assert code == 0, output
        listed = [json.loads(line) for line in output.splitlines()]  # one object a line
        assert {item["message_id"] for item in listed} == ids
        for item in listed:
            assert item["destination"] == orders
            assert item["attempts"] == 2
            assert (
                "gave up after 2 of 2 attempts: RuntimeError: payment service down"
                in (item["reason"])
            )
            assert item["parked_at"] is not None
            assert item["error_type"] == "builtins.RuntimeError"
        code, output = await cli(settings, "parked", "list", "--json", "-d", emails)
        assert code == 0 and output == ""

        code, output = await cli(settings, "parked", "list")
        assert code == 0, output
        assert "payment service down" in output and "3 parked in all" in output
        for message_id in ids:
            assert message_id in output
        assert await queue_depth(settings, parking_queue(settings)) == 3  # still all there

        broken = False
        before = len(calls)
        code, output = await cli(settings, "parked", "replay", "--delay", "100ms")
        assert code == 0, output
        assert "replayed 3 message(s)" in output
        await wait_until(lambda: len(calls) >= before + 3, 10, "the replayed messages")
        await asyncio.sleep(0.3)

    replayed = calls.items[before:]
    assert {c.message_id for c in replayed} == ids
    assert all(c.attempt == 1 for c in replayed)  # the count starts again
    assert all(c.headers["rmqdelay-replays"] == 1 for c in replayed)
    assert not any(k.startswith("rmqdelay-parked-") for c in replayed for k in c.headers)
    assert sorted(c.headers["k"] for c in replayed) == [0, 1, 2]
    assert await queue_depth(settings, parking_queue(settings)) == 0


async def test_parked_replay_with_a_limit_and_purge(shared_topology: TestTopology) -> None:
    orders, settings, app, _ = shared_topology.worker("orders", "emails")
    emails = shared_topology.dest("emails")

    @app.handler(orders)
    async def handle_orders(msg: dict[str, int]) -> None:
        pass

    @app.handler(emails)
    async def handle_emails(msg: dict[str, int]) -> None:
        pass

    parking = parking_queue(settings)
    async with AsyncPublisher(settings) as publisher:
        async with app.running(concurrency=4):  # every body is invalid: all parked at once
            await publisher.publish_many(
                {"destination": d, "body": "not json", "delay": 0, "reply_to": "replies"}
                for d in [orders] * 24 + [emails] * 2
            )
            await wait_parked(settings, 26)
        # No worker now: a replayed message waits in its work queue.
        code, output = await cli(settings, "parked", "replay", "-d", orders, "--limit", "20")
        assert code == 0, output
        assert "replayed 20 message(s)" in output
        await _depth_becomes(settings, parking, 6)
        replayed = await drain(settings, work_queue(settings, orders))
        assert len(replayed) == 20
        assert {(m.reply_to, m.content_type) for m in replayed} == {
            ("replies", "text/plain; charset=utf-8")
        }

        code, output = await cli(settings, "parked", "purge", "-d", emails)
        assert code == 2 and "--yes" in output  # a usage error, as for every command
        assert await queue_depth(settings, parking) == 6
        code, output = await cli(settings, "parked", "purge", "--yes", "-d", emails)
        assert code == 0 and f"purged 2 parked message(s) of '{emails}'" in output, output
        # the walk gave the other 4 back by closing its channel; a quorum queue applies
        # those returns after the close (4.3.6 once showed 0 ready right after it)
        await _depth_becomes(settings, parking, 4)
        code, output = await cli(settings, "parked", "purge", "--yes")
        assert code == 0 and "purged 4 parked message(s)" in output, output
        assert await queue_depth(settings, parking) == 0


async def _depth_becomes(settings: Settings, queue: str, count: int) -> None:
    deadline = time.monotonic() + 15
    while (depth := await queue_depth(settings, queue)) != count:
        assert time.monotonic() < deadline, f"{queue} holds {depth} ready, not {count}"
        await asyncio.sleep(0.1)
