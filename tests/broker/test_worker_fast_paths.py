"""The worker's reaches past its clients' public APIs (aiormq's deliveries without a task
each, aio-pika's message built without its per-attribute lock check, acks made as aiormq's
writer takes them) give the same outcome as the public way, which
``RMQDELAY_CLIENT_FAST=0`` asks for."""

from __future__ import annotations

from typing import Any

import pytest
from aio_pika import IncomingMessage
from aio_pika.abc import AbstractIncomingMessage

from rmqdelay.amqp import aiopika_private, aiormq_private
from rmqdelay.amqp.aio_publisher import AsyncPublisher
from rmqdelay.core.messages import DUE_AT
from rmqdelay.worker import session as session_module
from rmqdelay.worker.acks import Acker
from rmqdelay.worker.context import Context
from rmqdelay.worker.delivery import Delivery
from rmqdelay.worker.hooks import WorkerHook
from tests.helpers.worker_helpers import WorkerCase, queue_depth, wait_until, work_queue

COUNT = 30


class Seen(WorkerHook):
    """Every message the hooks are shown, as they are shown it."""

    def __init__(self) -> None:
        self.messages: list[AbstractIncomingMessage] = []

    def admit(
        self, delivery: Delivery, message: AbstractIncomingMessage, publisher: AsyncPublisher
    ) -> None:
        self.messages.append(message)
        return None


@pytest.mark.parametrize("fast", ["1", "0"])
async def test_deliveries_come_the_same_either_way(
    worker_case: WorkerCase, monkeypatch: pytest.MonkeyPatch, fast: str
) -> None:
    monkeypatch.setenv("RMQDELAY_CLIENT_FAST", fast)
    dest, settings, app, calls = worker_case
    seen = Seen()
    app.add_hook(seen)
    at_once: list[bool] = []
    tasks: list[int] = [0]
    built: list[int] = [0]
    real_at_once, real_fast = aiormq_private.deliver_at_once, aiopika_private._fast

    def counted_at_once(underlay: Any) -> bool:
        at_once.append(real_at_once(underlay))
        create_task = underlay.create_task

        def counted_task(coro: Any) -> Any:
            tasks[0] += getattr(coro, "__qualname__", "").endswith("._consume.<locals>.deliver")
            return create_task(coro)

        underlay.create_task = counted_task
        return at_once[-1]

    def counted_fast(delivered: Any, no_ack: bool = False) -> IncomingMessage:
        built[0] += 1
        return real_fast(delivered, no_ack)

    ackers: list[Acker] = []

    class Counted(Acker):
        def __init__(self, channel: Any) -> None:
            super().__init__(channel)
            ackers.append(self)

    monkeypatch.setattr(session_module, "deliver_at_once", counted_at_once)  # as imported
    monkeypatch.setattr(aiopika_private, "_fast", counted_fast)
    monkeypatch.setattr(session_module, "Acker", Counted)

    @app.handler(dest, max_attempts=1)
    async def handle(body: str, ctx: Context) -> None:
        calls.record(body, ctx)

    async with AsyncPublisher(settings) as publisher:
        sent = await publisher.publish_many(
            [{"destination": dest, "body": f"m{i}", "delay": 0} for i in range(COUNT)]
        )
    ids = {r.message_id for r in sent}
    async with app.running(concurrency=4, prefetch=16):
        await wait_until(lambda: len(calls) >= COUNT, 20, lambda: f"{len(calls)} handled")
    assert sorted(c.value for c in calls.items) == sorted(f"m{i}" for i in range(COUNT))
    assert await queue_depth(settings, work_queue(settings, dest)) == 0  # every one acked
    assert {m.message_id for m in seen.messages} == ids
    for message in seen.messages:
        assert type(message) is IncomingMessage
        assert message.body and message.message_id in ids
        assert DUE_AT in message.headers and message.delivery_tag
        assert message.consumer_tag and not message.redelivered and not message.locked
    (acker,) = ackers
    assert 1 <= acker.frames <= COUNT
    if fast == "1":
        assert at_once == [True]
        assert tasks[0] == 0, "aiormq started a task per delivery"
        assert built[0] == COUNT
        assert acker.made_late == acker.frames
    else:
        assert at_once == [False]
        assert tasks[0] == COUNT
        assert built[0] == 0
        assert acker.made_late == 0
