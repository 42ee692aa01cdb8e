"""The x-delay bridge's two extra hops, done by bare clients: the floor of what it adds.

A message through the bridge crosses two quorum queues the direct path does not: the
inbox (its delay counts from stage 1's pickup, so the hop adds in full) and the
consumers' queue bound to ``DNAME`` (stage 2 publishes there, confirmed, when the copy
falls due). This peer does that work and nothing else: aio-pika publishes (confirms,
persistent, window as the other peers) into a quorum queue ``in``; a relay in a process of
its own (``python -m bench.peers.relay URL IN OUT``: aio-pika, the way stage 2 publishes)
takes each message, publishes it confirmed and mandatory to a quorum queue ``out``, then
acks it; this process reads ``out``. No tiers, no delay: ``due = published``, so its
"lateness" is the two hops' transit, what any bridge with an inbox queue and a delivery
exchange must add on top of the direct path's lateness.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import Sequence

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from bench.peers._amqp import AmqpPeer, queue_args
from bench.peers.base import Item

READY = "ready"
"""What the relay process prints once it consumes."""


class RelayPeer(AmqpPeer):
    """Publish into ``in``, a relay process moves each message to ``out``, read here."""

    slug = "relay"
    supports_delay = False

    def _configure(self) -> None:
        self.name = "relay"
        self.inbox = f"{self.prefix}.in"
        self.outbox = f"{self.prefix}.out"
        self.description = (
            "the bridge's two extra quorum queue hops by bare aio-pika clients: publish "
            "(confirms) into a quorum queue, a relay process publishes each message "
            "(confirms, mandatory) to a second one and then acks it, read here; no delay"
        )
        self._relay: subprocess.Popen[str] | None = None

    async def _declare(self) -> None:
        for name in (self.inbox, self.outbox):
            await self._declare_queue(name, queue_args(self.queue_type))
        self._relay = subprocess.Popen(
            [sys.executable, "-m", "bench.peers.relay", self.url, self.inbox, self.outbox],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._relay.stdout is not None
        line = await asyncio.to_thread(self._relay.stdout.readline)
        if line.strip() != READY:
            raise RuntimeError(f"the relay process did not start (it said {line!r})")
        await self._consume(self.outbox)

    def pids(self) -> list[int]:
        return [self._relay.pid] if self._relay is not None else []

    async def publish(self, batch: Sequence[Item]) -> None:
        rk = self.inbox
        await self._publish_items(self.pub.default_exchange, batch, lambda _d: (rk, None))

    async def teardown(self) -> None:
        relay, self._relay = self._relay, None
        if relay is not None and relay.poll() is None:
            relay.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(relay.wait, 20)
            except subprocess.TimeoutExpired:
                relay.kill()
                await asyncio.to_thread(relay.wait)
        await super().teardown()


async def relay(url: str, inbox: str, outbox: str, prefetch: int = 1000) -> None:
    """Move every message from ``inbox`` to ``outbox`` until SIGTERM: ack after the confirm."""
    connection = await aio_pika.connect(url)
    try:
        publishing = await connection.channel(publisher_confirms=True, on_return_raises=True)
        consuming = await connection.channel()
        await consuming.set_qos(prefetch_count=prefetch)
        queue = await consuming.get_queue(inbox, ensure=False)
        tasks: set[asyncio.Task[None]] = set()

        async def move(message: AbstractIncomingMessage) -> None:
            copy = aio_pika.Message(
                message.body,
                headers=dict(message.headers or {}),
                message_id=message.message_id,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await publishing.default_exchange.publish(copy, routing_key=outbox, mandatory=True)
            await message.ack()

        async def on_message(message: AbstractIncomingMessage) -> None:
            task = asyncio.create_task(move(message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        await queue.consume(on_message)
        print(READY, flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.close(), 10)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 3:
        print("usage: python -m bench.peers.relay URL IN OUT", file=sys.stderr)
        return 2
    asyncio.run(relay(args[0], args[1], args[2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
