"""Run the peer designs through the same scenarios and write one JSON file.

    .venv/bin/python -m bench.scenarios_peers --quick           # tiny sizes, ~3 min
    .venv/bin/python -m bench.scenarios_peers --peers naive,plain --n-publish 5000 ...

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

import argparse
import asyncio
import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    DEFAULT_AMQP_URL,
    Record,
    Stopwatch,
    broker_info,
    delivery_rate,
    due_delivery_rate,
    lateness_stats,
    machine_info,
    median_of,
    now_ms,
    rate_per_s,
)
from bench.peers import PEER_NAMES, make_peer
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

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            n_publish=300,
            warmup=50,
            repeats=1,
            rate=50.0,
            duration_s=2.0,
            min_delay_ms=1000,
            max_delay_ms=3000,
            drain_slack_s=10.0,
            kill9_n=2000,
            memory_n=2000,
        )


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
    """
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


async def scenario_steady(factory: PeerFactory, sizes: Sizes) -> dict[str, Any]:
    async def body(peer: Peer) -> dict[str, Any]:
        summary, _records = await steady_run(peer, sizes)
        return summary

    return dict(await with_peer(factory, body))


# ---------------------------------------------------------------- whole run


async def run_peer(name: str, factory: PeerFactory, sizes: Sizes) -> dict[str, Any]:
    probe = factory()  # not set up: only for name/description/supports_delay
    out: dict[str, Any] = {
        "name": probe.name,
        "description": probe.description,
        "supports_delay": probe.supports_delay,
    }
    delays = probe.supports_delay
    scenarios: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = [
        ("seeds", lambda: scenario_seeds(factory, sizes.drain_slack_s)),
        ("publish_rate", lambda: scenario_publish_rate(factory, sizes, drain=not delays)),
        ("steady", lambda: scenario_steady(factory, sizes)),
    ]
    for key, coro_fn in scenarios:
        if key == "seeds" and not probe.supports_delay:
            out[key] = None
            continue
        t = time.perf_counter()
        print(f"  {name}: {key} ...", file=sys.stderr, flush=True)
        try:
            out[key] = await coro_fn()
        except Exception as exc:  # one failing scenario must not sink the whole run
            out[key] = {"error": f"{exc.__class__.__name__}: {exc}"}
        print(f"  {name}: {key} done in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    return out


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


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    sizes = Sizes.quick() if args.quick else Sizes()
    overridable = ("n_publish", "warmup", "repeats", "rate", "duration_s",
                   "min_delay_ms", "max_delay_ms", "kill9_n", "memory_n")  # fmt: skip
    for field in overridable:
        value = getattr(args, field)
        if value is not None:
            setattr(sizes, field, value)
    names = (
        [n.strip() for n in args.peers.split(",") if n.strip()] if args.peers else list(PEER_NAMES)
    )
    for n in names:
        if n not in PEER_NAMES:
            raise SystemExit(f"unknown peer {n!r}; known: {', '.join(PEER_NAMES)}")
    result: dict[str, Any] = {
        "started_at_ms": now_ms(),
        "machine": machine_info(),
        "broker": await broker_info(args.url),
        "queue_type": args.queue_type,
        "sizes": asdict(sizes),
        "peers": {},
    }
    for name in names:
        print(f"peer {name}", file=sys.stderr, flush=True)

        def factory(name: str = name) -> Peer:
            return make_peer(name, url=args.url, queue_type=args.queue_type)

        result["peers"][name] = await run_peer(name, factory, sizes)
    result["extras"] = await run_extras(names, sizes, args.url, args.queue_type)
    result["finished_at_ms"] = now_ms()
    return result


# ---------------------------------------------------------------- table


def _fmt(v: Any, nd: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, (int, float)):
        return f"{v:,.{nd}f}"
    return str(v)


def format_table(result: dict[str, Any]) -> str:
    head = (
        f"{'peer':<30} {'seeds order (s)':<15} {'seed late p50/max':>17} "
        f"{'pub/s':>8} {'steady p50':>10} {'p99':>7} {'max':>7} {'early':>5} {'miss':>4}"
    )
    lines = [head, "-" * len(head)]
    for peer in result["peers"].values():
        seeds = peer.get("seeds") or {}
        if "error" in seeds:
            order, seed_late = "ERROR", "-"
        elif seeds:
            order = ",".join(m.split("-")[1].rstrip("s") for m in seeds["arrival_order"])
            st = seeds["stats"]
            seed_late = f"{_fmt(st['p50_ms'])}/{_fmt(st['max_ms'])}"
        else:
            order, seed_late = "n/a", "-"
        pr = peer.get("publish_rate") or {}
        pub = "ERROR" if "error" in pr else _fmt(pr.get("publish_rate_per_s"))
        sd = peer.get("steady") or {}
        if "error" in sd:
            cells = ["ERROR", "-", "-", "-", "-"]
        else:
            s = sd.get("stats", {})
            cells = [_fmt(s.get("p50_ms")), _fmt(s.get("p99_ms")), _fmt(s.get("max_ms")),
                     _fmt(s.get("early")), _fmt(s.get("missing"))]  # fmt: skip
        lines.append(
            f"{peer['name']:<30} {order:<15} {seed_late:>17} {pub:>8} "
            f"{cells[0]:>10} {cells[1]:>7} {cells[2]:>7} {cells[3]:>5} {cells[4]:>4}"
        )
        if not peer["supports_delay"] and "publish_consume_rate_per_s" in pr:
            lines.append(
                f"{'':<30} publish+consume {_fmt(pr['publish_consume_rate_per_s'])}/s, "
                f"latency p50 {_fmt(pr['latency']['p50_ms'])} ms (steady cols = latency)"
            )
    extras = result.get("extras", {})
    ppo = extras.get("plain_publish_only")
    if ppo:
        lines.append(
            f"plain publish-only (no consumer): {_fmt(ppo.get('publish_rate_per_s'))} msgs/s "
            f"confirmed"
        )
    for k in extras.get("redis_kill9", []):
        lines.append(
            f"redis kill -9 [{k['mode']}]: wrote {k['written']}, survived {k['survived']}, "
            f"lost {k['lost']}"
        )
    if "dramatiq" in extras:
        m = extras["dramatiq"]["memory"]
        ct = extras["dramatiq"]["consumer_timeout"]
        lines.append(
            f"dramatiq-style: holding {m['held_unacked']} unacked -> RSS +{m['rss_growth_kb']} KiB "
            f"(~{_fmt(m['bytes_per_held_message'])} B/msg); broker consumer_timeout "
            f"{ct['consumer_timeout_ms']} ms ({ct['source']})"
        )
    lines.append("(lateness in ms; early = received before due; miss = not received in time)")
    return "\n".join(lines)


# ---------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scenarios_peers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke run")
    p.add_argument("--peers", help=f"comma list (default all): {','.join(PEER_NAMES)}")
    p.add_argument("--queue-type", default="quorum", choices=("quorum", "classic"))
    p.add_argument("--url", default=DEFAULT_AMQP_URL)
    p.add_argument(
        "--out", type=Path, help="JSON path (default bench/results/quick/peers-runner[-quick].json)"
    )
    p.add_argument("--n-publish", type=int, help="messages in the publish-rate scenario")
    p.add_argument("--warmup", type=int, help="untimed messages before each publish-rate run")
    p.add_argument("--repeats", type=int, help="publish-rate runs (median reported)")
    p.add_argument("--rate", type=float, help="steady scenario: messages due per second")
    p.add_argument("--duration-s", type=float, help="steady scenario: seconds of due messages")
    p.add_argument("--min-delay-ms", type=int, help="steady scenario: min delay")
    p.add_argument("--max-delay-ms", type=int, help="steady scenario: max delay")
    p.add_argument("--kill9-n", type=int, help="items written before redis kill -9")
    p.add_argument("--memory-n", type=int, help="pending messages held by dramatiq-style")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    async def runner() -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        # SIGTERM cancels the run, so every peer's teardown still runs (finally blocks).
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        return await main_async(args)

    try:
        result = asyncio.run(runner())
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("interrupted; every peer that was set up has been torn down", file=sys.stderr)
        return 130
    # Not bench/results/peers.json: that is the suite's (python -m bench), in another format.
    name = "peers-runner-quick.json" if args.quick else "peers-runner.json"
    out = args.out or RESULTS_DIR / "quick" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(out)
    print(format_table(result))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
