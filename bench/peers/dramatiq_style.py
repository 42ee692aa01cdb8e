"""A dramatiq-style worker that holds delayed messages unacked in memory.

**This is our own small reimplementation of the pattern, not dramatiq itself** (dramatiq is
not installed here). What it reproduces from dramatiq's RabbitMQ broker: a delayed message
is published at once to a per-queue delay queue (``<queue>.DQ``) with its ``eta``; the
worker consumes the delay queue with a large prefetch, keeps each delivery *unacked* in an
in-memory heap until its eta, then re-enqueues it to the real queue (confirmed publish) and
acks the delay-queue delivery. A consumer of the real queue records the arrival.

Two hazards follow from holding deliveries unacked, and both are reported, not hidden:

* **memory**: every pending delayed message lives in the worker's RAM until due;
  :meth:`DramatiqStylePeer.memory_growth` measures worker RSS before/after holding N.
* **consumer_timeout**: RabbitMQ closes the channel of a consumer that holds an unacked
  delivery longer than ``consumer_timeout`` (default 30 min; 3.10 has only the global
  setting, per-queue ``x-consumer-timeout`` / policy arrived in 3.11.15/3.12). Every message
  then returns to the queue and is redelivered, and any delay longer than the timeout can
  never be served. :func:`broker_consumer_timeout_ms` reads the broker's value; the bench does
  not wait 30 minutes or change the shared broker's setting to demonstrate it.
* **prefetch ceiling**: only ``prefetch`` messages can be held; the rest wait in the delay
  queue behind them, in FIFO order, so an early-due message published after ``prefetch``
  later-due ones is blocked (head-of-line blocking again). dramatiq's default delay-queue
  prefetch is ``worker_threads * 1000``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import heapq
import itertools
import re
import subprocess
import tracemalloc
from collections.abc import Collection, Sequence
from typing import Any

from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from bench.common import DEFAULT_AMQP_URL, Record, now_ms, rss_kb
from bench.peers._amqp import (
    HDR_DUE,
    HDR_PUB,
    AmqpPeer,
    header_int,
    make_message,
    queue_args,
)
from bench.peers.base import Item, run_windowed, wait_event

DEFAULT_CONSUMER_TIMEOUT_MS = 1_800_000
HDR_ETA = "eta"


class DramatiqStylePeer(AmqpPeer):
    name = "dramatiq-style"
    slug = "dramatiq"

    def __init__(
        self,
        url: str = DEFAULT_AMQP_URL,
        queue_type: str = "quorum",
        *,
        delay_prefetch: int = 10_000,
        **kwargs: Any,
    ) -> None:
        self.delay_prefetch = delay_prefetch
        super().__init__(url, queue_type, **kwargs)

    def _configure(self) -> None:
        self.name = f"dramatiq-style-{self.queue_type}"
        self.queue = f"{self.prefix}.q"
        self.delay_queue = f"{self.prefix}.DQ"
        self.description = (
            f"OUR REIMPLEMENTATION of dramatiq's delay pattern (not dramatiq): publish at once "
            f"(aio-pika, confirms) to a {self.queue_type} delay queue with an `eta` header; "
            f"the worker consumes it with prefetch {self.delay_prefetch}, holds deliveries "
            f"unacked in an in-memory heap until eta, then re-enqueues to the {self.queue_type} "
            f"work queue (confirmed) and acks. Hazards: worker RAM per pending message, "
            f"consumer_timeout (unacked > 30 min closes the channel), prefetch ceiling."
        )
        self._heap: list[tuple[int, int, AbstractIncomingMessage]] = []
        self._seq = itertools.count()
        self._wake: asyncio.Event | None = None
        self._scheduler: asyncio.Task[None] | None = None
        self._work: AbstractExchange | None = None
        self.held_max = 0

    @property
    def held(self) -> int:
        """Deliveries currently held unacked in worker memory."""
        return len(self._heap)

    async def _declare(self) -> None:
        await self._declare_queue(self.queue, queue_args(self.queue_type))
        await self._declare_queue(self.delay_queue, queue_args(self.queue_type))
        await self._consume(self.queue)
        # The delay-queue worker gets its own channel so its big prefetch is separate.
        assert self._conn is not None
        self._worker_ch = await self._conn.channel(publisher_confirms=True)
        await self._worker_ch.set_qos(prefetch_count=self.delay_prefetch)
        self._work = self._worker_ch.default_exchange
        self._wake = asyncio.Event()
        self._scheduler = asyncio.create_task(self._schedule_loop())
        dq = await self._worker_ch.get_queue(self.delay_queue, ensure=False)
        await dq.consume(self._on_delayed)

    async def _on_delayed(self, message: AbstractIncomingMessage) -> None:
        eta = header_int(message, HDR_ETA)
        heapq.heappush(self._heap, (eta, next(self._seq), message))
        self.held_max = max(self.held_max, len(self._heap))
        assert self._wake is not None
        self._wake.set()

    async def _schedule_loop(self) -> None:
        assert self._wake is not None
        while True:
            if not self._heap:
                self._wake.clear()
                await self._wake.wait()
                continue
            wait_ms = self._heap[0][0] - now_ms()
            if wait_ms > 0:
                await wait_event(self._wake, wait_ms / 1000)
                continue
            due: list[AbstractIncomingMessage] = []
            now = now_ms()
            while self._heap and self._heap[0][0] <= now:
                due.append(heapq.heappop(self._heap)[2])
            await run_windowed(self._requeue, due, self.window)

    async def _requeue(self, message: AbstractIncomingMessage) -> None:
        """dramatiq's move: enqueue to the real queue (confirmed), then ack the DQ delivery."""
        assert self._work is not None
        msg = make_message(
            str(message.message_id),
            header_int(message, HDR_PUB),
            header_int(message, HDR_DUE),
            message.body,
        )
        await self._work.publish(msg, routing_key=self.queue)
        await message.ack()

    async def publish(self, batch: Sequence[Item]) -> None:
        ex = self.pub.default_exchange
        dq, q = self.delay_queue, self.queue

        async def send(item: Item) -> None:
            mid, delay_ms = item
            pub = now_ms()
            due = pub + delay_ms
            if delay_ms > 0:
                msg = make_message(mid, pub, due, self.body, extra_headers={HDR_ETA: due})
                await ex.publish(msg, routing_key=dq)
            else:
                await ex.publish(make_message(mid, pub, due, self.body), routing_key=q)

        await run_windowed(send, batch, self.window)

    async def drain(self, expected_ids: Collection[str], timeout: float) -> list[Record]:
        records = await super().drain(expected_ids, timeout)
        sched = self._scheduler
        if sched is not None and sched.done() and not sched.cancelled() and sched.exception():
            raise RuntimeError("dramatiq-style scheduler died") from sched.exception()
        return records

    async def teardown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
            await asyncio.wait({self._scheduler}, timeout=5)
        worker_ch = getattr(self, "_worker_ch", None)
        if worker_ch is not None and not worker_ch.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(worker_ch.close(), 10)
        self._heap.clear()
        await super().teardown()

    async def memory_growth(
        self, n: int, *, delay_ms: int = 600_000, timeout: float = 120.0
    ) -> dict[str, Any]:
        """Worker RSS before/after holding ``n`` pending delayed messages (needs ``setup()``).

        The publisher runs in the same process, so the figure is an upper bound on what the
        worker itself needs; ``held`` is capped by the prefetch.
        """
        gc.collect()
        before = rss_kb()
        # RSS alone is unreliable in a long-lived process (freed memory gets reused), so the
        # Python heap the held messages keep alive is also counted with tracemalloc.
        tracing = tracemalloc.is_tracing()
        if not tracing:
            tracemalloc.start()
        traced_before = tracemalloc.get_traced_memory()[0]
        try:
            await self.publish([(f"mem-{i}", delay_ms) for i in range(n)])
            target = min(n, self.delay_prefetch)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while self.held < target and loop.time() < deadline:
                await asyncio.sleep(0.05)
            gc.collect()
            traced = tracemalloc.get_traced_memory()[0] - traced_before
        finally:
            if not tracing:
                tracemalloc.stop()
        after = rss_kb()
        held = self.held
        return {
            "python_heap_growth_bytes": traced,
            "python_heap_bytes_per_held_message": round(traced / held, 1) if held else None,
            "published": n,
            "held_unacked": held,
            "prefetch": self.delay_prefetch,
            "body_bytes": len(self.body),
            "rss_before_kb": before,
            "rss_after_kb": after,
            "rss_growth_kb": after - before,
            "bytes_per_held_message": round((after - before) * 1024 / held, 1) if held else None,
            "not_held_waiting_in_queue": n - held,
        }


def broker_consumer_timeout_ms(timeout: float = 60.0) -> dict[str, Any]:
    """The broker's ``consumer_timeout``, read with ``rabbitmqctl environment`` if possible."""
    try:
        out = subprocess.run(
            ["rabbitmqctl", "environment"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        ).stdout
        m = re.search(r"\{consumer_timeout,\s*(\w+)\}", out)
        if m:
            value = m.group(1)
            return {
                "consumer_timeout_ms": int(value) if value.isdigit() else value,
                "source": "rabbitmqctl environment",
            }
        return {
            "consumer_timeout_ms": DEFAULT_CONSUMER_TIMEOUT_MS,
            "source": "not set in rabbitmqctl environment output; RabbitMQ default assumed",
        }
    except (OSError, subprocess.SubprocessError) as exc:
        return {
            "consumer_timeout_ms": DEFAULT_CONSUMER_TIMEOUT_MS,
            "source": f"rabbitmqctl unavailable ({exc.__class__.__name__}); default assumed",
        }
