"""The tiers against the one-queue deferred engine of RabbitMQ 4.3, side by side in one run.

    python -m bench.engine43                              # the README's figures (~12 min)
    python -m bench.engine43 --rates 50,250 --duration 10 --repeats 1 --memory 20000
    python -m bench.engine43 --private-node               # a 4.3 node of its own (restart)

Two designs on the same node, same destination, same drain (the real ``rmqdelay.Worker``
in its own process, journal off), alternating rounds, medians:

- ``tiers``: rmqdelay as it is: ``TopologyManager`` + ``AsyncPublisher.publish_many``
  through the radix-16 tiers (:class:`bench.peers.rmqdelay_peer.RmqdelayPeer`).
- ``deferred``: one quorum queue; a qpid-proton AMQP 1.0 scheduler process defers each
  early message to its due time (``modified`` + ``x-opt-delivery-time``) and forwards due
  ones, confirmed, to the work queue (:mod:`bench.peers.deferred43`). Its receive times
  also give the figures of a worker that would consume the deferred queue itself
  (``at_scheduler``: no forward hop).

Parts:

- ``load``: messages due at a steady rate (``--rates``) for ``--duration`` s, delays
  uniform in 1-4 s: lateness p50/p99/max, early, missing, and CPU per delivered message
  of the broker (``beam.smp``, less its background just before), the Worker and the
  scheduler. Where do they cross?
- ``memory``: ``--memory`` messages waiting (due in 30 min): the node's memory growth per
  waiting message (Erlang total, and the process RSS), and for ``deferred`` how fast the
  scheduler defers them (the rate a burst is taken in).
- ``restart`` (``--private-node`` only: it stops the node): ``--restart-count`` messages
  due 25-35 s ahead, all waiting; the node is stopped and started; missing, early,
  duplicates and lateness after it.
- ``failover`` (``--failover N``): N messages waiting in a 3-node 4.3 cluster of its own
  (``rmqd-e43-1..3``, AMQP :5731-5733, from the rmq43 chroot; left running); node 2, the
  deferred queue's leader and the leader of a third of the tiers, is killed (SIGKILL)
  with the clients on node 1; missing, early, duplicates, lateness; node 2 is started again.

Needs RabbitMQ 4.3+ with its management API: ``BENCH_RMQ43_URL`` (and
``BENCH_RMQ43_MANAGEMENT_URL``), else ``BENCH_AMQP_URL``/``RMQDELAY_URL``; on an older
broker it prints why and writes nothing (``make bench`` goes on). ``--private-node``
starts a node of its own from the rmq43 chroot (``rmqd-engine@localhost``, AMQP :5695,
management :15695; needs root) and stops it after. Results:
``bench/results/engine43.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from bench.common import (
    DEFAULT_AMQP_URL,
    CpuMeter,
    Management,
    Record,
    broker_info,
    broker_pid,
    idle_cpu_rate,
    lateness_stats,
    machine_info,
    machine_load,
    masked,
    now_ms,
)
from bench.peers.deferred43 import DeferredPeer
from bench.peers.rmqdelay_peer import RmqdelayPeer
from bench.scenarios_peers import Sizes, steady_run
from rmqdelay import Settings, mask_url

RESULTS = Path(__file__).resolve().parent / "results" / "engine43.json"
DESIGNS = ("tiers", "deferred")
PRIVATE_PORT = 5695
MEMORY_DUE_S = 1800


def rmq43_url() -> str:
    return (
        os.environ.get("BENCH_RMQ43_URL", "").strip()
        or os.environ.get("BENCH_AMQP_URL", "").strip()
        or DEFAULT_AMQP_URL
    )


def _api(url: str, management: str | None) -> Management:
    api = Management(url)
    if management:
        api.base = management.rstrip("/")
    return api


def make_peer(design: str, url: str) -> RmqdelayPeer:
    """A fresh peer of *design*; the tiers without their journal (the engine keeps none)."""
    if design == "deferred":
        return DeferredPeer(url)
    peer = RmqdelayPeer(url, "quorum", label="tiers")
    peer.settings_kwargs["schedule_journal"] = False
    peer.settings = Settings(**peer.settings_kwargs)
    return peer


async def version_of(url: str) -> tuple[tuple[int, ...], dict[str, Any]]:
    info = await broker_info(url)
    parts = str(info.get("version", "0")).split(".")[:2]
    return tuple(int(p) for p in parts if p.isdigit()), info


# ---------------------------------------------------------------- load


async def one_load(
    design: str, url: str, rate: float, duration: float, pid: int | None
) -> dict[str, Any]:
    peer = make_peer(design, url)
    sizes = Sizes(rate=rate, duration_s=duration, min_delay_ms=1000, max_delay_ms=4000)
    await peer.setup()
    try:
        background = await idle_cpu_rate(pid)
        with CpuMeter({"broker": pid, **peer.cpu_pids()}) as cpu:
            summary, _records = await steady_run(peer, sizes, tag=f"{design}-{int(rate)}")
    finally:
        await peer.teardown()
    n = max(1, summary["received"])
    out: dict[str, Any] = {
        **{
            k: summary["stats"][k]
            for k in ("count", "missing", "early", "p50_ms", "p99_ms", "max_ms")
        },
        "duplicates": peer.arrivals.duplicates,
    }
    for name in ("broker", "worker", "scheduler"):
        used = cpu.result.get(f"{name}_cpu_s")
        if name == "broker" and used is not None and background is not None:
            used -= background * cpu.result["wall_s"]
        out[f"{name}_cpu_ms_per_msg"] = None if used is None else round(used / n * 1000, 3)
    if isinstance(peer, DeferredPeer):
        sched = lateness_stats(getattr(peer, "sched_records", []), expected=summary["n"])
        out["at_scheduler"] = {
            k: sched.to_dict()[k] for k in ("early", "p50_ms", "p99_ms", "max_ms")
        }
        out["deferrals"] = peer.deferrals
    else:
        out["mean_hops"] = peer.counters()["mean_hops"]
    return out


# ---------------------------------------------------------------- memory


def node_memory(api: Management, pid: int | None) -> dict[str, Any]:
    node = api.get("overview?columns=node")["node"]
    memory = api.get(f"nodes/{quote(node, safe='')}/memory")["memory"]
    rss = None
    if pid is not None:
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as fh:
                rss = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return {"erlang": memory.get("total", {}).get("erlang"), "rss": rss}


async def one_memory(
    design: str, url: str, api: Management, n: int, pid: int | None
) -> dict[str, Any]:
    peer = make_peer(design, url)
    await peer.setup()
    try:
        await asyncio.sleep(2)
        before = node_memory(api, pid)
        started = time.monotonic()
        chunk = 5000
        for i in range(0, n, chunk):
            batch = [(f"mem-{j}", MEMORY_DUE_S * 1000) for j in range(i, min(n, i + chunk))]
            await peer.publish(batch)
        published_s = time.monotonic() - started
        deferred_s = None
        if isinstance(peer, DeferredPeer):
            deadline = time.monotonic() + 600
            while peer.deferrals < n and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            deferred_s = time.monotonic() - started
        await asyncio.sleep(5)  # let the node settle (WAL flushed, memory reported)
        after = node_memory(api, pid)
    finally:
        await peer.teardown()
    out: dict[str, Any] = {
        "waiting": n,
        "publish_per_s": round(n / published_s, 1),
        **{
            f"{k}_bytes_per_msg": None
            if before[k] is None or after[k] is None
            else round((after[k] - before[k]) / n, 1)
            for k in ("erlang", "rss")
        },
    }
    if deferred_s is not None:
        out["deferred_all"] = peer.deferrals >= n  # type: ignore[attr-defined]
        out["deferred_per_s"] = round(n / deferred_s, 1)
    return out


# ---------------------------------------------------------------- restart


async def one_restart(design: str, node: Any, n: int) -> dict[str, Any]:
    """n messages due 25-35 s ahead, all waiting; the node stopped and started; then drain.
    The Worker reconnects by itself; the scheduler is started again."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from brokers.debian import start_node, stop_node

    url = node.url
    peer = make_peer(design, url)
    await peer.setup()
    try:
        t0 = now_ms() + 25_000
        items = [(f"rs-{i}", t0 - now_ms() + i * 10_000 // n) for i in range(n)]
        await peer.publish(items)
        if isinstance(peer, DeferredPeer):
            while peer.deferrals < n:
                await asyncio.sleep(0.05)
        stopped_at = time.monotonic()
        await asyncio.to_thread(stop_node, node)
        await asyncio.to_thread(start_node, node, 120)
        down_s = time.monotonic() - stopped_at
        if isinstance(peer, DeferredPeer):
            await peer.restart_scheduler()
        records: list[Record] = await peer.drain([i for i, _ in items], 90)
    finally:
        await peer.teardown()
    stats = lateness_stats(records, expected=n).to_dict()
    return {
        "down_s": round(down_s, 1),
        **{k: stats[k] for k in ("count", "missing", "early", "p50_ms", "p99_ms", "max_ms")},
        "duplicates": peer.arrivals.duplicates,
    }


async def one_failover(design: str, urls: list[str], n: int) -> dict[str, Any]:
    """n messages due 25-35 s ahead, all waiting, in a 3-node cluster of its own; node 2
    (the deferred queue's leader, the leader of a third of the tiers) is killed (SIGKILL),
    the clients staying on node 1; then drain, and node 2 is started again."""
    from brokers import cluster

    peer = make_peer(design, urls[0])
    if isinstance(peer, DeferredPeer):
        peer.leader_url = urls[1]  # declared there with client-local: node 2 leads it
    await peer.setup()
    killed = False
    try:
        t0 = now_ms() + 25_000
        items = [(f"fo-{i}", t0 - now_ms() + i * 10_000 // n) for i in range(n)]
        await peer.publish(items)
        if isinstance(peer, DeferredPeer):
            while peer.deferrals < n:
                await asyncio.sleep(0.05)
        killed = False
        await asyncio.to_thread(cluster.kill, 1)
        killed = True
        records: list[Record] = await peer.drain([i for i, _ in items], 90)
        stats = lateness_stats(records, expected=n).to_dict()
        result = {
            **{k: stats[k] for k in ("count", "missing", "early", "p50_ms", "p99_ms", "max_ms")},
            "duplicates": peer.arrivals.duplicates,
        }
        print(f"failover {design}: {json.dumps(result)}", file=sys.stderr, flush=True)
    finally:
        # node 2 back first: deleting the topology with a member down hung (4.3.6)
        if killed:
            await asyncio.to_thread(cluster.restart, 1)
        await peer.teardown()
    return result


def private_cluster() -> list[str]:
    """Start (or find) a 3-node 4.3 cluster of its own (rmqd-e43-1..3, AMQP :5731-5733,
    management :15731-15733) from the rmq43 chroot; its URLs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from brokers import chroot, cluster

    cluster.FLAVOURS["engine43"] = cluster.Flavour(
        "4.3", ("rmqd-e43-1", "rmqd-e43-2", "rmqd-e43-3"), 5731,
        Path("/var/lib/rmqdelay-engine-cluster"), release=chroot.RELEASES["rmq43"],
    )  # fmt: skip
    cluster._selected[:] = ["engine43"]
    return cluster.start()


def private_node() -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from brokers import chroot
    from brokers.debian import DebianNode

    rel = chroot.RELEASES["rmq43"]
    chroot.prepare_chroot(rel)
    return DebianNode.scratch(
        Path("/var/lib/rmqdelay-engine"), "rmqd-engine", PRIVATE_PORT,
        management_port=PRIVATE_PORT + 10000, root=rel.root,
    )  # fmt: skip


# ---------------------------------------------------------------- the run


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, dict):
            out[key] = _median([r[key] for r in runs])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [r[key] for r in runs if r.get(key) is not None]
            out[key] = round(statistics.median(values), 3) if values else None
        else:
            out[key] = value
    return out


async def measure(
    args: argparse.Namespace, url: str, management: str | None, node: Any
) -> dict[str, Any]:
    version, info = await version_of(url)
    if version < (4, 3):
        return {"skipped": f"RabbitMQ {info.get('version')} at {mask_url(url)}: the deferred "
                "engine needs 4.3 or later (set BENCH_RMQ43_URL)", "broker": info}  # fmt: skip
    pid = broker_pid(url)
    api = _api(url, management)
    designs = tuple(d for d in args.designs.split(",") if d)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}

    def note(label: str, design: str, result: dict[str, Any]) -> None:
        runs.setdefault(label, {}).setdefault(design, []).append(result)
        print(f"{label} {design}: {json.dumps(result)}", file=sys.stderr, flush=True)

    for rate in [float(r) for r in args.rates.split(",") if r]:
        for round_ in range(args.repeats):
            for design in designs if round_ % 2 == 0 else designs[::-1]:
                note(
                    f"load.r{int(rate)}",
                    design,
                    await one_load(design, url, rate, args.duration, pid),
                )
    if args.memory:
        for design in designs:
            note("memory", design, await one_memory(design, url, api, args.memory, pid))
    if node is not None and args.restart_count:
        for design in designs:
            note("restart", design, await one_restart(design, node, args.restart_count))
    if args.failover:
        urls = await asyncio.to_thread(private_cluster)
        for design in designs:
            note("failover", design, await one_failover(design, urls, args.failover))
    medians = {label: {d: _median(rs) for d, rs in by.items()} for label, by in runs.items()}
    return {"broker": info, "runs": runs, "medians": medians}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a RabbitMQ 4.3+ (default: BENCH_RMQ43_URL...)")
    parser.add_argument("--management", default=os.environ.get("BENCH_RMQ43_MANAGEMENT_URL"))
    parser.add_argument("--private-node", action="store_true", help="start a 4.3 node of its own")
    parser.add_argument("--designs", default=",".join(DESIGNS))
    parser.add_argument("--rates", default="50,250,500,1000", help="messages due per second")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of due messages")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", type=int, default=100_000, help="messages waiting (0: skip)")
    parser.add_argument("--restart-count", type=int, default=2000)
    parser.add_argument(
        "--failover", type=int, default=0,
        help="messages waiting when a leader is killed, in a 3-node cluster of its own (0: skip)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.getLogger("rmqdelay").setLevel(logging.ERROR)
    node = None
    url = args.url or rmq43_url()
    management = args.management
    if args.private_node:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
        from brokers.debian import start_node, stop_node

        node = private_node()
        start_node(node, 120)
        url, management = node.url, f"http://127.0.0.1:{PRIVATE_PORT + 10000}"
    load = machine_load()
    try:
        results = asyncio.run(measure(args, url, management, node))
    finally:
        if node is not None:
            stop_node(node)
    if "skipped" in results:
        print(f"bench.engine43 skipped: {results['skipped']}", flush=True)
        return 0
    parameters = {**vars(args), "url": mask_url(url), "out": str(args.out)}
    document = {  # the suite's shape (bench.suite.Suite.write), so bench.keys reads it
        "workload": "engine43",
        "generated_at_ms": now_ms(),
        "when": datetime.now(timezone.utc).isoformat(),
        "command": masked(["python", "-m", "bench.engine43", *(argv or sys.argv[1:])]),
        "machine": machine_info(),
        "broker": results.pop("broker"),
        "load_before": load,
        "params": parameters,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1, default=str) + "\n")
    for label, by_design in results["medians"].items():
        for design, m in by_design.items():
            print(f"{label:>12} {design:>9}: {json.dumps(m)}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
