"""The limit: plain confirmed publishing to one queue, no delay at all.

This is the reference every delay design is compared to: the same client, the same
confirm-mode channel and the same consumer as the other RabbitMQ peers, publishing straight
into one durable queue of the chosen type through the default exchange. Delays are ignored:
``due_at_ms = published_at_ms``, so its "lateness" is plain publish-to-consume latency.
With ``consume=False`` no consumer runs: the pure confirmed-publish limit (drain finds
nothing). With ``topic=True`` it publishes through a topic exchange instead, with a routing
key of rmqdelay's shape (eight words and the destination) and rmqdelay's two headers of a
held message: what that routing costs the broker, without rmqdelay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aio_pika.abc import AbstractExchange

from bench.common import DEFAULT_AMQP_URL, now_ms
from bench.peers._amqp import AmqpPeer, make_message, queue_args
from bench.peers.base import Item, run_windowed

TOPIC_BINDING = "*.*.*.*.*.*.*.*.bench"
TOPIC_KEY = "0.0.0.0.0.0.0.0.bench"


class PlainPeer(AmqpPeer):
    name = "plain"
    slug = "plain"
    supports_delay = False
    _exchange: AbstractExchange

    def __init__(
        self,
        url: str = DEFAULT_AMQP_URL,
        queue_type: str = "quorum",
        *,
        consume: bool = True,
        topic: bool = False,
        **kwargs: Any,
    ) -> None:
        self.consume, self.topic = consume, topic
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
        if self.topic:
            self.name += "-topic"
            self.description = self.description.replace(
                "through the default exchange",
                f"through a topic exchange (key {TOPIC_KEY}, bound as {TOPIC_BINDING}, "
                "and the headers rmqdelay-due-at and rmqdelay-destination)",
            )

    async def _declare(self) -> None:
        queue = await self._declare_queue(self.queue, queue_args(self.queue_type))
        if self.topic:
            self._exchange = await self._declare_exchange(f"{self.prefix}.delivery")
            await queue.bind(self._exchange, routing_key=TOPIC_BINDING)
        if self.consume:
            await self._consume(self.queue)

    async def publish(self, batch: Sequence[Item]) -> None:
        if self.topic:
            await run_windowed(self._send_topic, batch, self.window)
            return
        rk = self.queue
        await self._publish_items(self.pub.default_exchange, batch, lambda _d: (rk, None))

    async def _send_topic(self, item: Item) -> None:
        published = now_ms()
        headers = {"rmqdelay-due-at": published, "rmqdelay-destination": "bench"}
        message = make_message(item[0], published, published, self.body, extra_headers=headers)
        await self._exchange.publish(message, routing_key=TOPIC_KEY, mandatory=True)
