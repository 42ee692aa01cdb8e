"""The scenarios the suite runs every peer design through (``python -m bench``).

Scenarios (each on a fresh peer instance: setup -> scenario -> teardown in ``finally``):

a. ``seeds``: publish 5 messages with delays 5, 4, 3, 2, 1 s in that order (one batch),
   drain; arrival order and lateness per message. Skipped for peers without delays.
b. ``publish_rate``: after an untimed warm-up of ``warmup`` messages, publish N messages
   (delays uniform in [1 s, 20 s], fixed seed) in one ``publish()`` call with confirms;
   msgs/s = N / wall time of that call. Median of
   ``--repeats`` runs. For peers without delays (``plain``) the messages are also drained
   and the publish-and-consume rate is reported.
c. ``steady``: ``rate`` msgs/s fall due steadily for ``duration`` s, each with a random delay
   in [min, max]; a pacer publishes each message at ``due - delay`` (batched per 5 ms tick,
   publishes run concurrently so a slow confirm does not stall the pacer), then everything is
   drained; lateness stats over all messages.

Peer-specific extras: ``plain_publish_only`` (confirmed publish into the plain queue with
no consumer running: the pure publish limit) when ``plain`` is selected; ``redis_kill9``
(loss after kill -9, per persistence mode) when a Redis peer is selected; ``dramatiq``
(worker RSS growth holding N delayed messages, broker consumer_timeout) when
``dramatiq-style`` is selected.

The scenario functions take a zero-argument peer factory, so any other
:class:`bench.peers.base.Peer` (e.g. the rmqdelay engine) can be run through them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    Record,
    Stopwatch,
    delivery_rate,
    due_delivery_rate,
    lateness_stats,
    median_of,
    now_ms,
    rate_per_s,
)
from bench.peers.base import Item, Peer

PeerFactory = Callable[[], Peer]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SEED_DELAYS_MS = (5000, 4000, 3000, 2000, 1000)


@dataclass
class Sizes:
    n_publish: int = 5000
    warmup: int = 200
    repeats: int = 3
    pub_min_delay_ms: int = 1000
    pub_max_delay_ms: int = 20000
    rate: float = 200.0
    duration_s: float = 10.0
    min_delay_ms: int = 1000
    max_delay_ms: int = 10000
    drain_slack_s: float = 15.0
    kill9_n: int = 20000
    memory_n: int = 10000
    seed: int = 1234


# ---------------------------------------------------------------- scenario runners


async def with_peer(factory: PeerFactory, body: Callable[[Peer], Any]) -> Any:
    """setup -> body(peer) -> teardown (always, even on error or cancellation)."""
    peer = factory()
    try:
        await peer.setup()
        return await body(peer)
    finally:
        await peer.teardown()


async def scenario_seeds(factory: PeerFactory, slack_s: float = 15.0) -> dict[str, Any]:
    batch: list[Item] = [(f"seed-{d // 1000}s", d) for d in SEED_DELAYS_MS]

    async def body(peer: Peer) -> dict[str, Any]:
        await peer.publish(batch)
        records = await peer.drain([mid for mid, _ in batch], max(SEED_DELAYS_MS) / 1000 + slack_s)
        return {
            "published_order": [mid for mid, _ in batch],
            "arrival_order": [r.message_id for r in records],
            "lateness_ms": {r.message_id: r.lateness_ms for r in records},
            "arrived_after_ms": {
                r.message_id: r.received_at_ms - r.published_at_ms for r in records
            },
            "stats": lateness_stats(records, expected=len(batch)).to_dict(),
        }

    return dict(await with_peer(factory, body))


async def scenario_publish_rate(
    factory: PeerFactory, sizes: Sizes, *, drain: bool
) -> dict[str, Any]:
    rng = random.Random(sizes.seed)
    runs: list[dict[str, Any]] = []
    for run in range(sizes.repeats):
        batch: list[Item] = [
            (f"rate{run}-{i}", rng.randint(sizes.pub_min_delay_ms, sizes.pub_max_delay_ms))
            for i in range(sizes.n_publish)
        ]

        async def body(peer: Peer, batch: list[Item] = batch, run: int = run) -> dict[str, Any]:
            if sizes.warmup:  # untimed: first publishes into a fresh queue are slower
                await peer.publish([(f"warm{run}-{i}", 60_000) for i in range(sizes.warmup)])
            with Stopwatch() as sw:
                await peer.publish(batch)
            out: dict[str, Any] = {
                "n": len(batch),
                "publish_s": round(sw.seconds, 4),
                "publish_rate_per_s": round(rate_per_s(len(batch), sw.seconds), 1),
            }
            if drain:
                records = await peer.drain([m for m, _ in batch], sizes.drain_slack_s + 30)
                out["received"] = len(records)
                out["publish_consume_rate_per_s"] = round(delivery_rate(records), 1)
                out["latency"] = lateness_stats(records, expected=len(batch)).to_dict()
            return out

        runs.append(await with_peer(factory, body))
    result = median_of(runs)
    result["all_runs"] = runs
    return dict(result)


async def steady_run(
    peer: Peer, sizes: Sizes, *, seed: int | None = None, tag: str = "st"
) -> tuple[dict[str, Any], list[Record]]:
    """One steady run on a peer that is already set up: its summary and its records.

    ``sizes.rate`` messages per second fall due for ``sizes.duration_s`` seconds, each with a
    delay uniform in ``[min_delay_ms, max_delay_ms]``, published at ``due - delay``. Ids are
    ``<tag>-<i>``, so runs on one peer instance need distinct tags.

    This process's collector is paused meanwhile (:func:`collector_paused`).
    """
    with collector_paused():
        return await _steady_run(peer, sizes, seed=seed, tag=tag)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection in the bench's own process while it times lateness.

    The bench publishes and consumes every side's messages in one process, whose heap
    grows with each run's records; a full collection there paused it for 30 to 90 ms
    (``gc.callbacks``, 2026-11-26), and the messages it held then were timed late on
    whichever side happened to be running: a p99 of 4,000 messages moves with 40 of them.
    Collected before, and the records kept, the run makes little cyclic garbage.
    Runs may overlap (the ``long`` workload's sides): the last one out enables it again.
    """
    global _paused
    if not _paused:
        gc.collect()
        gc.disable()
    _paused += 1
    try:
        yield
    finally:
        _paused -= 1
        if not _paused:
            gc.enable()


_paused = 0
"""Steady runs in progress (:func:`collector_paused`)."""


async def _steady_run(
    peer: Peer, sizes: Sizes, *, seed: int | None, tag: str
) -> tuple[dict[str, Any], list[Record]]:
    rng = random.Random(sizes.seed + 1 if seed is None else seed)
    n = max(1, int(sizes.rate * sizes.duration_s))
    t0 = now_ms() + sizes.max_delay_ms + 200  # first due time
    plan: list[tuple[float, float, str]] = []
    for i in range(n):
        due = t0 + i * 1000.0 / sizes.rate
        delay = rng.uniform(sizes.min_delay_ms, sizes.max_delay_ms)
        plan.append((due - delay, due, f"{tag}-{i}"))
    plan.sort()
    tasks: list[asyncio.Task[None]] = []
    idx = 0
    max_batch = 0
    try:
        while idx < n:
            now = now_ms()
            batch: list[Item] = []
            while idx < n and plan[idx][0] <= now:
                _, due, mid = plan[idx]
                batch.append((mid, max(0, round(due - now))))
                idx += 1
            if batch:
                max_batch = max(max_batch, len(batch))
                tasks.append(asyncio.create_task(peer.publish(batch)))
            if idx < n:
                await asyncio.sleep(min(0.005, max(0.0, (plan[idx][0] - now_ms()) / 1000)))
        published_all_at = now_ms()
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    confirmed_all_at = now_ms()
    last_due = max(p[1] for p in plan)
    timeout = max(1.0, (last_due - now_ms()) / 1000) + sizes.drain_slack_s
    records = await peer.drain([p[2] for p in plan], timeout)
    summary = {
        "n": n,
        "rate_per_s": sizes.rate,
        "duration_s": sizes.duration_s,
        "delay_ms": [sizes.min_delay_ms, sizes.max_delay_ms],
        "max_pacer_batch": max_batch,
        "confirm_lag_ms": confirmed_all_at - published_all_at,
        "received": len(records),
        "delivered_per_s": round(due_delivery_rate(records), 1),
        "stats": lateness_stats(records, expected=n).to_dict(),
    }
    return summary, records


# ---------------------------------------------------------------- extras


async def run_extras(names: list[str], sizes: Sizes, url: str, queue_type: str) -> dict[str, Any]:
    extras: dict[str, Any] = {}
    if "plain" in names:
        from bench.peers.plain import PlainPeer

        print("  plain publish-only (no consumer) ...", file=sys.stderr)
        extras["plain_publish_only"] = await scenario_publish_rate(
            lambda: PlainPeer(url, queue_type, consume=False), sizes, drain=False
        )
    modes = [n.removeprefix("redis-") for n in names if n.startswith("redis-")]
    if modes:
        from bench.peers.redis_zset import kill9_loss

        print(f"  redis kill -9 loss ({', '.join(modes)}) ...", file=sys.stderr)
        extras["redis_kill9"] = [await kill9_loss(m, sizes.kill9_n) for m in modes]
    if "dramatiq-style" in names:
        from bench.peers.dramatiq_style import DramatiqStylePeer, broker_consumer_timeout_ms

        print("  dramatiq-style memory growth ...", file=sys.stderr)
        peer = DramatiqStylePeer(url, queue_type)

        async def body(p: Peer) -> dict[str, Any]:
            assert isinstance(p, DramatiqStylePeer)
            return await p.memory_growth(sizes.memory_n)

        memory = await with_peer(lambda: peer, body)
        ct = await asyncio.to_thread(broker_consumer_timeout_ms)
        extras["dramatiq"] = {
            "memory": memory,
            "consumer_timeout": {
                **ct,
                "hazard": (
                    "A consumer holding an unacked delivery longer than consumer_timeout gets "
                    "its channel closed (RabbitMQ 3.10: global setting only; per-queue "
                    "x-consumer-timeout / policy arrived in 3.11.15/3.12). Every held delayed "
                    "message is redelivered, and a delay longer than the timeout can never "
                    "be served by a hold-unacked worker. Not demonstrated live: it would take "
                    "the full timeout or changing the shared broker's global setting."
                ),
            },
        }
    return extras
