"""Scale: fill the tiers to N pending delayed messages, watch what it costs, drain them all.

    python -m bench --only scale --scale-messages 1000000

1. A fresh rmqdelay topology (quorum, radix 16, 10 ms) and its Worker (own process).
2. Reference, in the same run: raw aio-pika confirmed publish into one plain quorum queue
   (the same as the ``publish`` workload), ``ref_chunks`` chunks before the fill.
3. Fill: ``messages`` delayed messages in chunks of ``chunk``, with ``publish_many``
   (pipelined confirms). Every message is due at ``T = fill start + estimated fill time +
   margin`` (and never sooner than ``margin`` after it is published), so nothing moves
   between tiers while the fill runs and everything falls due shortly after it ends. The
   rate of every chunk is kept, so the rate can be read as a function of pending messages.
4. Snapshots at 0, every tenth, and N pending: the broker's memory (``/api/nodes/<node>/
   memory``, live: total RSS, Erlang total and the quorum-queue parts), ``mem_used``,
   ``disk_free``, the size of the node's quorum data directory (``du``-like, when
   readable), the beam process RSS, and our queues' message counts.
5. The reference again, now with N messages pending.
6. Drain: wait for T; the Worker receives everything; count unique ids, duplicates and
   missing; drain rate = delivered / (last received - first due).

The broker is shared: node-wide figures include other tenants. Our share is the difference
from the snapshot at 0 pending, which is taken right before the fill.
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any
from urllib.parse import quote

from bench.common import (
    DEFAULT_AMQP_URL,
    CpuMeter,
    Management,
    broker_pid,
    idle_cpu_rate,
    lateness_stats,
    now_ms,
)
from bench.measures import raw_aio_pika_many
from bench.peers.rmqdelay_peer import RmqdelayPeer

RABBIT_DATA = os.environ.get("BENCH_RABBIT_DATA", "/var/lib/rabbitmq/mnesia")


class ScaleApi(Management):
    """The few management API reads the scale workload needs (credentials from the URL)."""

    def __init__(self, amqp_url: str, timeout: float = 30.0) -> None:
        super().__init__(amqp_url, timeout=timeout)
        self._node: str | None = None

    @property
    def node(self) -> str:
        if self._node is None:
            self._node = str(self.get("overview?columns=node")["node"])
        return self._node

    def backlog(self, prefix: str) -> dict[str, int]:
        """Messages in our tier queues and in our work queue (management stats: ~5 s old)."""
        queues = self.get(f"queues/{quote(self.vhost, safe='')}?columns=name,messages")
        out = {"tiers": 0, "work": 0}
        for q in queues:
            name = str(q.get("name", ""))
            if name.startswith(prefix + ".tier."):
                out["tiers"] += int(q.get("messages") or 0)
            elif name.startswith(prefix + ".work."):
                out["work"] += int(q.get("messages") or 0)
        return out

    def snapshot(self, prefix: str) -> dict[str, Any]:
        node = quote(self.node, safe="")
        memory = self.get(f"nodes/{node}/memory")["memory"]
        info = self.get(f"nodes/{node}?columns=mem_used,disk_free")
        queues = self.get(
            f"queues/{quote(self.vhost, safe='')}?columns=name,messages,memory,message_bytes"
        )
        ours = [q for q in queues if str(q.get("name", "")).startswith(prefix + ".")]
        total = memory.get("total", {})
        return {
            "at_ms": now_ms(),
            "node": self.node,
            "mem_rss_bytes": total.get("rss"),
            "mem_erlang_bytes": total.get("erlang"),
            "mem_used_bytes": info.get("mem_used"),
            "mem_quorum_ets_bytes": memory.get("quorum_ets"),
            "mem_quorum_procs_bytes": memory.get("quorum_queue_procs"),
            "mem_quorum_dlx_procs_bytes": memory.get("quorum_queue_dlx_procs"),
            "mem_binary_bytes": memory.get("binary"),
            "disk_free_bytes": info.get("disk_free"),
            "beam_rss_bytes": beam_rss_bytes(self.node),
            **quorum_dir_bytes(self.node),
            "our_queue_messages_stats": sum(int(q.get("messages") or 0) for q in ours),
            "our_queue_memory_bytes_stats": sum(int(q.get("memory") or 0) for q in ours),
        }


def beam_rss_bytes(node: str) -> int | None:
    """RSS of the broker's beam process, from its pid file and /proc (None if unreadable)."""
    try:
        with open(os.path.join(RABBIT_DATA, f"{node}.pid"), encoding="ascii") as fh:
            pid = int(fh.read().strip())
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def quorum_dir_bytes(node: str) -> dict[str, int | None]:
    """Apparent and allocated bytes of the node's quorum-queue data (WAL + segments)."""
    root = os.path.join(RABBIT_DATA, node, "quorum")
    apparent = allocated = 0
    if not os.path.isdir(root):
        return {"disk_quorum_dir_bytes": None, "disk_quorum_dir_allocated_bytes": None}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue  # a segment removed while walking
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return {"disk_quorum_dir_bytes": apparent, "disk_quorum_dir_allocated_bytes": allocated}


def _progress(msg: str) -> None:
    print(f"    scale: {msg}", file=sys.stderr, flush=True)


async def _reference(url: str, chunks: int, chunk: int, queue_type: str) -> dict[str, Any]:
    rates, cpu = [], []
    for _ in range(chunks):
        run = await raw_aio_pika_many(url, chunk, 500, queue_type)
        rates.append(round(run.rate, 1))
        cpu.append(round(run.cpu / run.count * 1e6, 1))
    return {"rates": rates, "median": statistics.median(rates), "cpu_us_per_msg": cpu}


async def run_scale(
    url: str = DEFAULT_AMQP_URL,
    *,
    messages: int = 1_000_000,
    chunk: int = 10_000,
    publisher: str = "sync",
    window: int = 2000,
    margin_s: float = 45.0,
    ref_chunks: int = 3,
    concurrency: int = 128,
    prefetch: int = 1024,
    drain_stall_s: float = 180.0,
    worker: str = "subprocess",
    queue_type: str = "quorum",
) -> dict[str, Any]:
    chunk = max(1, min(chunk, messages))
    n_chunks = math.ceil(messages / chunk)
    levels = sorted({0, min(100_000, messages), messages} | {messages * k // 10 for k in range(11)})
    api = ScaleApi(url)
    peer = RmqdelayPeer(
        url,
        queue_type,
        publisher=publisher,
        window=window,
        concurrency=concurrency,
        prefetch=prefetch,
        worker=worker,
        label=f"rmqdelay-r16-{publisher}-{queue_type}",
    )
    params = {
        "messages": messages,
        "chunk": chunk,
        "publisher": publisher,
        "window": window,
        "margin_s": margin_s,
        "ref_chunks": ref_chunks,
        "worker_concurrency": concurrency,
        "worker_prefetch": prefetch,
        "worker": worker,
        "queue_type": queue_type,
        "snapshot_levels": levels,
    }
    out: dict[str, Any] = {"params": params, "design": peer.description}
    await peer.setup()
    try:
        _progress(f"reference at 0 pending ({ref_chunks} x {chunk} raw aio-pika)")
        out["reference_at_0"] = await _reference(url, ref_chunks, chunk, queue_type)
        estimate = 0.8 * out["reference_at_0"]["median"]
        snapshots: dict[str, Any] = {"0": await asyncio.to_thread(api.snapshot, peer.prefix)}
        fill_start = now_ms()
        due_at = fill_start + int(messages / estimate * 1000 + margin_s * 1000)
        out["planned_due_at_ms"] = due_at
        chunk_rates: list[dict[str, Any]] = []
        sent = 0
        pids = {"broker": broker_pid(), "client": os.getpid(), **peer.cpu_pids()}
        idle = await idle_cpu_rate(pids["broker"], 2.0)  # the shared broker's background
        out["broker_idle_cpu_per_s"] = None if idle is None else round(idle, 3)
        fill_meter = CpuMeter(pids).__enter__()
        for _ in range(n_chunks):
            size = min(chunk, messages - sent)
            now = now_ms()
            delay = max(due_at, now + int(margin_s * 1000)) - now
            items = [(f"s{sent + i}", delay) for i in range(size)]
            t0, c0 = time.perf_counter(), time.process_time()
            await peer.publish(items)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            sent += size
            chunk_rates.append(
                {
                    "pending_before": sent - size,
                    "pending_after": sent,
                    "rate_per_s": round(size / wall, 1),
                    "client_cpu_us_per_msg": round(cpu / size * 1e6, 1),
                }
            )
            if sent in levels:
                snapshots[str(sent)] = await asyncio.to_thread(api.snapshot, peer.prefix)
                _progress(
                    f"{sent:,} pending, chunk {size / wall:,.0f}/s, broker RSS "
                    f"{(snapshots[str(sent)]['mem_rss_bytes'] or 0) / 2**20:,.0f} MiB"
                )
        fill_end = now_ms()
        fill_meter.__exit__(None, None, None)
        out["fill"] = {
            "cpu": _per_msg(fill_meter.result, messages, None, idle),
            "start_ms": fill_start,
            "end_ms": fill_end,
            "seconds": round((fill_end - fill_start) / 1000, 2),
            "rate_per_s": round(messages / ((fill_end - fill_start) / 1000), 1),
            "chunks": chunk_rates,
            "hops": peer.counters(),
        }
        _progress(f"reference at {messages:,} pending")
        out["reference_at_n"] = await _reference(url, ref_chunks, chunk, queue_type)
        out["snapshots"] = snapshots
        out["at_levels"] = _levels(chunk_rates, snapshots, messages, out)

        # ---- drain
        first_due = due_at
        wait_s = max(0.0, (first_due - now_ms()) / 1000)
        _progress(f"fill took {out['fill']['seconds']} s; due in {wait_s:.0f} s; draining")
        await asyncio.sleep(max(0.0, (first_due - now_ms()) / 1000 - 45))
        drain_meter = CpuMeter(pids).__enter__()  # from 45 s before due: the hops start then
        last_count, last_change = len(peer.arrivals), time.monotonic()
        timeline: list[dict[str, int]] = []
        while len(peer.arrivals) < messages:
            await asyncio.sleep(1.0)
            count = len(peer.arrivals)
            point = {"at_ms": now_ms(), "delivered": count}
            if len(timeline) % 5 == 0:
                point.update(await asyncio.to_thread(api.backlog, peer.prefix))
            timeline.append(point)
            if count != last_count:
                last_count, last_change = count, time.monotonic()
            elif now_ms() > first_due and time.monotonic() - last_change > drain_stall_s:
                _progress(f"no progress for {drain_stall_s:.0f} s at {count:,}; giving up")
                break
        drain_meter.__exit__(None, None, None)
        await asyncio.sleep(2.0)  # let late duplicates, if any, arrive
        records = peer.arrivals.take_all()
        snapshots["after_drain"] = await asyncio.to_thread(api.snapshot, peer.prefix)
        ids = {r.message_id for r in records}
        expected_missing = messages - len(ids & {f"s{i}" for i in range(messages)})
        min_due = min((r.due_at_ms for r in records), default=first_due)
        last = max((r.received_at_ms for r in records), default=now_ms())
        per_second = Counter((r.received_at_ms - min_due) // 1000 for r in records)
        stats = lateness_stats(records, expected=messages).to_dict()
        out["drain"] = {
            "first_due_ms": min_due,
            "last_received_ms": last,
            "delivered_unique": len(ids),
            "missing": expected_missing,
            "duplicates": peer.arrivals.duplicates,
            "all_delivered": expected_missing == 0,
            "seconds": round((last - min_due) / 1000, 2),
            "rate_per_s": round(len(ids) / max(0.001, (last - min_due) / 1000), 1),
            "lateness": stats,
            "delivered_per_second_after_due": [
                per_second.get(s, 0) for s in range(int(max(per_second, default=0)) + 1)
            ],
            "progress_timeline": [p for p in timeline if "tiers" in p],
            "mean_x_death_hops": peer.counters()["mean_x_death_hops"],
            "cpu": _per_msg(
                drain_meter.result, len(ids), peer.counters()["mean_x_death_hops"], idle
            ),
        }
        ref_n = out["reference_at_n"]["median"]
        out["drain"]["ratio_to_reference_publish"] = round(out["drain"]["rate_per_s"] / ref_n, 3)
        _progress(
            f"drained {len(ids):,}/{messages:,} in {out['drain']['seconds']} s "
            f"({out['drain']['rate_per_s']:,.0f}/s), missing {expected_missing}, "
            f"duplicates {peer.arrivals.duplicates}"
        )
        return out
    finally:
        await peer.teardown()


def _per_msg(
    cpu: dict[str, Any], messages: int, hops: float | None, idle: float | None
) -> dict[str, Any]:
    """CPU seconds per process, and microseconds per message (and per hop, for the broker).

    ``broker_net``: the broker's CPU minus its background (``idle`` CPU/s times the wall).
    """
    out = dict(cpu)
    if idle is not None and out.get("broker_cpu_s") is not None:
        out["broker_net_cpu_s"] = round(out["broker_cpu_s"] - idle * out["wall_s"], 3)
    for key, value in list(out.items()):
        if key.endswith("_cpu_s") and value is not None and messages:
            out[key[:-6] + "_us_per_msg"] = round(value / messages * 1e6, 1)
    broker = out.get("broker_net_cpu_s", out.get("broker_cpu_s"))
    if broker is not None and hops and messages:
        out["broker_us_per_hop"] = round(broker / (messages * hops) * 1e6, 1)
    return out


def _levels(
    chunk_rates: list[dict[str, Any]],
    snapshots: dict[str, Any],
    messages: int,
    out: dict[str, Any],
) -> dict[str, Any]:
    """Per level (0, 100k, N): median rate of the 3 chunks nearest it, memory, disk."""
    base = snapshots["0"]
    ref0, refn = out["reference_at_0"]["median"], out["reference_at_n"]["median"]
    result: dict[str, Any] = {}
    for level in sorted({0, min(100_000, messages), messages}):
        if level == 0:
            near = chunk_rates[:3]
        elif level == messages:
            near = chunk_rates[-3:]
        else:
            start = next((i for i, c in enumerate(chunk_rates) if c["pending_before"] >= level), 0)
            near = chunk_rates[start : start + 3]
        rate = statistics.median(c["rate_per_s"] for c in near) if near else math.nan
        snap = snapshots.get(str(level), base)
        ref = refn if level == messages and level else ref0
        grown = (snap["mem_rss_bytes"] or 0) - (base["mem_rss_bytes"] or 0)
        disk = (snap.get("disk_quorum_dir_allocated_bytes") or 0) - (
            base.get("disk_quorum_dir_allocated_bytes") or 0
        )
        result[str(level)] = {
            "pending": level,
            "publish_rate_per_s": round(rate, 1),
            "publish_chunks": [c["rate_per_s"] for c in near],
            "reference_rate_per_s": ref,
            "ratio_to_reference": round(rate / ref, 3) if ref else None,
            "broker_rss_bytes": snap["mem_rss_bytes"],
            "broker_rss_growth_bytes": grown,
            "broker_rss_bytes_per_pending": round(grown / level, 1) if level else None,
            "quorum_dir_bytes": snap.get("disk_quorum_dir_allocated_bytes"),
            "quorum_dir_growth_bytes": disk,
            "disk_bytes_per_pending": round(disk / level, 1) if level else None,
            "disk_free_bytes": snap["disk_free_bytes"],
        }
    return result
