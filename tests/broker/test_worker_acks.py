"""Batched acks on a real broker: a ``multiple`` ack never covers a message whose handler
still runs, or one that failed, and a worker stopped mid-batch gives back exactly what it
had not acked."""

from __future__ import annotations

import asyncio

from rmqdelay.amqp.aio_publisher import AsyncPublisher
from rmqdelay.core.handling.retry import Park, Requeue
from rmqdelay.worker.context import Context
from rmqdelay.worker.delivery import Delivery
from rmqdelay.worker.hooks import Settled, WorkerHook
from tests.helpers.worker_helpers import (
    WorkerCase,
    drain,
    parking_queue,
    wait_until,
    work_queue,
)


class Outcomes(WorkerHook):
    """Each delivery's outcome, by message id, in the order they were settled."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        self.seen.append((delivery.message_id, settled.outcome))


async def test_a_running_or_failed_message_is_never_in_a_batch(worker_case: WorkerCase) -> None:
    """fast, fast, slow (held), fast, parked, fast, requeued once, fast: all in hand at
    once. The worker is stopped at once while the slow one runs; only it comes back."""
    dest, settings, app, calls = worker_case
    outcomes = Outcomes()
    app.add_hook(outcomes)
    release = asyncio.Event()
    requeued: set[str] = set()
    bodies = ["f1", "f2", "slow", "f3", "park", "f4", "requeue", "f5"]

    @app.handler(dest, max_attempts=1)
    async def handle(body: str, ctx: Context) -> None:
        calls.record(body, ctx)
        if body == "slow":
            await release.wait()  # never set: the worker is stopped first
        elif body == "park":
            raise Park("a failure among successes")
        elif body == "requeue" and ctx.message_id not in requeued:
            requeued.add(ctx.message_id)
            raise Requeue()

    async with AsyncPublisher(settings) as publisher:
        ids = {}
        for body in bodies:  # one at a time: the work queue holds them in this order
            ids[body] = (await publisher.publish(dest, body, delay=0)).message_id
    wanted = {ids[b] for b in bodies if b != "slow"}

    def all_but_slow() -> bool:
        return wanted <= {i for i, o in outcomes.seen if o in ("acked", "parked")}

    async with app.running(concurrency=10, prefetch=10) as runner:  # all in hand at once
        await wait_until(all_but_slow, 20, lambda: f"the settles, so far {outcomes.seen}")
        # at once: the slow handler is cancelled, the connection closed, nothing acked
        runner.abort()
    assert not release.is_set()
    by_id = {i: b for b, i in ids.items()}
    outcome_of = {by_id[i]: outcome for i, outcome in outcomes.seen}
    assert outcome_of["park"] == "parked"
    assert outcome_of["requeue"] == "acked"  # requeued once, back, then handled
    assert ids["requeue"] in {i for i, o in outcomes.seen if o == "requeued"}
    assert "slow" not in outcome_of
    back = await drain(settings, work_queue(settings, dest))
    assert [m.message_id for m in back] == [ids["slow"]]
    parked = await drain(settings, parking_queue(settings))
    assert [m.message_id for m in parked] == [ids["park"]]
