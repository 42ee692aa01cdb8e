"""The one-queue engine on RabbitMQ 4.3+: one deferred quorum queue and a scheduler process.

Same destination, topology and drain as :class:`bench.peers.rmqdelay_peer.RmqdelayPeer`
(the real :class:`rmqdelay.Worker` in its own process, on rmqdelay's work queue); only the
way to the work queue differs:

* ``publish()`` sends each message with raw aio-pika (confirms, mandatory, persistent)
  into one quorum queue ``<prefix>.deferred``, its due time in the ``x-bench-due`` header;
* :mod:`bench.peers.deferred_scheduler` (qpid-proton, AMQP 1.0, its own process) defers
  early ones to their due time with ``modified`` + ``x-opt-delivery-time``, and forwards
  due ones to the work queue before it accepts them.

``forward=False`` runs the scheduler as the message's consumer (it accepts due messages):
its receive times are then the figures of a worker that consumes the deferred queue itself
over AMQP 1.0 (no forward hop), and the Worker gets nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Collection, Sequence
from typing import Any

import aio_pika

from bench.common import DEFAULT_AMQP_URL, Record, now_ms
from bench.peers._amqp import make_message
from bench.peers.base import Arrivals, Item, run_windowed
from bench.peers.rmqdelay_peer import RmqdelayPeer, _die_with_parent

SCHEDULER_PREFETCH = 1000


class DeferredPeer(RmqdelayPeer):
    """One deferred quorum queue, the proton scheduler, and rmqdelay's Worker as the drain."""

    def __init__(
        self, url: str = DEFAULT_AMQP_URL, *, forward: bool = True, label: str | None = None
    ) -> None:
        super().__init__(url, "quorum", worker="subprocess" if forward else "aiopika")
        self.url = url
        self.forward = forward
        self.name = label or ("deferred" if forward else "deferred-noforward")
        self.deferred_queue = f"{self.prefix}.deferred"
        self.description = (
            "one quorum queue on RabbitMQ 4.3 (raw aio-pika publish, confirms, mandatory, "
            "persistent); a qpid-proton AMQP 1.0 scheduler process defers early messages with "
            "modified + x-opt-delivery-time and "
            + (
                "forwards due ones (confirmed) to rmqdelay's work queue, drained by the real "
                "rmqdelay.Worker in its own process."
                if forward
                else "accepts due ones itself (lateness taken at the scheduler)."
            )
        )
        self.sched_arrivals = Arrivals()
        self.deferrals = 0
        self._conn: Any = None
        self._channel: Any = None
        self._sched: asyncio.subprocess.Process | None = None
        self._sched_reader: asyncio.Task[None] | None = None
        self._sched_stderr: asyncio.Task[None] | None = None
        self._sched_tail: list[str] = []
        self._due: dict[str, int] = {}
        self._pub: dict[str, int] = {}
        self.leader_url: str | None = None
        """Declare the deferred queue there (client-local): that node leads it."""

    async def setup(self) -> None:
        try:
            await super().setup()  # the topology, the Worker; its publisher goes unused
            self._conn = await aio_pika.connect(self.url)
            self._channel = await self._conn.channel(publisher_confirms=True, on_return_raises=True)
            arguments = {"x-queue-type": "quorum"}
            if self.leader_url is None:
                await self._channel.declare_queue(
                    self.deferred_queue, durable=True, arguments=arguments
                )
            else:
                arguments["x-queue-leader-locator"] = "client-local"
                async with await aio_pika.connect(self.leader_url) as there:
                    channel = await there.channel()
                    await channel.declare_queue(
                        self.deferred_queue, durable=True, arguments=arguments
                    )
            await self._start_scheduler()
        except BaseException:
            await self.teardown()
            raise

    async def _start_aiopika(self) -> None:
        """Without forwarding the Worker has nothing to drain: none is started."""

    async def _start_scheduler(self) -> None:
        argv = [
            sys.executable, "-m", "bench.peers.deferred_scheduler", self.url,
            self.deferred_queue, self.settings.layout.work_queue("bench"),
            "--prefetch", str(SCHEDULER_PREFETCH),
            *(() if self.forward else ("--no-forward",)),
        ]  # fmt: skip
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        self._sched = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
            preexec_fn=_die_with_parent,
            limit=1 << 20,
        )
        assert self._sched.stdout is not None
        self._sched_stderr = asyncio.create_task(self._read_sched_stderr())
        line = await asyncio.wait_for(self._sched.stdout.readline(), 60)
        if line.strip() != b"READY":
            await asyncio.sleep(0.2)
            raise RuntimeError(
                f"scheduler did not start ({line!r}): " + " | ".join(self._sched_tail[-8:])
            )
        self._sched_reader = asyncio.create_task(self._read_sched())

    async def restart_scheduler(self) -> None:
        """A fresh scheduler process (after the node restarted: the old one lost its link)."""
        await self._stop_scheduler()
        await self._start_scheduler()

    async def _stop_scheduler(self) -> None:
        if self._sched is not None and self._sched.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._sched.terminate()
            try:
                await asyncio.wait_for(self._sched.wait(), 20)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self._sched.kill()
                await self._sched.wait()
        for task in (self._sched_reader, self._sched_stderr):
            if task is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(task, 5)

    async def _read_sched(self) -> None:
        assert self._sched is not None and self._sched.stdout is not None
        while True:
            line = await self._sched.stdout.readline()
            if not line:
                return
            parts = line.split()
            if parts[:1] == [b"DEFERRED"]:
                self.deferrals = int(parts[1])
            elif len(parts) == 3:
                mid = parts[0].decode()
                due, pub = self._due.get(mid, -1), self._pub.get(mid, -1)
                self.sched_arrivals.add(Record(mid, due, int(parts[1]), pub))

    async def _read_sched_stderr(self) -> None:
        assert self._sched is not None and self._sched.stderr is not None
        while True:
            line = await self._sched.stderr.readline()
            if not line:
                return
            self._sched_tail = [*self._sched_tail[-49:], line.decode(errors="replace").rstrip()]

    async def publish(self, batch: Sequence[Item]) -> None:
        exchange = self._channel.default_exchange

        async def send(item: Item) -> None:
            mid, delay_ms = item
            published = now_ms()
            due = published + max(0, delay_ms)
            self._due[mid], self._pub[mid] = due, published
            await exchange.publish(
                make_message(mid, published, due, self.body), routing_key=self.deferred_queue
            )

        await run_windowed(send, batch, self.window)
        self.published_total += len(batch)

    async def drain(self, expected_ids: Collection[str], timeout: float) -> list[Record]:
        if not self.forward:
            return await self.sched_arrivals.wait_for(expected_ids, timeout)
        records = await super().drain(expected_ids, timeout)
        # the scheduler's view of the same messages, for the split (kept apart)
        self.sched_records = await self.sched_arrivals.wait_for(expected_ids, 0.5)
        return records

    def cpu_pids(self) -> dict[str, int]:
        pids = super().cpu_pids()
        if self._sched is not None:
            pids["scheduler"] = self._sched.pid
        return pids

    async def teardown(self) -> None:
        await self._stop_scheduler()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.close(), 10)
        try:  # on a fresh connection: the node may have restarted under the old one
            conn = await aio_pika.connect(self.url)
            async with conn:
                channel = await conn.channel()
                await asyncio.wait_for(channel.queue_delete(self.deferred_queue), 30)
        except Exception as exc:
            self.cleanup_errors.append(f"delete {self.deferred_queue}: {exc!r}")
        await super().teardown()
