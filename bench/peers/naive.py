"""The seeds' naive design: one TTL queue with per-message ``expiration``.

Every delayed message goes to one durable queue that has ``x-dead-letter-exchange`` set
(the default exchange, with ``x-dead-letter-routing-key`` = the work queue) and carries its
delay as the per-message ``expiration`` property. RabbitMQ only expires the message at the
*head* of a queue, so a 5 s message published before a 1 s message holds the 1 s one back:
both arrive after ~5 s (head-of-line blocking). That is the problem the tiers solve.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.peers._amqp import AmqpPeer, queue_args
from bench.peers.base import Item


class NaivePeer(AmqpPeer):
    name = "naive"
    slug = "naive"

    def _configure(self) -> None:
        self.name = f"naive-{self.queue_type}"
        self.delay_queue = f"{self.prefix}.delay"
        self.work_queue = f"{self.prefix}.work"
        self.description = (
            f"The seeds' naive design: one durable {self.queue_type} queue with "
            f"x-dead-letter-exchange='' and x-dead-letter-routing-key=<work queue>; each "
            f"message carries its delay as per-message `expiration` (ms) and dead-letters into "
            f"a {self.queue_type} work queue on expiry. Publisher confirms on (aio-pika). "
            f"Default dead-letter strategy (at-most-once). Exhibits head-of-line blocking: "
            f"only the head message can expire."
        )

    async def _declare(self) -> None:
        await self._declare_queue(self.work_queue, queue_args(self.queue_type))
        await self._declare_queue(
            self.delay_queue,
            queue_args(
                self.queue_type,
                **{
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": self.work_queue,
                },
            ),
        )
        await self._consume(self.work_queue)

    async def publish(self, batch: Sequence[Item]) -> None:
        rk = self.delay_queue
        await self._publish_items(self.pub.default_exchange, batch, lambda d: (rk, max(0, int(d))))
