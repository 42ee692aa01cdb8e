"""A node of the cluster dies, or all restart in turn: nothing confirmed is lost.

Publisher and worker are given every node's URL, the node that leads most queues first;
they move to a live node on their own. Figures are printed (``make cluster-test`` shows
them): lost, early, duplicates, and how long each client took to resume.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from cluster_support import Cluster

from rmqdelay import (
    Context,
    Publisher,
    PublishError,
    Settings,
    TopologyManager,
    Worker,
)

DEST = "failover"


@dataclass
class Seen:
    at_ms: dict[str, list[int]] = field(default_factory=dict)
    early: int = 0
    """Deliveries before the due time their own copy carried (a re-send has a later one)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, ctx: Context) -> None:
        now = time.time_ns() // 10**6
        with self.lock:
            self.at_ms.setdefault(ctx.message_id, []).append(now)
            if ctx.due_at is not None and now < ctx.due_at.timestamp() * 1000:
                self.early += 1


def _settings(urls: list[str], prefix: str) -> Settings:
    return Settings(url=",".join(urls), prefix=prefix, max_delay="2m", connection_name=prefix)


def _publish(
    publisher: Publisher, confirmed: dict[str, int], requests: list[dict[str, Any]]
) -> float:
    """Publish, sending again (same ids) what was not confirmed; return the seconds spent
    between the first failure and the last confirm (0 when nothing failed)."""
    failed_at: float | None = None
    pending = requests
    while pending:
        try:
            for result in publisher.publish_many(pending):
                confirmed[result.message_id] = result.due_at_ms
            pending = []
        except PublishError as exc:  # BatchPublishError names them; else all are unsure
            failed = set(getattr(exc, "failures", {})) or {r["message_id"] for r in pending}
            pending = [r for r in pending if r["message_id"] in failed]
            failed_at = failed_at or time.monotonic()
            time.sleep(0.2)
    return 0.0 if failed_at is None else time.monotonic() - failed_at


def _requests(n: int, low_s: float, high_s: float) -> list[dict[str, Any]]:
    return [
        {
            "destination": DEST,
            "body": b"x",
            "delay": random.uniform(low_s, high_s),
            "message_id": str(uuid.uuid4()),
        }
        for _ in range(n)
    ]


async def _run_worker(settings: Settings, seen: Seen, until: threading.Event) -> int:
    app = Worker(settings)

    @app.handler(DEST)
    def handle(body: bytes, ctx: Context) -> None:
        seen.add(ctx)

    async with app.running(concurrency=32, prefetch=500) as runner:
        while not until.is_set():
            await asyncio.sleep(0.1)
        return runner.connects


def test_kill_9_of_the_busiest_node_loses_nothing(local_cluster: Cluster) -> None:
    prefix = f"t-failover-{uuid.uuid4().hex[:6]}"
    base = _settings(local_cluster.urls, prefix)
    with TopologyManager(base) as manager:
        manager.apply([DEST])
    leaders = local_cluster.leaders(prefix)
    assert len(leaders) > 1, f"leaders not spread: {leaders}"
    busiest = local_cluster.index_of(leaders.most_common(1)[0][0])
    urls = [local_cluster.urls[busiest]] + [
        u for i, u in enumerate(local_cluster.urls) if i != busiest
    ]
    settings = _settings(urls, prefix)  # both clients connect to the busiest node first
    seen, done = Seen(), threading.Event()
    confirmed: dict[str, int] = {}
    loop_result: dict[str, int] = {}

    def worker() -> None:
        loop_result["connects"] = asyncio.run(_run_worker(settings, seen, done))

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        with Publisher(settings) as publisher:
            _publish(publisher, confirmed, _requests(10_000, 10, 40))
            killed_at = time.monotonic()
            local_cluster.kill(busiest)
            outage = _publish(publisher, confirmed, _requests(2_000, 1, 5))
            resumed_after = time.monotonic() - killed_at
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not confirmed.keys() <= seen.at_ms.keys():
            time.sleep(0.5)
    finally:
        done.set()
        thread.join(60)
        local_cluster.restart(busiest)
        with TopologyManager(_settings(local_cluster.urls, prefix)) as manager:
            manager.destroy(force=True)
    lost = confirmed.keys() - seen.at_ms.keys()
    duplicates = sum(len(v) - 1 for v in seen.at_ms.values())
    print(
        f"\nkill -9 of {local_cluster.urls[busiest].split('@')[1]} (leading {leaders}): "
        f"{len(confirmed)} confirmed, {len(lost)} lost, {seen.early} early, {duplicates} "
        f"duplicates; publisher resumed {resumed_after:.1f}s after the kill "
        f"(retrying for {outage:.1f}s); worker connected {loop_result.get('connects')} times"
    )
    assert not lost
    assert seen.early == 0
    assert loop_result.get("connects", 0) >= 2  # it moved to a live node


def test_a_rolling_restart_loses_nothing(local_cluster: Cluster) -> None:
    prefix = f"t-rolling-{uuid.uuid4().hex[:6]}"
    settings = _settings(local_cluster.urls, prefix)
    with TopologyManager(settings) as manager:
        manager.apply([DEST])
    seen, done = Seen(), threading.Event()
    confirmed: dict[str, int] = {}
    stop_traffic = threading.Event()

    def worker() -> None:
        asyncio.run(_run_worker(settings, seen, done))

    def traffic() -> None:
        with Publisher(settings) as publisher:
            while not stop_traffic.is_set():
                _publish(publisher, confirmed, _requests(50, 0.5, 5))
                time.sleep(0.2)

    threads = [threading.Thread(target=worker), threading.Thread(target=traffic)]
    for t in threads:
        t.start()
    try:
        for index in range(3):
            local_cluster.stop_one(index)
            time.sleep(2)
            local_cluster.restart(index)
        stop_traffic.set()
        threads[1].join(120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not confirmed.keys() <= seen.at_ms.keys():
            time.sleep(0.5)
    finally:
        stop_traffic.set()
        done.set()
        for t in threads:
            t.join(60)
        waiting = {
            q["name"]: q.get("messages")
            for q in local_cluster.api("queues?columns=name,messages")
            if str(q["name"]).startswith(f"{prefix}.") and q.get("messages")
        }
        with TopologyManager(settings) as manager:
            manager.destroy(force=True)
    lost = confirmed.keys() - seen.at_ms.keys()
    duplicates = sum(len(v) - 1 for v in seen.at_ms.values())
    print(
        f"\nrolling restart of 3 nodes: {len(confirmed)} confirmed, {len(lost)} not handled, "
        f"{duplicates} duplicates; still in queues: {waiting}"
    )
    assert confirmed and not lost
