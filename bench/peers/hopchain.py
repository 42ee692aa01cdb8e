"""The broker alone doing the tiers' work: a chain of TTL dead-letter hops, no rmqdelay.

``hops`` durable queues, each with a queue-level ``x-message-ttl`` and dead-lettering at
least once (``x-dead-letter-strategy: at-least-once``, ``x-overflow: reject-publish``, as
rmqdelay's tiers) through the default exchange into the next, the last one into a work
queue; aio-pika publishes into the first (confirms, mandatory, persistent) and consumes the
work queue, as :class:`bench.peers.plain.PlainPeer` does. Every message makes the same
``hops`` hops and takes the same total delay (``delay_ms``, split evenly), so it is run with
``min_delay_ms = max_delay_ms = delay_ms``: its lateness is what the hops add, and its broker
CPU per message, against the plain queue's in the same run, is the floor of any TTL-tier
design with that many hops (the physical limit in the ``hops`` workload).

With ``expiration=True`` the queues have no ``x-message-ttl`` and the first hop's delay is
the message's own ``expiration`` (only the first: dead-lettering strips it), to compare the
two ways a quorum queue learns when a message expires. With ``spread=n`` each hop is ``n``
parallel queues (the same TTL) and messages take them in turn, as rmqdelay's digits spread a
rate over many tier queues: the same hops, each queue woken for 1/n of the messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.common import DEFAULT_AMQP_URL
from bench.peers._amqp import AmqpPeer, queue_args
from bench.peers.base import Item


class HopChainPeer(AmqpPeer):
    name = "hopchain"
    slug = "hopchain"

    def __init__(
        self,
        url: str = DEFAULT_AMQP_URL,
        queue_type: str = "quorum",
        *,
        hops: int = 2,
        delay_ms: int = 1000,
        expiration: bool = False,
        spread: int = 1,
        **kwargs: Any,
    ) -> None:
        if spread < 1:
            raise ValueError(f"spread must be at least 1, got {spread}")
        self.spread = spread
        self._turn = 0
        if hops < 1:
            raise ValueError(f"hops must be at least 1, got {hops}")
        if expiration and hops != 1:
            raise ValueError("expiration=True needs hops=1: dead-lettering strips expiration")
        self.hops = hops
        self.delay_ms = delay_ms
        self.expiration = expiration
        # the first hops take the remainder, so the TTLs sum to delay_ms exactly
        base, extra = divmod(delay_ms, hops)
        self.ttls = [base + (1 if i < extra else 0) for i in range(hops)]
        super().__init__(url, queue_type, **kwargs)

    def _configure(self) -> None:
        how = "per-message expiration" if self.expiration else "queue-level x-message-ttl"
        self.name = f"hopchain-{self.hops}" + ("-expiration" if self.expiration else "")
        if self.spread > 1:
            self.name += f"-spread{self.spread}"
        # lanes[j][i]: hop i of lane j; lane j dead-letters into lane j's next hop
        self.lanes = [
            [f"{self.prefix}.t{i}.{j}" for i in range(self.hops)] for j in range(self.spread)
        ]
        self.work_queue = f"{self.prefix}.work"
        self.description = (
            f"The broker alone (no rmqdelay): {self.hops} durable {self.queue_type} queue(s) "
            f"with {how} (TTLs {self.ttls} ms), each dead-lettering at least once through the "
            f"default exchange into the next, then into a {self.queue_type} work queue; "
            f"aio-pika publishes into the first (confirms, mandatory, persistent) and consumes "
            f"the work queue (prefetch {self.prefetch}, manual ack). Every message makes "
            f"{self.hops} hop(s) and waits {self.delay_ms} ms in all"
            + (f"; each hop is {self.spread} queues taken in turn." if self.spread > 1 else ".")
        )

    async def _declare(self) -> None:
        await self._declare_queue(self.work_queue, queue_args(self.queue_type))
        for lane in self.lanes:
            await self._declare_lane(lane)
        await self._consume(self.work_queue)

    async def _declare_lane(self, lane: list[str]) -> None:
        targets = [*lane[1:], self.work_queue]
        for tier, ttl, target in zip(lane, self.ttls, targets, strict=True):
            extra: dict[str, Any] = {
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": target,
            }
            if self.queue_type == "quorum":
                extra["x-dead-letter-strategy"] = "at-least-once"
                extra["x-overflow"] = "reject-publish"
            if not self.expiration:
                extra["x-message-ttl"] = ttl
            await self._declare_queue(tier, queue_args(self.queue_type, **extra))

    def _first(self) -> str:
        self._turn = (self._turn + 1) % self.spread
        return self.lanes[self._turn][0]

    async def publish(self, batch: Sequence[Item]) -> None:
        expiration = self.ttls[0] if self.expiration else None
        await self._publish_items(
            self.pub.default_exchange, batch, lambda _d: (self._first(), expiration)
        )
