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

``python -m bench.peers.relay URL IN DESTINATION --tiers PREFIX`` is the other relay of
:class:`bench.bridge.BareBridgePeer`: it sends each message into the tiers instead, due
its ``x-delay`` after it arrived (:func:`into_tiers`), as the bridge's stage 1 does.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import aio_pika
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from bench.peers._amqp import AmqpPeer, queue_args
from bench.peers.base import Item
from rmqdelay import Settings, plan_delay

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
        self._relay = await start_relay(self.url, self.inbox, self.outbox)
        await self._consume(self.outbox)

    def pids(self) -> list[int]:
        return [self._relay.pid] if self._relay is not None else []

    async def publish(self, batch: Sequence[Item]) -> None:
        rk = self.inbox
        await self._publish_items(self.pub.default_exchange, batch, lambda _d: (rk, None))

    async def teardown(self) -> None:
        relay, self._relay = self._relay, None
        if relay is not None:
            await stop_relay(relay)
        await super().teardown()


async def start_relay(url: str, *args: str) -> subprocess.Popen[str]:
    """``python -m bench.peers.relay URL *args``, once it consumes."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.peers.relay", url, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = await asyncio.to_thread(process.stdout.readline)
    if line.strip() != READY:
        await stop_relay(process)
        raise RuntimeError(f"the relay process did not start (it said {line!r})")
    return process


async def stop_relay(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, 20)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)


Route = Callable[[dict[str, Any], int], tuple[str, str]]
"""(the message's headers, edited in place; when it arrived, µs) -> (exchange, routing key)."""


def to_queue(outbox: str) -> Route:
    """Straight to ``outbox``, through the default exchange."""
    return lambda _headers, _arrived_us: ("", outbox)


def into_tiers(prefix: str, destination: str) -> Route:
    """Into the tiers of ``prefix`` towards ``destination``, as stage 1 of the x-delay
    bridge sends it: due ``x-delay`` ms after it arrived, planned with rmqdelay's public
    ``plan_delay`` and the headers of docs/protocol.md (no journal record)."""
    layout = Settings(prefix=prefix).layout

    def route(headers: dict[str, Any], arrived_us: int) -> tuple[str, str]:
        due_us = arrived_us + int(headers.pop("x-delay", 0)) * 1000
        plan = plan_delay(layout, due_us - time.time_ns() // 1000, destination)
        headers["rmqdelay-due-at"] = -(-due_us // 1000)
        headers["rmqdelay-destination"] = destination
        headers["rmqdelay-attempt"] = 1
        return plan.exchange, plan.publish_key

    return route


async def relay(url: str, inbox: str, route: Route, prefetch: int = 1000) -> None:
    """Move every message from ``inbox`` where ``route`` says until SIGTERM: ack after
    the confirm."""
    connection = await aio_pika.connect(url)
    try:
        publishing = await connection.channel(publisher_confirms=True, on_return_raises=True)
        consuming = await connection.channel()
        await consuming.set_qos(prefetch_count=prefetch)
        queue = await consuming.get_queue(inbox, ensure=False)
        exchanges: dict[str, AbstractExchange] = {"": publishing.default_exchange}
        tasks: set[asyncio.Task[None]] = set()

        async def move(message: AbstractIncomingMessage, arrived_us: int) -> None:
            headers = dict(message.headers or {})
            name, key = route(headers, arrived_us)
            exchange = exchanges.get(name)
            if exchange is None:
                exchange = exchanges[name] = await publishing.get_exchange(name, ensure=False)
            copy = aio_pika.Message(
                message.body,
                headers=headers,
                message_id=message.message_id,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await exchange.publish(copy, routing_key=key, mandatory=True)
            await message.ack()

        async def on_message(message: AbstractIncomingMessage) -> None:
            task = asyncio.create_task(move(message, time.time_ns() // 1000))
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


USAGE = "usage: python -m bench.peers.relay URL IN OUT [--tiers PREFIX] (OUT: a destination)"


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) == 5 and args[3] == "--tiers":
        route = into_tiers(args[4], args[2])
    elif len(args) == 3:
        route = to_queue(args[2])
    else:
        print(USAGE, file=sys.stderr)
        return 2
    asyncio.run(relay(args[0], args[1], route))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
