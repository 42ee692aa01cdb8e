"""Held destinations beyond the e2e and hops workloads (issue 35): long delays, and what
the layout's other parts cost. Run with ``python -m bench --only long`` / ``--only layout``.

long    delays of 10 min to 1 h (``--long-delays``), a held destination and the tiers at
        once on one broker, each with its Worker in its own process: ``--long-rate``
        messages fall due a second for ``--long-duration`` s, published at ``due - delay``
        (the steady workload's pacer), so the run lasts the longest delay and a little more.
        Lateness p50/p99/max, early, mean hops (``PublishResult.hops`` and ``x-death``).
layout  side by side at ``layout_rate`` due/s, in rounds, where a held destination's
        broker CPU goes: the plain queue; the same through a topic exchange with rmqdelay's
        key and headers (``plain-topic``); held with the default settings (``held``);
        held with delays under the hold window, no hop (``held0``); the same drained by a
        bare aio-pika consumer that acks at once, so the journal is written and not read
        (``held0-bare``); and by the Worker with ``schedule_journal=false``
        (``held0-nojournal``). Broker CPU per message and lateness. (``journal_linger=0``,
        a journal write per publish, cost 2.12 x plain against 1.73 with the linger,
        2026-11-29.) (Held without the tier queues below the hold window, deleted after
        ``topology apply``, cost the same as held: 1.90 x plain against 1.85 x, 2026-11-29,
        commit 99b732d; it is measured idle only now.) Before them, the
        broker idle (nothing of ours running) with no topology, the default topology and
        the lean one, ``layout_idle_s`` each, in rounds: do idle tier queues cost CPU?
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from bench.common import broker_pid, idle_cpu_rate, quantiles
from bench.peers.plain import PlainPeer
from bench.peers.rmqdelay_peer import RmqdelayPeer
from bench.scenarios_peers import steady_run
from bench.suite import (
    Config,
    Suite,
    _counters,
    _counters_delta,
    _rmq,
    _say,
    side_by_side,
    zero_delay,
)

SETTLE_S = 2.0
"""After declaring or deleting queues, before the broker's idle CPU counts."""
NO_HOP_MAX_MS = 2500
"""The longest delay of the ``held0`` configs: under the hold window (5.12 s), no hop."""
BARE = 5064
"""The bare consumer's prefetch: the Worker's for a held destination (64 + max_held)."""


async def run_long(suite: Suite) -> None:
    s = suite.sizes
    low, high = s.long_delays_ms
    sizes = s.steady_sizes(
        s.long_rate, s.long_duration_s, min_delay_ms=low, max_delay_ms=high, drain_slack_s=60.0
    )
    peers = {"tiers": _rmq(suite), "held": _rmq(suite, held=True)}
    results: dict[str, Any] = {"configs": {}}
    try:
        for peer in peers.values():
            await peer.setup()
        before = {name: _counters(peer) for name, peer in peers.items()}
        minutes = (high + s.long_duration_s * 1000) / 60_000
        _say(f"long: tiers and held at once, delays {low / 60_000:g} to {high / 60_000:g} min, "
             f"{s.long_rate:g}/s for {s.long_duration_s:g} s: about {minutes:.0f} min")  # fmt: skip
        runs = await asyncio.gather(
            *(steady_run(peer, sizes, tag=f"long-{name}") for name, peer in peers.items())
        )
        for (name, peer), (summary, records) in zip(peers.items(), runs, strict=True):
            summary["hops"] = _counters_delta(peer, before[name])
            summary["lateness_quantiles"] = [
                round(v, 1) for v in quantiles(r.lateness_ms for r in records)
            ]
            summary["description"] = peer.description
            results["configs"][name] = summary
    finally:
        for peer in peers.values():
            await peer.teardown()
    params = {
        "delays_ms": [low, high],
        "rate": s.long_rate,
        "duration_s": s.long_duration_s,
        "n": max(1, int(s.long_rate * s.long_duration_s)),
        "worker_concurrency": s.worker_concurrency,
        "worker_prefetch": s.worker_prefetch,
    }
    suite.write("long", params, results)


async def run_layout(suite: Suite) -> None:
    s = suite.sizes
    results: dict[str, Any] = {"idle": await idle_topologies(suite)}
    plain = zero_delay(s, s.layout_duration_s)
    unheld = _sizes(suite, NO_HOP_MAX_MS)
    configs: list[Config] = [
        ("plain", lambda: PlainPeer(suite.url, s.queue_type), plain),
        ("plain-topic", lambda: PlainPeer(suite.url, s.queue_type, topic=True), plain),
        ("held", lambda: _rmq(suite, held=True), _sizes(suite)),
        ("held0", lambda: _rmq(suite, held=True), unheld),
        ("held0-bare", lambda: _rmq(suite, held=True, worker="aiopika", prefetch=BARE), unheld),
        ("held0-nojournal", lambda: _rmq(suite, held=True, journal=False), unheld),
    ]
    table, descriptions = await side_by_side(configs, (s.layout_rate,), s.layout_rounds, "layout")
    results["configs"], results["descriptions"] = table[str(s.layout_rate)], descriptions
    held_cpu = results["configs"]["held"]["cpu_us_per_msg"].get("broker_net")
    for entry in results["configs"].values():
        cpu = entry["cpu_us_per_msg"].get("broker_net")
        entry["broker_cpu_ratio_to_held"] = (
            round(cpu / held_cpu, 3) if cpu is not None and held_cpu else None
        )
    params = {
        "rate": s.layout_rate,
        "duration_s": s.layout_duration_s,
        "rounds": s.layout_rounds,
        "idle_s": s.layout_idle_s,
        "delays_ms": [s.min_delay_ms, s.max_delay_ms],
        "held0_delays_ms": [s.min_delay_ms, NO_HOP_MAX_MS],
        "worker_concurrency": s.worker_concurrency,
        "worker_prefetch": s.worker_prefetch,
    }
    suite.write("layout", params, results)


def _sizes(suite: Suite, max_delay_ms: int | None = None) -> Any:
    s = suite.sizes
    top = s.max_delay_ms if max_delay_ms is None else max_delay_ms
    return lambda rate: s.steady_sizes(rate, s.layout_duration_s, max_delay_ms=top)


async def idle_topologies(suite: Suite) -> dict[str, Any]:
    """The broker's CPU while idle with no topology of ours, a held destination's default
    topology, and the lean one (nothing publishes or consumes): what idle queues cost."""
    s = suite.sizes
    pid = broker_pid()
    sides: dict[str, list[float]] = {"none": [], "held": [], "held-lean": []}
    tiers: dict[str, int] = {}
    for k in range(s.layout_rounds):
        for name in sides:
            _say(f"layout: broker idle, {name} topology, {s.layout_idle_s:g} s, round {k + 1}")
            peer = None if name == "none" else _rmq(suite, held=True, lean=name == "held-lean")
            try:
                if isinstance(peer, RmqdelayPeer):
                    await peer.apply_only()
                    tiers[name] = len(peer.settings_layout().tiers) - (
                        len(peer.unused_tiers()) if peer.lean else 0
                    )
                await asyncio.sleep(SETTLE_S)
                rate = await idle_cpu_rate(pid, s.layout_idle_s)
                if rate is not None:
                    sides[name].append(round(rate * 1000, 2))  # ms of CPU a second
            finally:
                if peer is not None:
                    await peer.teardown()
    medians = {name: statistics.median(v) if v else None for name, v in sides.items()}
    held, lean = medians["held"], medians["held-lean"]
    unused = tiers.get("held", 0) - tiers.get("held-lean", 0)
    return {
        "broker_cpu_ms_per_s": medians,
        "runs": sides,
        "tier_queues": tiers,
        "unused_tier_queues": unused,
        "per_unused_queue_ms_per_s": (
            round((held - lean) / unused, 4)
            if held is not None and lean is not None and unused
            else None
        ),
    }


__all__ = ["idle_topologies", "run_layout", "run_long"]
