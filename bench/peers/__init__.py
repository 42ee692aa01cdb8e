"""Peer designs for the delay benchmark, behind one interface (:class:`bench.peers.base.Peer`).

``make_peer(name, ...)`` builds a fresh, not yet set up, peer instance by registry name.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.common import DEFAULT_AMQP_URL
from bench.peers.base import Peer

#: Registry names, in the order tables list them.
PEER_NAMES: tuple[str, ...] = (
    "plain",
    "rmqdelay",
    "rmqdelay-sync",
    "naive",
    "kombu-cascade",
    "kombu-cascade-ceil",
    "dramatiq-style",
    "redis-off",
    "redis-everysec",
    "redis-always",
)


def make_peer(name: str, *, url: str = DEFAULT_AMQP_URL, queue_type: str = "quorum") -> Peer:
    """A new peer instance for ``name`` (one of :data:`PEER_NAMES`)."""
    factories: dict[str, Callable[[], Peer]] = {}

    def rmqdelay(publisher: str) -> Callable[[], Peer]:
        def build() -> Peer:
            from bench.peers.rmqdelay_peer import RmqdelayPeer

            return RmqdelayPeer(url, queue_type, publisher=publisher)

        return build

    def plain() -> Peer:
        from bench.peers.plain import PlainPeer

        return PlainPeer(url, queue_type)

    def naive() -> Peer:
        from bench.peers.naive import NaivePeer

        return NaivePeer(url, queue_type)

    def kombu(rounding: str) -> Callable[[], Peer]:
        def build() -> Peer:
            from bench.peers.kombu_cascade import KombuCascadePeer

            return KombuCascadePeer(url, queue_type, rounding=rounding)

        return build

    def dramatiq() -> Peer:
        from bench.peers.dramatiq_style import DramatiqStylePeer

        return DramatiqStylePeer(url, queue_type)

    def redis(mode: str) -> Callable[[], Peer]:
        def build() -> Peer:
            from bench.peers.redis_zset import RedisZsetPeer

            return RedisZsetPeer(mode)

        return build

    factories.update(
        {
            "plain": plain,
            "rmqdelay": rmqdelay("async"),
            "rmqdelay-sync": rmqdelay("sync"),
            "naive": naive,
            "kombu-cascade": kombu("celery"),
            "kombu-cascade-ceil": kombu("ceil"),
            "dramatiq-style": dramatiq,
            "redis-off": redis("off"),
            "redis-everysec": redis("everysec"),
            "redis-always": redis("always"),
        }
    )
    try:
        return factories[name]()
    except KeyError:
        raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEER_NAMES)}") from None


__all__ = ["PEER_NAMES", "Peer", "make_peer"]
