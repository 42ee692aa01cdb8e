"""The limit: plain confirmed publishing to one queue, no delay at all.

This is the reference every delay design is compared to: the same client, the same
confirm-mode channel and the same consumer as the other RabbitMQ peers, publishing straight
into one durable queue of the chosen type through the default exchange. Delays are ignored:
``due_at_ms = published_at_ms``, so its "lateness" is plain publish-to-consume latency.
With ``consume=False`` no consumer runs: the pure confirmed-publish limit (drain finds
nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.common import DEFAULT_AMQP_URL
from bench.peers._amqp import AmqpPeer, queue_args
from bench.peers.base import Item


class PlainPeer(AmqpPeer):
    name = "plain"
    slug = "plain"
    supports_delay = False

    def __init__(
        self,
        url: str = DEFAULT_AMQP_URL,
        queue_type: str = "quorum",
        *,
        consume: bool = True,
        **kwargs: Any,
    ) -> None:
        self.consume = consume
        super().__init__(url, queue_type, **kwargs)

    def _configure(self) -> None:
        self.name = f"plain-{self.queue_type}" + ("" if self.consume else "-publish-only")
        self.queue = f"{self.prefix}.q"
        self.description = (
            f"Reference limit, not a delay design: aio-pika publishes with publisher confirms "
            f"(window {self.window} in flight, mandatory, persistent) through the default "
            f"exchange into one durable {self.queue_type} queue; one consumer on the same "
            f"connection (prefetch {self.prefetch}, manual ack). Delays are ignored, so "
            f"lateness here is publish-to-consume latency."
        )
        if not self.consume:
            self.description = self.description.replace(
                "one consumer on the same connection", "NO consumer (publish-only limit)"
            )

    async def _declare(self) -> None:
        await self._declare_queue(self.queue, queue_args(self.queue_type))
        if self.consume:
            await self._consume(self.queue)

    async def publish(self, batch: Sequence[Item]) -> None:
        rk = self.queue
        await self._publish_items(self.pub.default_exchange, batch, lambda _d: (rk, None))
