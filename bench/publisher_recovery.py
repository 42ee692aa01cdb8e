"""What a dropped connection costs a publisher: ``python -m bench.publisher_recovery``.

For each publisher (sync, then async): publish ``--count`` messages in ``publish_many``
batches of ``--batch``, delays 0 to 2 s, to a destination under a fresh prefix. When half
are confirmed, close the publisher's connection through the management API (from another
thread, so the close lands while batches are in flight) and keep going: a batch that
fails is published again, the failed messages with the same message ids, as the README
tells callers to. Then read the work queue and count:

- confirmed: messages some call returned as confirmed;
- lost: confirmed but never delivered (must be 0: a result means confirmed);
- duplicates: deliveries beyond the first of a message id (a message in flight when the
  connection dropped may have arrived and been published again: at least once);
- resume: from the close to the next confirmed batch, and the calls that raised meanwhile.

The prefix's topology is deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika

from bench.common import DEFAULT_AMQP_URL, Management
from rmqdelay import (
    AsyncPublisher,
    BatchPublishError,
    Publisher,
    PublishError,
    Settings,
    TopologyManager,
)

DEST = "recovery"


@dataclass
class Run:
    """One publisher's run: what it was told, what it confirmed, what arrived."""

    mode: str
    count: int
    confirmed: set[str] = field(default_factory=set)
    errors: Counter[str] = field(default_factory=Counter)
    republished: int = 0
    killed_at: float | None = None
    resumed_at: float | None = None
    deliveries: Counter[str] = field(default_factory=Counter)

    def note_confirmed(self, ids: list[str]) -> None:
        self.confirmed.update(ids)
        if self.killed_at is not None and self.resumed_at is None:
            self.resumed_at = time.monotonic()

    def figures(self) -> dict[str, Any]:
        lost = self.confirmed - set(self.deliveries)
        return {
            "publisher": self.mode,
            "messages": self.count,
            "confirmed": len(self.confirmed),
            "delivered": len(self.deliveries),
            "lost": len(lost),
            "duplicates": sum(self.deliveries.values()) - len(self.deliveries),
            "calls that raised": dict(self.errors),
            "messages published again": self.republished,
            "resume ms": None
            if self.killed_at is None or self.resumed_at is None
            else round((self.resumed_at - self.killed_at) * 1000, 1),
        }


class Killer:
    """Closes the publisher's connection through the management API, once, in a thread."""

    def __init__(self, settings: Settings, connection_name: str, run: Run) -> None:
        self.api = Management(settings.urls[0], timeout=10)
        self.connection_name = connection_name
        self.run = run
        self.thread: threading.Thread | None = None

    def _call(self, method: str, path: str) -> Any:
        return self.api.call(method, path)

    def _kill(self) -> None:
        deadline = time.monotonic() + 15  # the API lists a new connection after a while
        while time.monotonic() < deadline:
            rows = self._call("GET", "connections?columns=name,client_properties")
            names = [
                row["name"]
                for row in rows or []
                if (row.get("client_properties") or {}).get("connection_name")
                == self.connection_name
            ]
            if names:
                for name in names:
                    self._call("DELETE", f"connections/{urllib.parse.quote(name, safe='')}")
                self.run.killed_at = time.monotonic()
                return
            time.sleep(0.1)
        raise RuntimeError(f"connection {self.connection_name} never showed up in the API")

    def trigger(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._kill, daemon=True)
            self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(20)


def requests_for(mode: str, count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "destination": DEST,
            "body": f"{mode} {i}".encode(),
            "delay": round(rng.uniform(0, 2), 3),
            "message_id": f"{mode}-{i}",
        }
        for i in range(count)
    ]


def next_batch(run: Run, batch: list[dict[str, Any]], exc: PublishError) -> list[dict[str, Any]]:
    """After a failed call: what to publish again, with the same message ids."""
    run.errors[type(exc).__name__] += 1
    if isinstance(exc, BatchPublishError):
        run.note_confirmed([r["message_id"] for r in batch if r["message_id"] not in exc.failures])
        batch = [r for r in batch if r["message_id"] in exc.failures]
    run.republished += len(batch)
    return batch


def publish_sync(settings: Settings, run: Run, batch_size: int, seed: int) -> None:
    requests = requests_for(run.mode, run.count, seed)
    killer = Killer(settings, f"{settings.connection_name}.pub", run)
    with Publisher(settings) as publisher:
        for start in range(0, run.count, batch_size):
            batch = requests[start : start + batch_size]
            while batch:
                try:
                    results = publisher.publish_many(batch)
                except PublishError as exc:
                    batch = next_batch(run, batch, exc)
                    continue
                run.note_confirmed([r.message_id for r in results])
                batch = []
            if len(run.confirmed) >= run.count // 2:
                killer.trigger()
    killer.join()


async def publish_async(settings: Settings, run: Run, batch_size: int, seed: int) -> None:
    requests = requests_for(run.mode, run.count, seed)
    killer = Killer(settings, f"{settings.connection_name}.pub", run)
    async with AsyncPublisher(settings) as publisher:
        for start in range(0, run.count, batch_size):
            batch = requests[start : start + batch_size]
            while batch:
                try:
                    results = await publisher.publish_many(batch)
                except PublishError as exc:
                    batch = next_batch(run, batch, exc)
                    continue
                run.note_confirmed([r.message_id for r in results])
                batch = []
            if len(run.confirmed) >= run.count // 2:
                killer.trigger()
    await asyncio.to_thread(killer.join)


def drain(settings: Settings, run: Run, idle_s: float = 3.0) -> None:
    """Read the work queue until every confirmed message came, or nothing came for a while."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.urls[0]))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=500)
        for method, props, _body in channel.consume(
            settings.layout.work_queue(DEST), inactivity_timeout=idle_s
        ):
            if method is None or props is None:
                break
            run.deliveries[str(props.message_id)] += 1
            channel.basic_ack(int(method.delivery_tag or 0), multiple=False)
        channel.cancel()
    finally:
        connection.close()


def measure(
    url: str, mode: str, count: int, batch: int, seed: int, publish: Callable[..., Any]
) -> dict[str, Any]:
    prefix = f"bench-recovery-{secrets.token_hex(3)}"
    settings = Settings(url=url, prefix=prefix, max_delay="1m", connection_name=prefix)
    run = Run(mode, count)
    with TopologyManager(settings) as manager:
        manager.apply([DEST])
    try:
        started = time.monotonic()
        result = publish(settings, run, batch, seed)
        if asyncio.iscoroutine(result):
            asyncio.run(result)
        elapsed = time.monotonic() - started
        time.sleep(2.5)  # the last messages fall due
        drain(settings, run)
    finally:
        with TopologyManager(settings) as manager:
            manager.destroy([DEST], force=True)
    return {**run.figures(), "publish s": round(elapsed, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    rows = [
        measure(args.url, "sync", args.count, args.batch, args.seed, publish_sync),
        measure(args.url, "async", args.count, args.batch, args.seed, publish_async),
    ]
    for row in rows:
        print(json.dumps(row))
    return 1 if any(row["lost"] for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
