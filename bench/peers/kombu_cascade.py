"""Celery/kombu native delayed delivery: the 28-level binary cascade, built by kombu itself.

The topology is declared by the installed kombu's own functions
(``kombu.transport.native_delayed_delivery``), over a kombu ``Connection`` (py-amqp):

* ``declare_native_delayed_delivery_exchanges_and_queues(conn, queue_type, prefix=...)``
  declares 28 topic exchanges ``<prefix>_celery_delayed_{27..0}``, one queue per level with
  ``x-message-ttl = 2**level * 1000`` dead-lettering into the next level's exchange, the
  exchange-to-exchange bindings that skip zero bits, and ``<prefix>_celery_delayed_delivery``.
* ``bind_queue_to_native_delayed_delivery_exchange(conn, queue, prefix=...)`` binds our
  destination topic exchange to the delivery exchange and our queue to it (``#.<rk>``).
* Every message is published to ``level_name(27, prefix)`` with routing key
  ``calculate_routing_key(countdown_s, rk)``: 28 bit-words then the destination key.

kombu 5.7 takes a ``prefix`` for all of those names, so each run gets its own private
cascade (``bench-kombu-<hex>_celery_delayed_*``) and teardown deletes all of it; nothing
touches the shared, unprefixed ``celery_delayed_*`` objects a real Celery app would use.
The prefix only renames objects, the topology is identical. With an older kombu (5.5/5.6,
no ``prefix``) the peer falls back to the global names and its teardown deletes only its own
destination exchange and queue, leaving the shared ``celery_delayed_*`` objects in place
(they may serve a real Celery app; we cannot prove they do not).

Resolution is 1 s. Celery 5.5 computes ``int(countdown)`` (truncation, see
``celery/app/base.py``), so a 2.7 s delay is routed as 2 s and the transport delivers it
early; the Celery worker then holds such a message in memory until its ``eta``. The
``rounding="celery"`` mode reproduces that truncation (early arrivals are counted as such);
``rounding="ceil"`` rounds up so the transport is never early. A countdown that truncates to
0 is published straight to the destination (kombu's ``calculate_routing_key`` rejects 0).

Publishing uses aio-pika with publisher confirms (kombu/py-amqp's ``confirm_publish`` waits
for each confirm before the next publish, which would measure the client, not the topology);
the routing keys still come from kombu's ``calculate_routing_key``.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Sequence
from typing import Any

# the ignores are unused when kombu is not installed (then it is Any): hence unused-ignore
from kombu import Connection, Exchange, Queue  # type: ignore[attr-defined,unused-ignore]
from kombu.transport import native_delayed_delivery as ndd

from bench.common import DEFAULT_AMQP_URL
from bench.peers._amqp import AmqpPeer
from bench.peers.base import Item

ROUNDINGS = ("celery", "ceil")

#: kombu >= 5.7 accepts ``prefix=`` for all native-delayed-delivery names; 5.5/5.6 do not.
KOMBU_HAS_PREFIX = "prefix" in inspect.signature(ndd.level_name).parameters


def _prefix_kw(prefix: str | None) -> dict[str, Any]:
    return {"prefix": prefix} if KOMBU_HAS_PREFIX else {}


def _level_name(level: int, prefix: str | None) -> str:
    return str(ndd.level_name(level, **_prefix_kw(prefix)))


class KombuCascadePeer(AmqpPeer):
    name = "kombu-cascade"
    slug = "kombu"

    def __init__(
        self,
        url: str = DEFAULT_AMQP_URL,
        queue_type: str = "quorum",
        *,
        rounding: str = "celery",
        **kwargs: Any,
    ) -> None:
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}")
        self.rounding = rounding
        super().__init__(url, queue_type, **kwargs)

    def _configure(self) -> None:
        suffix = "" if self.rounding == "celery" else "-ceil"
        self.name = f"kombu-cascade{suffix}-{self.queue_type}"
        # kombu names: f"{prefix}_celery_delayed_{level}" and f"{prefix}_celery_delayed_delivery"
        # (kombu >= 5.7). Older kombu: the shared, global celery_delayed_* names.
        self.kombu_prefix = self.prefix if KOMBU_HAS_PREFIX else None
        self.entry_exchange = _level_name(ndd.MAX_LEVEL, self.kombu_prefix)
        delivery = ndd.CELERY_DELAYED_DELIVERY_EXCHANGE
        self.delivery_exchange = (
            f"{self.kombu_prefix}_{delivery}" if self.kombu_prefix else delivery
        )
        self.dest_exchange = f"{self.prefix}.dest"
        self.dest_queue = f"{self.prefix}.work"
        self.dest_rk = f"{self.prefix}.work"
        rounding = (
            "int() truncation exactly as Celery 5.5 does (transport may deliver up to 1 s early)"
            if self.rounding == "celery"
            else "ceil() rounding (never early; not what Celery does)"
        )
        self.description = (
            f"Celery/kombu native delayed delivery, topology declared by kombu "
            f"{_kombu_version()}'s own native_delayed_delivery functions (28 chained topic "
            f"exchanges, {self.queue_type} level queues with x-message-ttl 2^level s, "
            f"x-overflow reject-publish, at-least-once DLX for quorum), "
            + (
                "under a per-run kombu prefix (all deleted at teardown). "
                if KOMBU_HAS_PREFIX
                else "under kombu's global celery_delayed_* names (shared: left in place). "
            )
            + f"Published with aio-pika + publisher confirms to level 27 with routing "
            f"keys from kombu.calculate_routing_key; countdown in whole seconds by {rounding}. "
            f"Destination: a topic exchange + {self.queue_type} queue bound by "
            f"bind_queue_to_native_delayed_delivery_exchange. Transport only: no Celery "
            f"worker (which would additionally hold early messages until eta)."
        )

    # -------------------------------------------------------------- topology via kombu

    def _kombu_declare(self) -> None:
        with Connection(self.url) as conn:  # type: ignore[no-untyped-call,unused-ignore]
            ndd.declare_native_delayed_delivery_exchanges_and_queues(
                conn, self.queue_type, **_prefix_kw(self.kombu_prefix)
            )
            dest = Queue(  # type: ignore[no-untyped-call,unused-ignore]
                self.dest_queue,
                Exchange(self.dest_exchange, type="topic", durable=True),  # type: ignore[no-untyped-call,unused-ignore]
                routing_key=self.dest_rk,
                durable=True,
                queue_arguments={"x-queue-type": self.queue_type},
            )
            channel = conn.channel()
            dest.bind(channel).declare()  # type: ignore[no-untyped-call,unused-ignore]
            ndd.bind_queue_to_native_delayed_delivery_exchange(
                conn, dest, **_prefix_kw(self.kombu_prefix)
            )

    async def _declare(self) -> None:
        # Track every name kombu will create *before* declaring, so a failure half-way still
        # gets cleaned up by teardown().
        # Without a kombu prefix the celery_delayed_* objects are global and may serve a real
        # Celery app on this broker, so only our own destination objects are deleted.
        if self.kombu_prefix:
            for level in range(ndd.MAX_LEVEL, -1, -1):
                name = _level_name(level, self.kombu_prefix)
                self._track_queue(name)
                self._track_exchange(name)
            self._track_exchange(self.delivery_exchange)
        self._track_queue(self.dest_queue)
        self._track_exchange(self.dest_exchange)
        await asyncio.to_thread(self._kombu_declare)
        self._entry = await self.pub.get_exchange(self.entry_exchange, ensure=False)
        self._dest = await self.pub.get_exchange(self.dest_exchange, ensure=False)
        await self._consume(self.dest_queue)

    # -------------------------------------------------------------- publishing

    def countdown_s(self, delay_ms: int) -> int:
        if self.rounding == "celery":
            return int(delay_ms / 1000)
        return math.ceil(delay_ms / 1000)

    async def publish(self, batch: Sequence[Item]) -> None:
        delayed: list[Item] = []
        immediate: list[Item] = []
        for item in batch:
            (delayed if self.countdown_s(item[1]) >= 1 else immediate).append(item)
        rk = self.dest_rk
        if delayed:
            await self._publish_items(
                self._entry,
                delayed,
                lambda d: (ndd.calculate_routing_key(self.countdown_s(d), rk), None),
            )
        if immediate:
            await self._publish_items(self._dest, immediate, lambda _d: (rk, None))


def _kombu_version() -> str:
    import kombu

    return str(kombu.__version__)
