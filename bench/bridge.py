"""The x-delay bridge's figures, side by side with rmqdelay's own publishers, in one run.

    python -m bench.bridge                       # both measures, 3 rounds each, alternating
    python -m bench.bridge --only carry --count 20000 --rounds 5
    python -m bench.bridge --only lateness --rate 500 --duration 4
    python -m bench.bridge --only lateness --rounds 5 --duration 8 --lateness-bridges 1 --breakdown

* ``carry``: how fast two ``rmqdelay bridge run`` processes carry messages from the inbox
  into the tiers (scheduled: confirmed there and journaled, then acked), against the sync
  ``Publisher.publish_many`` of as many messages (``publish.sync.many.long``'s measure:
  delays 10 min to 1 h, window 500) into the same topology. The inbox is filled first
  with raw pika (delays 10 min to 1 h in ``x-delay``), then both bridges start; the rate
  is timed from the first message scheduled to the last, from the bridges' own counter
  (``rmqdelay_bridge_messages_total``, ``--metrics-port``). Target: at least 0.5 x.
* ``lateness``: ``--rate`` messages per second fall due for ``--duration`` s, delays 1 to
  4 s (the e2e workload), published at ``due - delay``. Directly: ``AsyncPublisher`` into
  a destination's tiers, read off its work queue. Through the bridge: aio-pika publishes to
  the bridge's exchange with ``x-delay`` (a plugin user's publisher), two bridge processes,
  read off a quorum queue bound to the delivery exchange. Both are read by a bare aio-pika
  consumer in this process, so the difference is the bridge's alone. Target: the bridge
  adds at most 20 ms to p99 lateness. A third side each round, ``relay``, is its floor:
  the bridge's two extra quorum queue hops done by bare clients, no delay
  (:mod:`bench.peers.relay`); each side's own processes' CPU per message is kept (the
  bridges', the relay's). A fourth, ``bare``, is the floor of the target itself: the
  bridge's whole path done by bare aio-pika clients (a relay process plans each message
  into the tiers from its arrival with rmqdelay's ``plan_delay`` and acks it once
  confirmed, a second moves it from the work queue to a quorum queue; no journal, no
  envelope): what it adds to the direct path's lateness, any bridge of this design adds
  at least. ``--breakdown``: the bridges log each message (JSON), and the
  bridge's lateness is split into the inbox hop, the tiers up to stage 2's handler, and
  the way out to the consumer (:func:`breakdown`).

Everything is created under a fresh ``bench-bridge-<hex>`` prefix and removed at the end;
the figures go to ``bench/results/bridge.json`` (``--out``). Public ground only: rmqdelay
through what ``rmqdelay`` exports and its command line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
from aio_pika.abc import AbstractExchange

from bench.common import (
    DEFAULT_AMQP_URL,
    Management,
    Record,
    broker_info,
    broker_pid,
    lateness_stats,
    machine_cpu_seconds,
    machine_info,
    machine_load,
    now_ms,
    percentile,
    proc_cpu_seconds,
)
from bench.measures import LONG, sync_many
from bench.peers._amqp import AmqpPeer, make_message
from bench.peers.base import Item, run_windowed, unique_prefix
from bench.peers.relay import RelayPeer, start_relay, stop_relay
from bench.peers.rmqdelay_peer import RmqdelayPeer
from bench.scenarios_peers import Sizes, steady_run
from rmqdelay import Settings, TopologyManager

RESULTS = Path(__file__).resolve().parent / "results" / "bridge.json"
CLI = (sys.executable, "-m", "rmqdelay.cli")
BRIDGES = 2
WINDOW = 500
DEST = "bench"
BARE = "bare"
"""The bare bridge's destination (:class:`BareBridgePeer`)."""
LONG_MS = (600_000, 3_600_000)
_SCHEDULED = re.compile(r'^rmqdelay_bridge_messages_total\{[^}]*outcome="scheduled"[^}]*\} (\S+)$')


def _env(settings_kwargs: dict[str, Any], root: Path | None = None) -> dict[str, str]:
    """The bridges' environment; ``root``: the tree whose rmqdelay they run (this one's
    by default), so that two versions of the bridge can be compared in one run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQDELAY_")}
    if "RMQDELAY_MANAGEMENT_URL" in os.environ:
        env["RMQDELAY_MANAGEMENT_URL"] = os.environ["RMQDELAY_MANAGEMENT_URL"]
    env["RMQDELAY_URL"] = settings_kwargs["url"]
    env["RMQDELAY_PREFIX"] = settings_kwargs["prefix"]
    tree = str((root or Path(__file__).resolve().parents[1]).resolve())
    if root is not None:  # that tree's alone, whatever this process was given
        env["PYTHONPATH"] = tree
    else:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Bridges:
    """``rmqdelay bridge run`` processes for one exchange, each with its metrics port."""

    procs: list[subprocess.Popen[bytes]]
    ports: list[int]

    def scheduled(self) -> float:
        """The processes' ``scheduled`` counters, summed (a process not serving yet: 0)."""
        total = 0.0
        for port in self.ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                continue
            for line in text.splitlines():
                found = _SCHEDULED.match(line)
                if found:
                    total += float(found.group(1))
        return total

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def bridges(
    env: dict[str, str],
    exchange: str,
    count: int = BRIDGES,
    *,
    metrics: bool = True,
    logs: Path | None = None,
    extra: Sequence[str] = (),
    cwd: Path | None = None,
    nice: int = 0,
) -> Iterator[Bridges]:
    """``count`` bridge processes; ``metrics``: each serves its counters (and, as
    ``--metrics-port`` does, refreshes the queue gauges every 15 s: a status snapshot
    the lateness runs do without); ``logs``: a directory where each writes its JSON log
    at INFO (one line per message handled: see :func:`breakdown`); ``nice``: run under
    ``nice -n`` (stage 1's process inherits it)."""
    ports = [_free_port() for _ in range(count)] if metrics else []
    procs = []
    with contextlib.ExitStack() as files:
        for n in range(count):
            command = [*CLI, "bridge", "run", "--exchange", exchange, *extra]
            command = ["nice", "-n", str(nice), *command] if nice else command
            command += ["--metrics-port", str(ports[n])] if metrics else []
            log_file: Any = subprocess.DEVNULL
            if logs is not None:
                command += ["--log-level", "INFO", "--log-format", "json"]
                log_file = files.enter_context((logs / f"bridge{n}.log").open("wb"))
            procs.append(
                subprocess.Popen(
                    command,
                    env=env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log_file if logs is not None else None,
                )
            )
    found = Bridges(procs, ports)
    try:
        yield found
    finally:
        found.stop()


def _children(pid: int) -> list[int]:
    """A process's children, from /proc (none where the kernel does not list them)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            return [int(child) for child in fh.read().split()]
    except (OSError, ValueError):
        return []


def _consumers(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.consumer_count)
    finally:
        connection.close()


def _ready(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


class Topology:
    """One prefix: the destination ``bench`` for the direct measures, and one bridge."""

    def __init__(self, url: str, root: Path | None = None) -> None:
        self.prefix = unique_prefix("bridge")
        self.settings_kwargs: dict[str, Any] = {"url": url, "prefix": self.prefix}
        self.settings = Settings(**self.settings_kwargs)
        self.url = url
        self.exchange = f"{self.prefix}-x"
        self.delivery = f"{self.exchange}.delayed"
        self.destination = f"bridge.{self.exchange}"
        self.inbox = f"{self.prefix}.{self.destination}.inbox"
        self.env = _env(self.settings_kwargs, root)
        self.cwd = root  # `python -m` puts the working directory first on sys.path
        self.declared = False

    def declare(self) -> None:
        self.declared = True
        with TopologyManager(self.settings) as manager:
            manager.apply([DEST, BARE])
        done = subprocess.run(
            [*CLI, "bridge", "declare", "--exchange", self.exchange, "--type", "direct"],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"bridge declare failed: {done.stderr.strip()}")

    def destroy(self) -> None:
        if not self.declared:
            return
        with contextlib.suppress(Exception), TopologyManager(self.settings) as manager:
            manager.destroy([DEST, BARE, self.destination], force=True)
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            channel = connection.channel()
            channel.queue_delete(self.inbox)
            for name in (self.exchange, self.delivery, self.inbox):
                channel.exchange_delete(name)
        finally:
            connection.close()
        api = Management(self.url)
        with contextlib.suppress(Exception):
            api.call("DELETE", f"policies/{quote(api.vhost, safe='')}/{quote(self.inbox, safe='')}")


# ---------------------------------------------------------------------- carry


def fill_inbox(topology: Topology, count: int, seed: int) -> None:
    """``count`` messages into the bridge's exchange, as a plugin user publishes them
    (x-delay 10 min to 1 h); then wait until the inbox holds them all."""
    rng = random.Random(seed)
    before = _ready(topology.url, topology.inbox)
    connection = pika.BlockingConnection(pika.URLParameters(topology.url))
    try:
        channel = connection.channel()
        body = b"x" * 100
        for _ in range(count):
            props = pika.BasicProperties(
                headers={"x-delay": rng.randint(*LONG_MS)}, delivery_mode=2
            )
            channel.basic_publish(topology.exchange, "k", body, props)
    finally:
        connection.close()
    _wait(lambda: _ready(topology.url, topology.inbox) >= before + count, 120, "a full inbox")


def carry_once(topology: Topology, count: int, seed: int) -> dict[str, Any]:
    fill_inbox(topology, count, seed)
    broker = broker_pid(topology.url)
    with bridges(topology.env, topology.exchange) as running:
        deadline = time.monotonic() + 120
        first = 0.0
        while (first := running.scheduled()) == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the bridges scheduled nothing in 120 s")
            time.sleep(0.005)
        pids = {"broker": broker, **{f"bridge{i}": p.pid for i, p in enumerate(running.procs)}}
        cpu0 = {k: proc_cpu_seconds(pid) if pid else None for k, pid in pids.items()}
        start = time.perf_counter()
        while (done := running.scheduled()) < count:
            if time.monotonic() > deadline + 300:
                raise RuntimeError(f"the bridges scheduled {done} of {count}")
            time.sleep(0.01)
        wall = time.perf_counter() - start
        cpu = {}
        for key, pid in pids.items():
            before, after = cpu0[key], proc_cpu_seconds(pid) if pid else None
            if before is not None and after is not None:
                cpu[key] = round((after - before) / (count - first) * 1e6, 1)
    return {
        "count": count,
        "timed": round(count - first),
        "wall_s": round(wall, 3),
        "rate": round((count - first) / wall, 1),
        "cpu_us_per_msg": cpu,
    }


def publish_once(topology: Topology, count: int) -> dict[str, Any]:
    run = sync_many(topology.settings, count, WINDOW, LONG)
    return {"count": count, "wall_s": round(run.wall, 3), "rate": round(run.rate, 1)}


def carry(topology: Topology, count: int, rounds: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for n in range(rounds):
        direct = publish_once(topology, count)
        bridged = carry_once(topology, count, n)
        runs.append({"publish_many": direct, "bridge": bridged})
        print(
            f"  round {n + 1}: sync publish_many {direct['rate']:,.0f} msgs/s, "
            f"{BRIDGES} bridges {bridged['rate']:,.0f} msgs/s "
            f"({bridged['rate'] / direct['rate']:.2f} x); CPU us/msg {bridged['cpu_us_per_msg']}",
            file=sys.stderr,
        )
    direct_rate = statistics.median(r["publish_many"]["rate"] for r in runs)
    bridge_rate = statistics.median(r["bridge"]["rate"] for r in runs)
    return {
        "count": count,
        "bridges": BRIDGES,
        "publish_many_rate": direct_rate,
        "bridge_rate": bridge_rate,
        "ratio": round(bridge_rate / direct_rate, 3),
        "target": 0.5,
        "runs": runs,
    }


# ---------------------------------------------------------------------- lateness


async def publish_x_delay(
    peer: AmqpPeer, exchange: AbstractExchange, routing_key: str, batch: Sequence[Item]
) -> None:
    """As a plugin user's publisher does: the delay in ``x-delay``, confirmed, windowed."""

    async def send(item: Item) -> None:
        message_id, delay_ms = item
        published = now_ms()
        message = make_message(
            message_id,
            published,
            published + delay_ms,
            peer.body,
            extra_headers={"x-delay": delay_ms},
        )
        await exchange.publish(message, routing_key=routing_key)

    await run_windowed(send, batch, peer.window)


class BridgePeer(AmqpPeer):
    """A plugin user's publisher (aio-pika, x-delay header) and consumer (a quorum queue
    bound to the delivery exchange), with the bridges in between."""

    slug = "bridge"

    def __init__(
        self,
        topology: Topology,
        count: int = BRIDGES,
        logs: Path | None = None,
        extra: Sequence[str] = (),
        nice: int = 0,
        **kwargs: Any,
    ) -> None:
        self.topology = topology
        self.count = count
        self.logs = logs
        self.extra = tuple(extra)
        self.nice = nice
        super().__init__(topology.url, **kwargs)
        self.name = f"bridge-{count}"
        self.description = (
            f"{count} `rmqdelay bridge run` processes between an aio-pika publisher "
            "(x-delay header, confirms) and a quorum queue bound to the delivery exchange"
        )
        self._bridges: contextlib.ExitStack | None = None
        self.running: Bridges | None = None
        self._exchange: AbstractExchange | None = None

    async def _declare(self) -> None:
        t = self.topology
        queue = f"{self.prefix}.consumer"
        await self._declare_queue(queue, {"x-queue-type": "quorum"})
        await self.pub.get_exchange(t.delivery, ensure=True)
        declared = await self.pub.get_queue(queue, ensure=False)
        await declared.bind(t.delivery, routing_key="k")
        self._exchange = await self.pub.get_exchange(t.exchange, ensure=False)
        self._bridges = contextlib.ExitStack()
        self.running = self._bridges.enter_context(
            bridges(
                t.env,
                t.exchange,
                self.count,
                metrics=False,
                logs=self.logs,
                extra=self.extra,
                cwd=t.cwd,
                nice=self.nice,
            )
        )
        work = t.settings.layout.work_queue(t.destination)
        n = self.count
        await asyncio.to_thread(
            _wait,
            lambda: _consumers(t.url, t.inbox) == n and _consumers(t.url, work) == n,
            60,
            "the bridges",
        )
        await self._consume(queue)

    async def publish(self, batch: Sequence[Item]) -> None:
        assert self._exchange is not None, "setup() first"
        await publish_x_delay(self, self._exchange, "k", batch)

    def pids(self) -> list[int]:
        """The bridge processes and their children (stage 1's process, by default)."""
        procs = [p.pid for p in self.running.procs] if self.running is not None else []
        return [*procs, *(child for pid in procs for child in _children(pid))]

    async def teardown(self) -> None:
        if self._bridges is not None:
            await asyncio.to_thread(self._bridges.close)
            self._bridges = None
        await super().teardown()


class BareBridgePeer(AmqpPeer):
    """The bridge's path done by bare aio-pika clients: the same work without rmqdelay's
    code, the floor of what any bridge of this design adds (see :func:`lateness`)."""

    slug = "bare"

    def __init__(self, topology: Topology, **kwargs: Any) -> None:
        self.topology = topology
        super().__init__(topology.url, **kwargs)
        self.name = "bare"
        self.description = (
            "the bridge's path by bare aio-pika clients: publish with x-delay (confirms) into "
            "a quorum queue; a relay process plans each message into the tiers from its "
            "arrival (rmqdelay's plan_delay, no journal record) and acks it once confirmed; "
            "a second one moves it from the work queue to a quorum queue, read here"
        )
        self.inbox = f"{self.prefix}.in"
        self.outbox = f"{self.prefix}.out"
        self._relays: list[subprocess.Popen[str]] = []

    async def _declare(self) -> None:
        t = self.topology
        for name in (self.inbox, self.outbox):
            await self._declare_queue(name, {"x-queue-type": "quorum"})
        work = t.settings.layout.work_queue(BARE)
        self._relays.append(await start_relay(self.url, self.inbox, BARE, "--tiers", t.prefix))
        self._relays.append(await start_relay(self.url, work, self.outbox))
        await self._consume(self.outbox)

    async def publish(self, batch: Sequence[Item]) -> None:
        await publish_x_delay(self, self.pub.default_exchange, self.inbox, batch)

    def pids(self) -> list[int]:
        return [relay.pid for relay in self._relays]

    async def teardown(self) -> None:
        relays, self._relays = self._relays, []
        for relay in relays:
            await stop_relay(relay)
        await super().teardown()


STEPS = ("inbox_ms", "tiers_ms", "out_ms", "hops_ms")
"""The breakdown's steps (see :func:`breakdown`)."""


def _handled(logs: Path) -> dict[str, tuple[float, float]]:
    """Per message id, from the bridges' JSON logs: when stage 2's handler started (epoch
    ms: the line's time less the handler's duration) and its lateness against the due
    time stage 1 set."""
    found: dict[str, tuple[float, float]] = {}
    for path in sorted(logs.glob("bridge*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            doc = json.loads(line)
            if doc.get("message") != "handled" or "message_id" not in doc:
                continue
            logged = datetime.fromisoformat(doc["time"]).timestamp() * 1000
            start = logged - float(doc.get("duration_ms", 0))
            found[str(doc["message_id"])] = (start, float(doc["lateness_ms"]))
    return found


def breakdown(records: Sequence[Record], handled: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Where each message's lateness went, p50 / p99 per step (ms):

    * ``tiers_ms``: stage 2's handler start against the due time stage 1 set (the tiers,
      the work queue and the Worker: what the direct side's lateness measures); exact,
      from the bridge's own clock;
    * ``hops_ms``: the rest of the lateness, exact: the inbox (the bench's publish to
      stage 1's pickup; the delay counts from the pickup, so this adds in full), and from
      the handler's start to the bench's consumer (the confirmed publish to ``DNAME``,
      the consumers' quorum queue, the consumer);
    * ``inbox_ms`` and ``out_ms``: ``hops_ms`` split at the handler's start, taken as
      the log line's time less the handler's duration. The line is written after the
      ack, so ``inbox_ms`` is an upper bound and ``out_ms`` a lower one (by the ack's
      wait for its event loop turn: under 1 ms on a quiet machine).
    """
    steps: dict[str, list[float]] = {step: [] for step in STEPS}
    for r in records:
        if r.message_id not in handled:
            continue
        start, late = handled[r.message_id]
        steps["inbox_ms"].append(start - late - r.due_at_ms)
        steps["tiers_ms"].append(late)
        steps["out_ms"].append(r.received_at_ms - start)
        steps["hops_ms"].append(r.lateness_ms - late)
    out: dict[str, Any] = {"matched": len(steps["tiers_ms"])}
    for step, values in steps.items():
        values.sort()
        out[step] = {
            "p50": round(percentile(values, 50), 1) if values else None,
            "p99": round(percentile(values, 99), 1) if values else None,
        }
    return out


SIDES = ("direct", "bridge", "relay", "bare")
VARIANT = "variant"
"""The optional fourth side: the bridge with other arguments or another tree's code."""
SHARED = ("broker_us_per_msg", "bench_us_per_msg", "machine_us_per_msg", "machine_busy_percent")
"""Per side, beside its own processes' CPU: the broker's (shared: others' work included),
this process's (the publisher and the consumer), and the whole machine's, per message;
and how busy the machine was meanwhile (100: both cores)."""


@dataclass
class Variant:
    """A second bridge side: its own exchange (``topology``), run from ``root``'s tree
    (this one's when None) with ``args`` added to ``bridge run``, under ``nice -n nice``."""

    topology: Topology
    root: Path | None
    args: tuple[str, ...]
    nice: int = 0


def _cpu(pids: Sequence[int]) -> float:
    return sum(proc_cpu_seconds(pid) or 0.0 for pid in pids)


def _shared_cpu(broker: int | None) -> tuple[float, float | None, float | None, float | None]:
    """Now, the broker's, this process's and the machine's CPU seconds."""
    return (
        time.perf_counter(),
        proc_cpu_seconds(broker) if broker else None,
        proc_cpu_seconds(os.getpid()),
        machine_cpu_seconds(),
    )


def _shared_per_msg(
    before: tuple[float, float | None, float | None, float | None],
    after: tuple[float, float | None, float | None, float | None],
    n_msgs: int,
) -> dict[str, float | None]:
    def per_msg(i: int) -> float | None:
        b, a = before[i], after[i]
        return None if a is None or b is None else round((a - b) / n_msgs * 1e6, 1)

    wall = after[0] - before[0]
    machine = per_msg(3)
    busy = None
    if machine is not None and wall > 0:
        busy = round(machine * n_msgs / 1e6 / wall / (os.cpu_count() or 1) * 100, 1)
    return {
        "broker_us_per_msg": per_msg(1),
        "bench_us_per_msg": per_msg(2),
        "machine_us_per_msg": machine,
        "machine_busy_percent": busy,
    }


async def lateness(
    topology: Topology,
    rate: float,
    duration: float,
    rounds: int,
    count: int = BRIDGES,
    *,
    with_breakdown: bool = False,
    concurrency: int | None = None,
    variant: Variant | None = None,
    keep_logs: bool = False,
) -> dict[str, Any]:
    """The three sides in turn each round: ``direct`` (the reference), ``bridge``, and
    ``relay`` (the bridge's two extra hops by bare clients, no delay: the floor of what a
    bridge adds; :mod:`bench.peers.relay`). ``with_breakdown``: the bridges log each
    message (INFO, JSON: a little CPU per message) and each round's bridge side is split
    per step (:func:`breakdown`)."""
    sizes = Sizes(rate=rate, duration_s=duration, min_delay_ms=1000, max_delay_ms=4000)
    logs = Path(tempfile.mkdtemp(prefix="bench-bridge-logs-")) if with_breakdown else None
    extra = ["--concurrency", str(concurrency)] if concurrency else []
    peers: dict[str, Any] = {
        "direct": RmqdelayPeer(topology.url, worker="aiopika", label="direct"),
        "bridge": BridgePeer(topology, count, logs, extra),
        "relay": RelayPeer(topology.url),
        "bare": BareBridgePeer(topology),
    }
    if variant is not None:
        peers[VARIANT] = BridgePeer(
            variant.topology, count, None, [*extra, *variant.args], nice=variant.nice
        )
    broker = broker_pid(topology.url)
    runs: list[dict[str, Any]] = []
    bridge_records: list[Sequence[Record]] = []
    n_msgs = max(1, int(rate * duration))
    try:
        for peer in peers.values():
            await peer.setup()
        for n in range(rounds):
            row: dict[str, Any] = {"load": await asyncio.to_thread(machine_load, 1.0)}
            for name, peer in peers.items():
                pids = peer.pids() if hasattr(peer, "pids") else []
                before = _cpu(pids)
                shared = _shared_cpu(broker)
                summary, records = await steady_run(peer, sizes, seed=n, tag=f"{name}{n}")
                stats = lateness_stats(records, expected=summary["n"]).to_dict()
                row[name] = {"stats": stats, "received": summary["received"]}
                if pids:  # its own processes' CPU per message: robust to others' load
                    row[name]["cpu_us_per_msg"] = round((_cpu(pids) - before) / n_msgs * 1e6, 1)
                row[name]["shared"] = _shared_per_msg(shared, _shared_cpu(broker), n_msgs)
                if name == "bridge":
                    bridge_records.append(records)
            runs.append(row)
            print(
                f"  round {n + 1}: p99 "
                + ", ".join(f"{k} {row[k]['stats']['p99_ms']:.0f}" for k in peers)
                + " ms (relay: the two hops, no delay); own CPU us/msg "
                + ", ".join(
                    f"{k} {row[k]['cpu_us_per_msg']:.0f}"
                    for k in peers
                    if "cpu_us_per_msg" in row[k]
                )
                + "; broker us/msg "
                + ", ".join(f"{k} {row[k]['shared'].get('broker_us_per_msg')}" for k in peers)
                + "; machine busy % "
                + ", ".join(f"{k} {row[k]['shared'].get('machine_busy_percent')}" for k in peers)
                + f"; before: load {row['load']['loadavg'][0]}, {row['load']['busy_percent']} %"
                " busy",
                file=sys.stderr,
            )
    finally:  # every peer, whatever another's cleanup raised: no bridge left running
        for name, peer in reversed(peers.items()):
            try:
                await peer.teardown()
            except Exception as exc:
                print(f"  {name}: cleanup failed ({exc!r})", file=sys.stderr)
    if logs is not None:
        handled = _handled(logs)
        for row, taken in zip(runs, bridge_records, strict=True):
            row["bridge"]["breakdown"] = breakdown(taken, handled)
        if keep_logs:
            print(f"  the bridges' logs: {logs}", file=sys.stderr)
        else:
            shutil.rmtree(logs, ignore_errors=True)

    def median(name: str, q: str) -> float:
        return float(statistics.median(r[name]["stats"][q] for r in runs))

    def minus(name: str, other: str, q: str) -> list[float]:
        """Side ``name``'s ``q`` lateness less ``other``'s, round by round."""
        return [r[name]["stats"][f"{q}_ms"] - r[other]["stats"][f"{q}_ms"] for r in runs]

    out: dict[str, Any] = {
        "rate": rate,
        "duration_s": duration,
        "delay_ms": [1000, 4000],
        "bridges": count,
        "breakdown": with_breakdown,
        "bridge_concurrency": concurrency,
    }
    for name in peers:
        out[name] = {q: median(name, q) for q in ("p50_ms", "p99_ms", "max_ms")}
        cpu = [r[name]["cpu_us_per_msg"] for r in runs if "cpu_us_per_msg" in r[name]]
        if cpu:
            out[name]["cpu_us_per_msg"] = statistics.median(cpu)
        for key in SHARED:
            values = [r[name]["shared"][key] for r in runs if r[name]["shared"].get(key)]
            if values:
                out[name][key] = round(statistics.median(values), 1)
        out[name]["early"] = sum(r[name]["stats"]["early"] for r in runs)
        out[name]["missing"] = sum(r[name]["stats"]["missing"] for r in runs)
    for q in ("p50", "p99"):
        added = minus("bridge", "direct", q)
        out[f"added_{q}_ms"] = statistics.median(added)
        out[f"added_{q}_ms_runs"] = added
        # what the bridge adds beyond its two hops done by bare clients
        beyond = [a - r["relay"]["stats"][f"{q}_ms"] for a, r in zip(added, runs, strict=True)]
        out[f"beyond_relay_{q}_ms"] = statistics.median(beyond)
        # what its whole path done by bare clients adds: the floor of the target
        bare = minus("bare", "direct", q)
        out[f"bare_added_{q}_ms"] = statistics.median(bare)
        out[f"bare_added_{q}_ms_runs"] = bare
    if variant is not None:  # the variant against the bridge, round by round
        out["variant_setup"] = {
            "root": str(variant.root) if variant.root else None,
            "args": list(variant.args),
            "nice": variant.nice,
        }
        for q in ("p50", "p99"):
            diff = minus(VARIANT, "bridge", q)
            out[f"variant_minus_bridge_{q}_ms"] = statistics.median(diff)
            out[f"variant_minus_bridge_{q}_ms_runs"] = diff
            added = minus(VARIANT, "direct", q)
            out[f"variant_added_{q}_ms"] = statistics.median(added)
            out[f"variant_added_{q}_ms_runs"] = added
    if with_breakdown:
        out["breakdown_median"] = {
            step: {
                q: statistics.median(r["bridge"]["breakdown"][step][q] for r in runs)
                for q in ("p50", "p99")
            }
            for step in STEPS
        }
    out["target_ms"] = 20  # at p99
    out["runs"] = runs
    return out


# ---------------------------------------------------------------------- main


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    topology = Topology(args.url)
    result: dict[str, Any] = {
        "machine": machine_info(),
        "broker": await broker_info(args.url),
        "load_before": machine_load(),
        "params": {"count": args.count, "rounds": args.rounds, "rate": args.rate},
    }
    variant = None
    if args.variant_root is not None or args.variant_args or args.variant_nice:
        root = args.variant_root
        variant = Variant(
            Topology(args.url, root), root, tuple(args.variant_args.split()), args.variant_nice
        )
    try:
        await asyncio.to_thread(topology.declare)
        if variant is not None:
            await asyncio.to_thread(variant.topology.declare)
        if "carry" in args.only:
            print(f"carry: {args.count:,} messages, {args.rounds} rounds", file=sys.stderr)
            result["carry"] = await asyncio.to_thread(carry, topology, args.count, args.rounds)
        if "lateness" in args.only:
            print(f"lateness at {args.rate:g} msgs/s, {args.rounds} rounds", file=sys.stderr)
            result["lateness"] = await lateness(
                topology,
                args.rate,
                args.duration,
                args.rounds,
                args.lateness_bridges,
                with_breakdown=args.breakdown or args.keep_logs,
                concurrency=args.bridge_concurrency,
                keep_logs=args.keep_logs,
                variant=variant,
            )
    finally:
        await asyncio.to_thread(topology.destroy)
        if variant is not None:
            await asyncio.to_thread(variant.topology.destroy)
    return result


def report(result: dict[str, Any]) -> str:
    lines = []
    if "carry" in result:
        c = result["carry"]
        lines.append(
            f"carry into the tiers: {c['bridges']} bridges {c['bridge_rate']:,.0f} msgs/s, sync "
            f"publish_many {c['publish_many_rate']:,.0f} msgs/s: {c['ratio']:.2f} x "
            f"(target >= {c['target']} x: {'met' if c['ratio'] >= c['target'] else 'missed'})"
        )
    if "lateness" in result:
        lt = result["lateness"]
        d, b = lt["direct"], lt["bridge"]
        lines.append(
            f"lateness at {lt['rate']:g} msgs/s ({lt['bridges']} bridges), p50 / p99 / max ms: "
            "direct "
            f"{d['p50_ms']:.0f} / {d['p99_ms']:.0f} / {d['max_ms']:.0f}, bridge "
            f"{b['p50_ms']:.0f} / {b['p99_ms']:.0f} / {b['max_ms']:.0f}; the bridge adds "
            f"{lt['added_p50_ms']:.0f} ms at p50 and "
            f"{lt['added_p99_ms']:.0f} ms at p99 (target <= {lt['target_ms']} ms: "
            f"{'met' if lt['added_p99_ms'] <= lt['target_ms'] else 'missed'}); early "
            f"{d['early']} / {b['early']}, missing {d['missing']} / {b['missing']}"
        )
        r = lt["relay"]
        lines.append(
            f"its two extra hops by bare clients (relay, no delay), p50 / p99 / max ms: "
            f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} / {r['max_ms']:.0f}; the bridge adds "
            f"{lt['beyond_relay_p50_ms']:.0f} ms at p50 and {lt['beyond_relay_p99_ms']:.0f} ms "
            "at p99 beyond them"
        )
        bare = lt.get("bare")
        if bare is not None:
            lines.append(
                f"its whole path by bare clients (bare: two relays, into the tiers and out), "
                f"p50 / p99 / max ms: {bare['p50_ms']:.0f} / {bare['p99_ms']:.0f} / "
                f"{bare['max_ms']:.0f}; they add {lt['bare_added_p50_ms']:.0f} ms at p50 and "
                f"{lt['bare_added_p99_ms']:.0f} ms at p99 to the direct path's (by round: "
                f"{lt['bare_added_p99_ms_runs']}); early {bare['early']}, missing "
                f"{bare['missing']}"
            )
        if "cpu_us_per_msg" in b and "cpu_us_per_msg" in r:
            lines.append(
                f"client CPU per message: the bridge processes {b['cpu_us_per_msg']:.0f} us, "
                f"the relay {r['cpu_us_per_msg']:.0f} us"
                + (f", the bare path's two relays {bare['cpu_us_per_msg']:.0f} us" if bare else "")
            )
        for name in (*SIDES, VARIANT):
            side = lt.get(name)
            if side and side.get("machine_us_per_msg") is not None:
                lines.append(
                    f"{name}: CPU per message, its own processes "
                    f"{side.get('cpu_us_per_msg', 0):.0f} us, the broker "
                    f"{side.get('broker_us_per_msg') or 0:.0f}, the bench "
                    f"{side.get('bench_us_per_msg') or 0:.0f}, the machine "
                    f"{side['machine_us_per_msg']:.0f} ({side.get('machine_busy_percent')} % busy)"
                )
        if VARIANT in lt:
            v = lt[VARIANT]
            lines.append(
                f"variant {lt['variant_setup']}: p50 / p99 / max {v['p50_ms']:.0f} / "
                f"{v['p99_ms']:.0f} / {v['max_ms']:.0f} ms; minus the bridge's, by round: p50 "
                f"{lt['variant_minus_bridge_p50_ms_runs']}, p99 "
                f"{lt['variant_minus_bridge_p99_ms_runs']}; it adds "
                f"{lt['variant_added_p50_ms']:.0f} ms at p50 and "
                f"{lt['variant_added_p99_ms']:.0f} ms at p99 to the direct path's "
                f"(by round: {lt['variant_added_p99_ms_runs']})"
            )
        if lt.get("breakdown_median"):
            steps = lt["breakdown_median"]
            lines.append(
                "the bridge's lateness per step, p50 / p99 ms: "
                + ", ".join(f"{k[:-3]} {v['p50']:.0f} / {v['p99']:.0f}" for k, v in steps.items())
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bridge", description=__doc__)
    p.add_argument("--url", default=os.environ.get("BENCH_AMQP_URL", DEFAULT_AMQP_URL))
    p.add_argument("--only", default="carry,lateness", type=lambda s: s.split(","))
    p.add_argument("--count", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=float, default=500)
    p.add_argument("--duration", type=float, default=4)
    p.add_argument("--lateness-bridges", type=int, default=BRIDGES)
    p.add_argument(
        "--bridge-concurrency",
        type=int,
        default=None,
        help="the lateness bridges' --concurrency (their prefetch too; default: the CLI's, 64)",
    )
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="the bridges log each message (JSON), and the bridge's lateness is split per step",
    )
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="--breakdown, and its bridges' logs are kept (the path is printed): when each "
        "handling started, and what else the bridge did meanwhile (a checkpoint written)",
    )
    p.add_argument(
        "--variant-root",
        type=Path,
        default=None,
        help="a fourth side each round: the bridge run from this tree (a git worktree of "
        "another revision), on an exchange of its own",
    )
    p.add_argument(
        "--variant-args",
        default="",
        help="the same, the bridge of this tree with these `bridge run` arguments added "
        "(with --variant-root: that tree's)",
    )
    p.add_argument(
        "--variant-nice",
        type=int,
        default=0,
        help="the same, the bridge of this tree (or --variant-root's) under `nice -n N`: "
        "on a machine it shares with the broker, how much yielding the CPU to it helps",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    result = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
