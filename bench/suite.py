"""The benchmark suite: every workload of issue 4, one JSON file each, then plots and the
Performance page.

    python -m bench                          # the full suite (~35 min with 1M pending)
    python -m bench --quick                  # small sizes, results in bench/results/quick/
    python -m bench --only publish,e2e       # some workloads (see WORKLOADS below)
    python -m bench --scale-messages 0       # skip the scale workload
    python -m bench report                   # plots + docs/performance.md from the JSON files

Workloads (each timing is the median of ``--repeats`` runs, with its ratio to the reference
measured in the same run):

publish   the measures of bench.measures: publishers and the worker against the raw clients
          confirmed publish into one plain queue of the same type (the reference).
e2e       messages due at a steady 250/500/1000 per second (delays mixed), drained by the
          rmqdelay Worker, the tiers and a held destination: lateness p50/p99/max, early,
          delivered per second, mean hops, broker CPU; and a saturation run each offered at
          the plain-queue limit. References: the plain queue's publish-and-consume rate (the
          limit) and its publish-to-consume latency at each rate, in the same rounds.
seeds     5, 4, 3, 2, 1 s published in that order, for every design.
radix     radix 2, 4, 8, 16 and radix 16 with a named 15-min tier on the e2e workload at
          500/s, plus a saturation run each; planned hops for the workload and for 15 min.
hops      the default layout, held and not, at 250 and 500 due/s for 30 s: broker CPU per
          delivered message and lateness against the plain queue's, and the broker alone
          doing 1 and 3 TTL dead-letter hops between quorum queues (no rmqdelay), the floor
          of any tier design.
peers     every design side by side: confirmed publish rate, the steady workload at 500/s
          (the lateness CDF), and the extras (Redis kill -9 loss, dramatiq-style memory).
scale     1,000,000 pending delayed messages (see :mod:`bench.scale`).
engine43  the tiers against RabbitMQ 4.3's one-queue deferred engine (:mod:`bench.engine43`;
          BENCH_RMQ43_URL, skipped below 4.3).

Only with --only (:data:`bench.keys.OPT_IN`), see :mod:`bench.held`:

long      delays of 10 min to 1 h, a held destination and the tiers at once (about an hour).
layout    held with every tier queue against held without the unused ones and without the
          journal; the broker idle with and without those tier queues.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.common import (
    DEFAULT_AMQP_URL,
    CpuMeter,
    Record,
    broker_info,
    broker_pid,
    idle_cpu_rate,
    lateness_stats,
    machine_info,
    machine_load,
    masked,
    now_ms,
    quantiles,
    settle,
)
from bench.keys import OPT_IN, WORKLOADS
from bench.peers import PEER_NAMES, make_peer
from bench.peers.base import Peer
from bench.scenarios_peers import (
    Sizes,
    run_extras,
    scenario_publish_rate,
    scenario_seeds,
    steady_run,
    with_peer,
)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
NARROW = "2560ms"
"""The ``held-narrow`` configs' hold window: the default until 2026-11-30, side by side
with today's (5.12 s), so what the wider window saves is measured, not assumed."""
ENGINE43_QUICK = ("--rates", "50,250", "--duration", "5", "--repeats", "1", "--memory", "10000")


@dataclass
class SuiteSizes:
    """Every size and parameter of a suite run (all of it goes into the JSON)."""

    repeats: int = 3
    queue_type: str = "quorum"
    # publish
    publish_count: int = 5000
    publish_window: int = 500
    publish_warmup: int = 500
    drain_count: int = 20_000
    # e2e (the steady workload, shared by radix and peers)
    rates: tuple[float, ...] = (250.0, 500.0, 1000.0)
    duration_s: float = 4.0
    min_delay_ms: int = 1000
    max_delay_ms: int = 4000
    drain_slack_s: float = 15.0
    saturation_duration_s: float = 4.0
    limit_n: int = 5000
    limit_warmup: int = 200
    worker: str = "subprocess"
    worker_concurrency: int = 64
    worker_prefetch: int = 256
    # radix
    radixes: tuple[int, ...] = (2, 4, 8, 16)
    named_tier: str = "15m"
    radix_rate: float = 500.0
    radix_saturation_repeats: int = 1
    # hops: broker CPU and lateness at the default layout, held and not, against the plain
    # queue and the broker alone doing 1 and 3 TTL hops (the floor), configs alternating in
    # each round
    hops_rates: tuple[float, ...] = (250.0, 500.0)
    hops_duration_s: float = 30.0
    hops_repeats: int = 2
    hops_chain: tuple[int, ...] = (1, 3)
    hops_chain_delay_ms: int = 2500
    hops_spread: int = 0
    """> 0: also the 1-hop chain spread over this many queues (rmqdelay's spread, measured)."""
    # long: delays of 10 min to 1 h, held against the tiers, both at once (bench.held)
    long_delays_ms: tuple[int, int] = (600_000, 3_600_000)
    long_rate: float = 5.0
    long_duration_s: float = 120.0
    # layout: held with every tier against held without the unused ones, and without the
    # journal (bench.held); the broker idle with and without those tiers
    layout_rate: float = 500.0
    layout_duration_s: float = 30.0
    layout_rounds: int = 2
    layout_idle_s: float = 10.0
    # peers
    peers: tuple[str, ...] = tuple(n for n in PEER_NAMES if n != "rmqdelay-sync")
    peer_rate: float = 500.0
    peer_repeats: int = 3
    peer_n_publish: int = 2000
    peer_warmup: int = 200
    kill9_n: int = 20000
    memory_n: int = 10000
    # scale
    scale_messages: int = 1_000_000
    scale_chunk: int = 10_000
    scale_publisher: str = "sync"
    scale_margin_s: float = 45.0
    # engine43 (bench.engine43's own defaults; these are its flags)
    engine43_args: tuple[str, ...] = ()
    # list
    list_messages: int = 100_000
    # index
    index_messages: int = 1_000_000
    history: str = "0,1000000,10000000"
    """bench.history's grid: records of history ..."""
    history_pending: str = "0,1000000"
    """... by records pending."""
    purge_pending: int = 1_000_000
    """bench.purge: pending records, a tenth of them purged by destination."""
    seed: int = 1234

    @classmethod
    def quick(cls) -> SuiteSizes:
        return cls(
            repeats=1,
            publish_count=1000,
            publish_warmup=100,
            drain_count=2000,
            rates=(250.0, 500.0),
            duration_s=2.0,
            min_delay_ms=500,
            max_delay_ms=2000,
            drain_slack_s=10.0,
            saturation_duration_s=2.0,
            limit_n=1000,
            radixes=(2, 16),
            hops_rates=(500.0,),
            hops_duration_s=10.0,
            hops_repeats=1,
            long_delays_ms=(10_000, 30_000),
            long_duration_s=10.0,
            layout_duration_s=10.0,
            layout_rounds=1,
            layout_idle_s=3.0,
            peer_repeats=1,
            peer_n_publish=300,
            peer_warmup=50,
            kill9_n=2000,
            memory_n=2000,
            scale_messages=20_000,
            scale_chunk=5_000,
            scale_margin_s=15.0,
            engine43_args=ENGINE43_QUICK,
            list_messages=10_000,
            index_messages=20_000,
            history="0,100000",
            history_pending="0,20000",
            purge_pending=20_000,
        )

    def steady_sizes(self, rate: float, duration_s: float | None = None, **kw: Any) -> Sizes:
        base = Sizes(
            rate=rate,
            duration_s=self.duration_s if duration_s is None else duration_s,
            min_delay_ms=self.min_delay_ms,
            max_delay_ms=self.max_delay_ms,
            drain_slack_s=self.drain_slack_s,
            seed=self.seed,
        )
        return replace(base, **kw)


@dataclass
class Suite:
    url: str
    sizes: SuiteSizes
    out: Path
    machine: dict[str, Any] = field(default_factory=dict)
    broker: dict[str, Any] = field(default_factory=dict)
    references: dict[str, Any] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)

    load_before: dict[str, Any] = field(default_factory=dict)

    def write(self, workload: str, params: dict[str, Any], results: dict[str, Any]) -> Path:
        doc = {
            "workload": workload,
            "generated_at_ms": now_ms(),
            "command": self.command,
            "machine": self.machine,
            "broker": self.broker,
            "load_before": self.load_before,
            "params": params,
            "results": results,
        }
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"{workload}.json"
        tmp = path.with_suffix(f".json.tmp{os.getpid()}")
        tmp.write_text(json.dumps(doc, indent=1, default=_json_default) + "\n", encoding="utf-8")
        tmp.replace(path)
        _say(f"wrote {path}")
        return path


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _median(values: Sequence[float | None]) -> float | None:
    clean = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(clean) if clean else None


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference == 0 or math.isnan(reference):
        return None
    return round(value / reference, 3)


def _rmq(suite: Suite, **kw: Any) -> Peer:
    from bench.peers.rmqdelay_peer import RmqdelayPeer

    s = suite.sizes
    options: dict[str, Any] = {
        "worker": s.worker,
        "concurrency": s.worker_concurrency,
        # held: the Worker's own (concurrency + max_held), room for the messages it holds
        "prefetch": None if kw.get("held") else s.worker_prefetch,
    }
    options.update(kw)
    return RmqdelayPeer(suite.url, s.queue_type, **options)


# ---------------------------------------------------------------- repeated steady runs


async def steady_repeats(
    peer: Peer, sizes: Sizes, repeats: int, tag: str
) -> tuple[dict[str, Any], list[Record]]:
    """``repeats`` steady runs on one set-up peer: medians, every run, pooled records."""
    runs: list[dict[str, Any]] = []
    pooled: list[Record] = []
    for k in range(repeats):
        counters_before = _counters(peer)
        extra_pids: dict[str, int] = getattr(peer, "cpu_pids", dict)()
        pids = {"broker": broker_pid(), "client": os.getpid(), **extra_pids}
        before = await settle(pids["broker"])  # the previous run's tail is that run's
        with CpuMeter(pids) as meter:
            summary, records = await steady_run(
                peer, sizes, seed=sizes.seed + 17 * k, tag=f"{tag}{k}"
            )
        after = await settle(pids["broker"])  # this run's tail: the broker's work after it
        result = dict(meter.result)
        if before and after and result.get("broker_cpu_s") is not None:
            idle = min(before.rate, after.rate)  # the broker's background, its quietest second
            result["broker_idle_cpu_per_s"] = round(idle, 3)
            result["broker_tail_cpu_s"] = round(after.cpu_s, 3)
            result["broker_tail_s"] = round(after.wall_s, 1)
            spent = result["broker_cpu_s"] + after.cpu_s
            result["broker_net_cpu_s"] = round(spent - idle * (result["wall_s"] + after.wall_s), 3)
        summary["cpu"] = _per_message(result, summary["received"])
        summary["hops"] = _counters_delta(peer, counters_before)
        runs.append(summary)
        pooled.extend(records)
    summary = _fold(runs)
    summary["lateness_quantiles"] = [round(v, 1) for v in quantiles(r.lateness_ms for r in pooled)]
    summary["pooled"] = lateness_stats(pooled, expected=sum(r["n"] for r in runs)).to_dict()
    return summary, pooled


def _per_message(cpu: dict[str, Any], messages: int) -> dict[str, Any]:
    """CPU seconds per process over a run, and microseconds per delivered message."""
    out = dict(cpu)
    for key, value in cpu.items():
        if key.endswith("_cpu_s") and value is not None and messages:
            out[key[:-6] + "_us_per_msg"] = round(value / messages * 1e6, 1)
    return out


def _counters(peer: Peer) -> dict[str, Any] | None:
    counters = getattr(peer, "counters", None)
    return dict(counters()) if callable(counters) else None


def _counters_delta(peer: Peer, before: dict[str, Any] | None) -> dict[str, Any] | None:
    after = _counters(peer)
    if after is None or before is None:
        return None
    published = after["published"] - before["published"]
    hist_after, hist_before = after["hops_histogram"], before["hops_histogram"]
    hist = {k: v - hist_before.get(k, 0) for k, v in hist_after.items()}
    mean = sum(int(k) * v for k, v in hist.items()) / published if published else None
    deaths = after["x_death_hops_total"] - before["x_death_hops_total"]
    received = after["x_death_count"] - before["x_death_count"]
    return {
        "published": published,
        "mean_hops": None if mean is None else round(mean, 4),
        "hops_histogram": {k: v for k, v in hist.items() if v},
        "mean_x_death_hops": round(deaths / received, 4) if received else None,
        "duplicates": after["duplicates"] - before["duplicates"],
    }


def _fold(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs of the figures that matter, and every run."""

    def col(path: Sequence[str]) -> list[float | None]:
        out = []
        for run in runs:
            value: Any = run
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            out.append(value if isinstance(value, (int, float)) else None)
        return out

    return {
        "runs": len(runs),
        "n": runs[0]["n"] if runs else 0,
        "rate_per_s": runs[0]["rate_per_s"] if runs else None,
        "p50_ms": _median(col(["stats", "p50_ms"])),
        "p99_ms": _median(col(["stats", "p99_ms"])),
        "max_ms": _median(col(["stats", "max_ms"])),
        "mean_ms": _median(col(["stats", "mean_ms"])),
        "early_total": sum(int(v or 0) for v in col(["stats", "early"])),
        "missing_total": sum(int(v or 0) for v in col(["stats", "missing"])),
        "delivered_per_s": _median(col(["delivered_per_s"])),
        "mean_hops": _median(col(["hops", "mean_hops"])),
        "mean_x_death_hops": _median(col(["hops", "mean_x_death_hops"])),
        "cpu_us_per_msg": {
            name: _median(col(["cpu", f"{name}_us_per_msg"]))
            for name in ("broker", "broker_net", "client", "worker", "redis", "machine")
            if any(v is not None for v in col(["cpu", f"{name}_us_per_msg"]))
        },
        "all_runs": runs,
    }


Config = tuple[str, Callable[[], Peer], Callable[[float], Sizes]]
"""One side of a side-by-side workload: its name, its peer, and its runs' sizes at a rate."""


async def side_by_side(
    configs: Sequence[Config],
    rates: Sequence[float],
    rounds: int,
    tag: str,
    *,
    after: Callable[[dict[str, Peer]], Awaitable[None]] | None = None,
) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, str]]:
    """Every config at every rate once per round, so the machine's drift hits all of them,
    on peers set up once for the workload (``after`` gets them once the rounds are done).

    Returns, per rate and config, the fold of its rounds (medians, pooled lateness) with its
    broker CPU and lateness as ratios to ``plain``'s in the same rounds; and each config's
    description.
    """
    peers: dict[str, Peer] = {}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    pooled: dict[str, dict[str, list[Record]]] = {}
    for r in rates:
        runs[str(r)] = {name: [] for name, _, _ in configs}
        pooled[str(r)] = {name: [] for name, _, _ in configs}
    try:
        for name, factory, _ in configs:
            peers[name] = factory()
            await peers[name].setup()
        for k in range(rounds):
            for rate in rates:
                for name, _, sizes_at in configs:
                    _say(f"{tag}: {name} at {rate:g}/s, round {k + 1} of {rounds}")
                    sizes = sizes_at(rate)
                    summary, records = await steady_repeats(
                        peers[name], replace(sizes, seed=sizes.seed + k), 1, f"{tag}{rate:g}-{k}-"
                    )
                    runs[str(rate)][name].append(summary["all_runs"][0])
                    pooled[str(rate)][name].extend(records)
        if after is not None:
            await after(peers)
    finally:
        for peer in peers.values():
            await peer.teardown()
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for at, by_name in runs.items():
        table[at] = {}
        for name, rows in by_name.items():
            entry = _fold(rows)
            records = pooled[at][name]
            lateness = quantiles(r.lateness_ms for r in records)
            entry["lateness_quantiles"] = [round(v, 1) for v in lateness]
            entry["pooled"] = lateness_stats(records, expected=sum(r["n"] for r in rows)).to_dict()
            table[at][name] = entry
        if "plain" in table[at]:
            ratios_to(table[at]["plain"], table[at].values())
    return table, {name: peer.description for name, peer in peers.items()}


def ratios_to(plain: dict[str, Any], entries: Iterable[dict[str, Any]]) -> None:
    """Each entry's broker CPU per message and lateness as ratios to the plain queue's."""
    cpu = plain["cpu_us_per_msg"].get("broker_net")
    for entry in entries:
        entry["broker_cpu_ratio_to_plain"] = _ratio(entry["cpu_us_per_msg"].get("broker_net"), cpu)
        entry["ratio_to_plain_latency"] = {
            q: _ratio(entry[q], plain[q]) for q in ("p50_ms", "p99_ms", "max_ms")
        }


def zero_delay(s: SuiteSizes, duration_s: float | None = None) -> Callable[[float], Sizes]:
    """The plain queue's sizes at a rate: it ignores delays, so its lateness is latency."""
    return lambda rate: s.steady_sizes(rate, duration_s, min_delay_ms=0, max_delay_ms=0)


# ---------------------------------------------------------------- references


async def plain_limit(suite: Suite) -> dict[str, Any]:
    """The plain queue's confirmed publish-and-consume rate: the limit (cached per run)."""
    if "plain_limit" in suite.references:
        return dict(suite.references["plain_limit"])
    from bench.peers.plain import PlainPeer

    s = suite.sizes
    _say(f"reference: plain {s.queue_type} queue publish+consume, {s.limit_n} x {s.repeats}")
    sizes = Sizes(n_publish=s.limit_n, warmup=s.limit_warmup, repeats=s.repeats, seed=s.seed)
    pids = {"broker": broker_pid(), "client": os.getpid()}
    idle = await idle_cpu_rate(pids["broker"])
    with CpuMeter(pids) as meter:
        result = await scenario_publish_rate(
            lambda: PlainPeer(suite.url, s.queue_type), sizes, drain=True
        )
    cpu = dict(meter.result)
    if idle is not None and cpu.get("broker_cpu_s") is not None:
        cpu["broker_net_cpu_s"] = round(cpu["broker_cpu_s"] - idle * cpu["wall_s"], 3)
    # every run, warm-up included, published and consumed (setup and teardown count too)
    result["cpu"] = _per_message(cpu, s.repeats * (s.limit_n + s.limit_warmup))
    result["publish_consume_rate_runs"] = [
        r.get("publish_consume_rate_per_s") for r in result["all_runs"]
    ]
    suite.references["plain_limit"] = result
    return dict(result)


# ---------------------------------------------------------------- workloads


async def workload_publish(suite: Suite) -> None:
    """Every measure of :mod:`bench.measures`, alternating; its figures are keyed already."""
    from bench.measures import SPECS, Bench
    from bench.measures import Sizes as MeasureSizes
    from bench.measures import run as measures_run

    s = suite.sizes
    _say(f"publish: {s.publish_count} x {s.repeats}, window {s.publish_window}")
    sizes = MeasureSizes(s.publish_count, s.publish_window, s.drain_count)
    bench = Bench(suite.url, sizes, s.queue_type)
    keys = tuple(spec.key for spec in SPECS)
    figures = await measures_run(bench, keys, s.repeats, s.publish_warmup)
    params = {
        "count": s.publish_count,
        "single_count": sizes.single,
        "drain_count": s.drain_count,
        "repeats": s.repeats,
        "window": s.publish_window,
        "warmup": s.publish_warmup,
        "queue_type": s.queue_type,
        "body_bytes": 100,
        "long_delays_s": [600, 3600],
    }
    suite.write("publish", params, {"figures": figures})


async def workload_e2e(suite: Suite) -> None:
    """The plain queue, the tiers and a held destination side by side in each round at each
    rate (the plain queue's publish-to-consume latency is the reference), then a
    saturation run of each rmqdelay side offered at the plain limit."""
    from bench.peers.plain import PlainPeer

    s = suite.sizes
    limit = await plain_limit(suite)
    limit_rate = limit.get("publish_consume_rate_per_s")
    results: dict[str, Any] = {"plain_limit": limit}
    configs: list[Config] = [
        ("plain", lambda: PlainPeer(suite.url, s.queue_type), zero_delay(s)),
        ("tiers", lambda: _rmq(suite), s.steady_sizes),
        ("held", lambda: _rmq(suite, held=True), s.steady_sizes),
        ("held-narrow", lambda: _rmq(suite, held=True, hold_window=NARROW), s.steady_sizes),
    ]

    async def saturation(peers: dict[str, Peer]) -> None:
        if not limit_rate:
            return
        offered = round(limit_rate)
        for name, key in (("tiers", "saturation"), ("held", "held_saturation")):
            _say(f"e2e: {name} saturation, offered {offered}/s (the plain limit) x {s.repeats}")
            sizes = s.steady_sizes(offered, s.saturation_duration_s, drain_slack_s=120.0)
            summary, _ = await steady_repeats(peers[name], sizes, s.repeats, f"sat{name}-")
            summary["ratio_to_plain_limit"] = _ratio(summary["delivered_per_s"], limit_rate)
            results[key] = summary

    table, descriptions = await side_by_side(configs, s.rates, s.repeats, "e2e", after=saturation)
    for by_name in table.values():
        for entry in by_name.values():
            entry["ratio_to_plain_limit"] = _ratio(entry["delivered_per_s"], limit_rate)
    results["plain_latency"] = {rate: t["plain"] for rate, t in table.items()}
    results["rates"] = {rate: t["tiers"] for rate, t in table.items()}
    results["held"] = {rate: t["held"] for rate, t in table.items()}
    results["held_narrow"] = {rate: t["held-narrow"] for rate, t in table.items()}
    results["design"], results["descriptions"] = descriptions["tiers"], descriptions
    at500 = results["rates"].get(str(500.0))
    sat = results.get("saturation") or {}
    results["targets"] = {
        "p99_at_500_ms": None if at500 is None else at500["p99_ms"],
        "p99_at_500_target_ms": 10 + 15,  # the default resolution + 15 ms
        "early_total": sum(r["early_total"] for r in results["rates"].values())
        + int(sat.get("early_total") or 0),
        "held_early_total": sum(r["early_total"] for r in results["held"].values())
        + int((results.get("held_saturation") or {}).get("early_total") or 0),
        "delivered_ratio_to_limit": sat.get("ratio_to_plain_limit"),
        "delivered_ratio_target": 0.5,
    }
    params = {**_steady_params(s), "rates": list(s.rates), "limit_n": s.limit_n}
    params["configs"] = [name for name, _, _ in configs]
    suite.write("e2e", params, results)


def _steady_params(s: SuiteSizes) -> dict[str, Any]:
    return {
        "repeats": s.repeats,
        "duration_s": s.duration_s,
        "delay_ms": [s.min_delay_ms, s.max_delay_ms],
        "saturation_duration_s": s.saturation_duration_s,
        "queue_type": s.queue_type,
        "worker": s.worker,
        "worker_concurrency": s.worker_concurrency,
        "worker_prefetch": s.worker_prefetch,
        "body_bytes": 100,
        "seed": s.seed,
    }


def planned_hops(radix: int, named: Sequence[str], delays_ms: Sequence[int]) -> float:
    """Mean hops the planner gives for these delays (no broker involved)."""
    from rmqdelay import Settings, plan_delay

    settings = Settings(prefix="plan", radix=radix, named_tiers=list(named), destinations=[])
    layout = settings.layout
    total = sum(len(plan_delay(layout, d * 1000, "x").hops) for d in delays_ms)
    return total / len(delays_ms)


async def workload_radix(suite: Suite) -> None:
    s = suite.sizes
    limit = await plain_limit(suite)
    limit_rate = limit.get("publish_consume_rate_per_s")
    configs: list[tuple[str, int, list[str]]] = [(f"radix {r}", r, []) for r in s.radixes]
    configs.append((f"radix 16 + named {s.named_tier}", 16, [s.named_tier]))
    rng = random.Random(s.seed)
    sample = [rng.randint(s.min_delay_ms, s.max_delay_ms) for _ in range(20_000)]
    from rmqdelay import parse_duration_us

    named_ms = parse_duration_us(s.named_tier) // 1000
    results: dict[str, Any] = {"plain_limit_per_s": limit_rate, "configs": {}}
    for label, radix, named in configs:
        peer = _rmq(suite, radix=radix, named_tiers=named)
        entry: dict[str, Any] = {
            "radix": radix,
            "named_tiers": named,
            "design": peer.description,
            "tiers": len(peer.settings_layout().tiers),  # type: ignore[attr-defined]
            "planned_mean_hops_workload": round(planned_hops(radix, named, sample), 4),
            "planned_hops_named_delay": planned_hops(radix, named, [named_ms]),
        }

        async def body(p: Peer, entry: dict[str, Any] = entry, label: str = label) -> None:
            _say(f"radix: {label} at {s.radix_rate:g}/s x {s.repeats}")
            summary, _ = await steady_repeats(p, s.steady_sizes(s.radix_rate), s.repeats, "rx-")
            entry["steady"] = summary
            if limit_rate and s.radix_saturation_repeats:
                offered = round(limit_rate)
                _say(f"radix: {label} saturation at {offered}/s x {s.radix_saturation_repeats}")
                sizes = s.steady_sizes(offered, s.saturation_duration_s, drain_slack_s=120.0)
                sat, _ = await steady_repeats(p, sizes, s.radix_saturation_repeats, "rxs-")
                sat["ratio_to_plain_limit"] = _ratio(sat["delivered_per_s"], limit_rate)
                entry["saturation"] = sat

        def factory(peer: Peer = peer) -> Peer:
            return peer

        await with_peer(factory, body)
        results["configs"][label] = entry
    ref = results["configs"].get("radix 16", {})
    for entry in results["configs"].values():
        entry["ratio_to_radix16"] = {
            "p50_ms": _ratio(entry["steady"]["p50_ms"], ref.get("steady", {}).get("p50_ms")),
            "p99_ms": _ratio(entry["steady"]["p99_ms"], ref.get("steady", {}).get("p99_ms")),
            "mean_hops": _ratio(
                entry["steady"]["mean_hops"], ref.get("steady", {}).get("mean_hops")
            ),
            "saturation_delivered_per_s": _ratio(
                (entry.get("saturation") or {}).get("delivered_per_s"),
                (ref.get("saturation") or {}).get("delivered_per_s"),
            ),
        }
    params = {
        **_steady_params(s),
        "rate": s.radix_rate,
        "radixes": list(s.radixes),
        "named_tier": s.named_tier,
        "saturation_repeats": s.radix_saturation_repeats,
    }
    suite.write("radix", params, results)


async def workload_seeds(suite: Suite) -> None:
    s = suite.sizes
    names = [n for n in s.peers if n != "plain"]
    results: dict[str, Any] = {}
    for name in names:
        _say(f"seeds: {name}")
        factory = _factory(suite, name)
        probe = factory()
        try:
            entry = await scenario_seeds(factory, s.drain_slack_s)
        except Exception as exc:
            entry = {"error": f"{exc.__class__.__name__}: {exc}"}
        results[name] = {"name": probe.name, "description": probe.description, **entry}
    suite.write("seeds", {"delays_ms": [5000, 4000, 3000, 2000, 1000]}, results)


def _factory(suite: Suite, name: str) -> Callable[[], Peer]:
    s = suite.sizes
    if name.startswith("rmqdelay"):
        publisher = "sync" if name.endswith("-sync") else "async"
        return lambda: _rmq(suite, publisher=publisher)
    return lambda: make_peer(name, url=suite.url, queue_type=s.queue_type)


async def workload_peers(suite: Suite) -> None:
    s = suite.sizes
    results: dict[str, Any] = {"designs": {}}
    pub_sizes = Sizes(
        n_publish=s.peer_n_publish, warmup=s.peer_warmup, repeats=s.repeats, seed=s.seed
    )
    steady = s.steady_sizes(s.peer_rate)
    for name in s.peers:
        factory = _factory(suite, name)
        probe = factory()
        entry: dict[str, Any] = {
            "name": probe.name,
            "description": probe.description,
            "supports_delay": probe.supports_delay,
        }
        _say(f"peers: {name} publish rate ({s.peer_n_publish} x {s.repeats})")
        try:
            entry["publish_rate"] = await scenario_publish_rate(factory, pub_sizes, drain=False)
        except Exception as exc:
            entry["publish_rate"] = {"error": f"{exc.__class__.__name__}: {exc}"}
        _say(f"peers: {name} steady at {s.peer_rate:g}/s x {s.peer_repeats}")
        if probe.supports_delay:
            sizes = steady
        else:  # the plain queue ignores delays: its "lateness" is latency at the same rate
            sizes = s.steady_sizes(s.peer_rate, min_delay_ms=0, max_delay_ms=0)

        async def body(p: Peer, sizes: Sizes = sizes) -> dict[str, Any]:
            summary, _ = await steady_repeats(p, sizes, s.peer_repeats, "pr-")
            return summary

        try:
            entry["steady"] = await with_peer(factory, body)
        except Exception as exc:
            entry["steady"] = {"error": f"{exc.__class__.__name__}: {exc}"}
        results["designs"][name] = entry
    _say("peers: extras (plain publish-only, Redis kill -9, dramatiq-style memory)")
    extras_sizes = Sizes(
        n_publish=s.peer_n_publish,
        warmup=s.peer_warmup,
        repeats=s.repeats,
        kill9_n=s.kill9_n,
        memory_n=s.memory_n,
        seed=s.seed,
    )
    results["extras"] = await run_extras(list(s.peers), extras_sizes, suite.url, s.queue_type)
    ref_pub = (results["extras"].get("plain_publish_only") or {}).get("publish_rate_per_s")
    ref_lat = results["designs"].get("plain", {}).get("steady") or {}
    for entry in results["designs"].values():
        pr = entry.get("publish_rate") or {}
        entry["publish_ratio_to_plain"] = _ratio(pr.get("publish_rate_per_s"), ref_pub)
        st = entry.get("steady") or {}
        entry["lateness_ratio_to_plain_latency"] = {
            k: _ratio(st.get(k), ref_lat.get(k)) for k in ("p50_ms", "p99_ms", "max_ms")
        }
    params = {
        **_steady_params(s),
        "peers": list(s.peers),
        "rate": s.peer_rate,
        "steady_repeats": s.peer_repeats,
        "publish_n": s.peer_n_publish,
        "publish_warmup": s.peer_warmup,
        "publish_delays_ms": [1000, 20000],
        "kill9_n": s.kill9_n,
        "memory_n": s.memory_n,
        "reference_publish": "plain queue, confirmed publish, no consumer (plain_publish_only)",
        "reference_lateness": "plain queue publish-to-consume latency at the same rate",
    }
    suite.write("peers", params, results)


async def workload_scale(suite: Suite) -> None:
    from bench.scale import run_scale

    s = suite.sizes
    if s.scale_messages <= 0:
        _say("scale: skipped (--scale-messages 0)")
        return
    _say(f"scale: {s.scale_messages:,} pending delayed messages")
    result = await run_scale(
        suite.url,
        messages=s.scale_messages,
        chunk=s.scale_chunk,
        publisher=s.scale_publisher,
        margin_s=s.scale_margin_s,
    )
    suite.write("scale", dict(result["params"]), result)


async def workload_startup(suite: Suite) -> None:
    """CLI and import start-up in fresh processes (:mod:`bench.startup`)."""
    from bench.startup import main as startup_main

    out = suite.out / "startup.json"
    argv = ["--url", suite.url, "--out", str(out)]
    if await asyncio.to_thread(startup_main, argv) != 0:
        raise RuntimeError("bench.startup failed")


async def workload_engine43(suite: Suite) -> None:
    """The tiers against RabbitMQ 4.3's one-queue deferred engine (:mod:`bench.engine43`):
    on ``BENCH_RMQ43_URL``, else the suite's broker; skipped, saying why, below 4.3.
    ``BENCH_RMQ43_PRIVATE=1`` runs it on a 4.3 node of its own (and adds the restart)."""
    from bench.engine43 import main as engine43_main

    argv = ["--url", os.environ.get("BENCH_RMQ43_URL", "").strip() or suite.url]
    argv += ["--out", str(suite.out / "engine43.json")]
    if os.environ.get("BENCH_RMQ43_PRIVATE", "").strip() == "1":
        argv.append("--private-node")
    argv += suite.sizes.engine43_args
    if await asyncio.to_thread(engine43_main, argv) != 0:
        raise RuntimeError("bench.engine43 failed")


async def workload_list(suite: Suite) -> None:
    """``scheduled list`` against a raw read of its stream (:mod:`bench.scheduled_list`)."""
    from bench.scheduled_list import main as list_main

    s = suite.sizes
    argv = ["--url", suite.url, "--out", str(suite.out / "list.json")]
    argv += ["--messages", str(s.list_messages), "--repeats", str(s.repeats)]
    if await asyncio.to_thread(list_main, argv) != 0:
        raise RuntimeError("bench.scheduled_list failed")


async def workload_index(suite: Suite) -> None:
    """The dashboard's first page against ``scheduled list --limit 50``
    (:mod:`bench.schedule_index`)."""
    from bench.schedule_index import main as index_main

    s = suite.sizes
    argv = ["--url", suite.url, "--out", str(suite.out / "index.json")]
    argv += ["--messages", str(s.index_messages), "--repeats", str(s.repeats)]
    if await asyncio.to_thread(index_main, argv) != 0:
        raise RuntimeError("bench.schedule_index failed")


async def workload_history(suite: Suite) -> None:
    """Every reader of the journal against its history (:mod:`bench.history`)."""
    from bench.history import main as history_main

    s = suite.sizes
    argv = ["--url", suite.url, "--out", str(suite.out / "history.json")]
    argv += ["--history", s.history, "--pending", s.history_pending, "--repeats", str(s.repeats)]
    if await asyncio.to_thread(history_main, argv) != 0:
        raise RuntimeError("bench.history failed")


async def workload_purge(suite: Suite) -> None:
    """Selective purge: a tenth of ``purge_pending`` cancelled by filter (:mod:`bench.purge`)."""
    from bench.purge import main as purge_main

    s = suite.sizes
    argv = ["--url", suite.url, "--out", str(suite.out / "purge.json")]
    argv += ["--pending", str(s.purge_pending), "--repeats", str(s.repeats)]
    if await asyncio.to_thread(purge_main, argv) != 0:
        raise RuntimeError("bench.purge failed")


async def workload_hops(suite: Suite) -> None:
    """Broker CPU per delivered message and lateness at the default layout and with the
    destination held, against the plain queue and the broker alone doing the hops
    (:class:`bench.peers.hopchain.HopChainPeer`), at each of ``hops_rates``.

    Each round runs every config once at each rate, so the machine's drift hits all of them;
    medians over the rounds. The chains' CPU per message is a line in the hop count: its
    slope is one TTL dead-letter hop, and the 1-hop chain + (a design's mean hops - 1) x
    that slope is the floor any TTL-tier design with those hops pays on this broker, every
    hop through one queue (the physical limit).
    """
    from bench.peers.hopchain import HopChainPeer
    from bench.peers.plain import PlainPeer

    s = suite.sizes

    def delayed(rate: float) -> Sizes:
        return s.steady_sizes(rate, s.hops_duration_s)

    def fixed(rate: float) -> Sizes:
        d = s.hops_chain_delay_ms
        return s.steady_sizes(rate, s.hops_duration_s, min_delay_ms=d, max_delay_ms=d)

    def chain(hops: int, spread: int = 1) -> Callable[[], Peer]:
        d = s.hops_chain_delay_ms
        return lambda: HopChainPeer(suite.url, s.queue_type, hops=hops, delay_ms=d, spread=spread)

    plain = zero_delay(s, s.hops_duration_s)
    configs: list[Config] = [("plain", lambda: PlainPeer(suite.url, s.queue_type), plain)]
    configs += [(f"chain{k}", chain(k), fixed) for k in s.hops_chain]
    if s.hops_spread > 1:
        configs.append((f"chain1s{s.hops_spread}", chain(1, s.hops_spread), fixed))
    configs.append(("rmqdelay", lambda: _rmq(suite), delayed))
    configs.append(("held", lambda: _rmq(suite, held=True), delayed))
    configs.append(("held-narrow", lambda: _rmq(suite, held=True, hold_window=NARROW), delayed))
    table, descriptions = await side_by_side(configs, s.hops_rates, s.hops_repeats, "hops")
    results: dict[str, Any] = {"rates": {}, "descriptions": descriptions}
    for rate, by_name in table.items():
        names = ("rmqdelay", "held", "held-narrow")
        floors = {name: hops_floor(s.hops_chain, by_name, name) for name in names}
        results["rates"][rate] = {"configs": by_name, "floors": floors}
    params = {
        "rates": list(s.hops_rates),
        "rate": s.hops_rates[-1],
        "duration_s": s.hops_duration_s,
        "rounds": s.hops_repeats,
        "delays_ms": [s.min_delay_ms, s.max_delay_ms],
        "chain_hops": list(s.hops_chain),
        "chain_delay_ms": s.hops_chain_delay_ms,
        "spread": s.hops_spread,
        "layout": "the default (radix 16, resolution 10 ms, quorum, journal on); held: the "
        "same with the destination held (hold window 5.12 s); held-narrow: the window of "
        "2026-11 (2.56 s), where a delay of 2.56 to 4 s takes one hop",
        "worker_concurrency": s.worker_concurrency,
        "worker_prefetch": s.worker_prefetch,
    }
    suite.write("hops", params, results)


def hops_floor(
    chain_hops: Sequence[int], configs: dict[str, dict[str, Any]], name: str
) -> dict[str, Any] | None:
    """The broker CPU any TTL-tier design with ``name``'s mean hops pays: the 1-hop chain
    + (mean hops - 1) x one hop's cost (the chains' slope)."""
    plain_cpu = configs["plain"]["cpu_us_per_msg"].get("broker_net")
    chain = sorted(
        (k, configs[f"chain{k}"]["cpu_us_per_msg"].get("broker_net")) for k in chain_hops
    )
    if name not in configs or len(chain) < 2 or any(c is None for _, c in chain) or not plain_cpu:
        return None
    (k0, c0), (k1, c1) = chain[0], chain[-1]
    assert c0 is not None and c1 is not None
    per_hop = (c1 - c0) / (k1 - k0)
    hops = configs[name].get("mean_hops") or 0.0
    floor = c0 + (hops - k0) * per_hop
    return {
        "per_hop_us": round(per_hop, 1),
        "mean_hops": hops,
        "broker_us_per_msg": round(floor, 1),
        "ratio_to_plain": _ratio(floor, plain_cpu),
        "how": f"chain{k0} + (mean hops - {k0}) x (chain{k1} - chain{k0}) / {k1 - k0}",
    }


async def workload_long(suite: Suite) -> None:
    from bench.held import run_long

    await run_long(suite)


async def workload_layout(suite: Suite) -> None:
    from bench.held import run_layout

    await run_layout(suite)


WORKLOAD_FUNCS: dict[str, Callable[[Suite], Awaitable[None]]] = {
    "startup": workload_startup,
    "list": workload_list,
    "index": workload_index,
    "history": workload_history,
    "purge": workload_purge,
    "publish": workload_publish,
    "e2e": workload_e2e,
    "radix": workload_radix,
    "hops": workload_hops,
    "peers": workload_peers,
    "seeds": workload_seeds,
    "scale": workload_scale,
    "engine43": workload_engine43,
    "long": workload_long,
    "layout": workload_layout,
}


# ---------------------------------------------------------------- CLI


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="small sizes; bench/results/quick/")
    p.add_argument("--only", help=f"comma list of workloads ({','.join(WORKLOADS)})")
    p.add_argument("--skip", help="comma list of workloads to leave out")
    p.add_argument("--repeats", type=int, help="runs per timing (median reported)")
    p.add_argument("--scale-messages", type=int, help="pending messages; 0 skips scale")
    p.add_argument("--scale-publisher", choices=("sync", "async"))
    p.add_argument("--rates", help="e2e rates per second, comma list (default 250,500,1000)")
    p.add_argument("--duration", type=float, help="e2e: seconds of due messages a run (default 4)")
    p.add_argument("--hops-rates", help="hops rates per second, comma list (default 250,500)")
    p.add_argument("--hops-rounds", type=int, help="rounds of the hops workload (default 2)")
    p.add_argument("--hops-duration", type=float, help="seconds per hops run (default 30)")
    p.add_argument(
        "--hops-spread", type=int, help="hops: also 1 hop spread over N queues (default off)"
    )
    p.add_argument(
        "--long-delays", help="long: shortest,longest delay (default 10m,1h; e.g. 10m,12m)"
    )
    p.add_argument("--long-rate", type=float, help="long: messages due per second (default 5)")
    p.add_argument(
        "--long-duration", type=float, help="long: seconds over which they fall due (default 120)"
    )
    p.add_argument("--layout-rounds", type=int, help="rounds of the layout workload (default 2)")
    p.add_argument("--layout-duration", type=float, help="seconds per layout run (default 30)")
    p.add_argument("--peers", help=f"designs for seeds/peers (default all): {','.join(PEER_NAMES)}")
    p.add_argument("--worker", choices=("subprocess", "inproc"), help="where the Worker runs")
    p.add_argument("--url", default=DEFAULT_AMQP_URL, help="AMQP URL (env: BENCH_AMQP_URL)")
    p.add_argument("--out", type=Path, help="results dir (default bench/results[/quick])")
    p.add_argument(
        "--no-report", action="store_true", help="do not redraw plots and the Performance page"
    )
    return p.parse_args(argv)


def sizes_from(args: argparse.Namespace) -> SuiteSizes:
    sizes = SuiteSizes.quick() if args.quick else SuiteSizes()
    if args.repeats is not None:
        sizes.repeats = args.repeats
        sizes.peer_repeats = args.repeats
    if args.scale_messages is not None:
        sizes.scale_messages = args.scale_messages
    if args.scale_publisher:
        sizes.scale_publisher = args.scale_publisher
    if args.rates:
        sizes.rates = _floats(args.rates)
    if args.peers:
        names = tuple(n.strip() for n in args.peers.split(",") if n.strip())
        for n in names:
            if n not in PEER_NAMES:
                raise SystemExit(f"unknown peer {n!r}; known: {', '.join(PEER_NAMES)}")
        sizes.peers = names
    if args.worker:
        sizes.worker = args.worker
    if args.duration is not None:
        sizes.duration_s = args.duration
    if args.hops_rates:
        sizes.hops_rates = _floats(args.hops_rates)
    if args.long_delays:
        sizes.long_delays_ms = _delay_range(args.long_delays)
    for name in ("long_rate", "long_duration", "layout_rounds", "layout_duration"):
        value = getattr(args, name)
        if value is not None:
            field_name = name.replace("duration", "duration_s")
            setattr(sizes, field_name, value)
    if args.hops_rounds is not None:
        sizes.hops_repeats = args.hops_rounds
    if args.hops_duration is not None:
        sizes.hops_duration_s = args.hops_duration
    if args.hops_spread is not None:
        sizes.hops_spread = args.hops_spread
    return sizes


def _delay_range(text: str) -> tuple[int, int]:
    """``10m,1h`` as milliseconds, shortest first."""
    from rmqdelay import parse_duration_us

    parts = [p.strip() for p in text.split(",")]
    try:
        low, high = (parse_duration_us(p) // 1000 for p in parts)
    except ValueError as exc:
        raise SystemExit(f"--long-delays wants two durations, like 10m,1h: {exc}") from None
    if not 0 < low <= high:
        raise SystemExit(f"--long-delays {text}: the first must be positive, and not the longer")
    return int(low), int(high)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(r) for r in text.split(",") if r.strip())


def selected(args: argparse.Namespace) -> list[str]:
    default = [w for w in WORKLOADS if w not in OPT_IN]
    chosen = [w.strip() for w in args.only.split(",")] if args.only else default
    skip = {w.strip() for w in args.skip.split(",")} if args.skip else set()
    for w in [*chosen, *skip]:
        if w and w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w!r}; known: {', '.join(WORKLOADS)}")
    return [w for w in WORKLOADS if w in chosen and w not in skip]


async def run_suite(suite: Suite, workloads: list[str]) -> dict[str, Any]:
    suite.machine = machine_info()
    suite.broker = await broker_info(suite.url)
    status: dict[str, Any] = {}
    for name in workloads:
        started = time.perf_counter()
        suite.load_before = await asyncio.to_thread(machine_load)
        _say(
            f"{name}: machine busy {suite.load_before['busy_percent']}% of all cores over "
            f"{suite.load_before['window_s']} s before it (load {suite.load_before['loadavg']})"
        )
        try:
            await WORKLOAD_FUNCS[name](suite)
            status[name] = {"ok": True}
        except Exception as exc:  # one failing workload must not sink the others
            _say(f"{name}: FAILED {exc.__class__.__name__}: {exc}")
            status[name] = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
        status[name]["seconds"] = round(time.perf_counter() - started, 1)
        _say(f"{name}: {status[name]['seconds']} s")
    return status


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    sizes = sizes_from(args)
    workloads = selected(args)
    out = args.out or (RESULTS_DIR / "quick" if args.quick else RESULTS_DIR)
    suite = Suite(
        url=args.url, sizes=sizes, out=out, command=masked(["python", "-m", "bench", *argv])
    )

    async def runner() -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        # SIGTERM cancels the run, so every peer's teardown still runs (finally blocks).
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await run_suite(suite, workloads)

    started = time.perf_counter()
    try:
        status = asyncio.run(runner())
    except (asyncio.CancelledError, KeyboardInterrupt):
        _say("interrupted; everything that was set up has been torn down")
        return 130
    total = round(time.perf_counter() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "suite.json").write_text(
        json.dumps(
            {
                "command": suite.command,
                "workloads": status,
                "total_seconds": total,
                "sizes": asdict(sizes),
                "finished_at_ms": now_ms(),
            },
            indent=1,
            default=_json_default,
        )
        + "\n",
        encoding="utf-8",
    )
    _say(
        f"suite done in {total} s: "
        + ", ".join(f"{k} {'ok' if v['ok'] else 'FAILED'}" for k, v in status.items())
    )
    if not args.no_report:
        from bench import report

        report.main(["--results", str(out), *([] if not args.quick else ["--no-page"])])
    return 0 if all(v["ok"] for v in status.values()) else 1


__all__ = ["WORKLOADS", "SuiteSizes", "main"]
