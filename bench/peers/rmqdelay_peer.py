"""rmqdelay itself as a peer: its topology, its publishers and its Worker.

* ``setup()`` applies the topology for one destination (``bench``) with
  :class:`rmqdelay.TopologyManager` under a private prefix, opens the publisher and starts
  the drain.
* ``publish()`` goes through :class:`rmqdelay.AsyncPublisher` (``publisher="async"``) or the
  pika :class:`rmqdelay.Publisher` (``"sync"``, in one dedicated thread), always
  ``publish_many`` with pipelined confirms. The bench timestamps travel in headers, and
  every :class:`rmqdelay.PublishResult` adds its ``hops`` to :attr:`hops_total`.
* The drain is the real :class:`rmqdelay.Worker` with one async handler that takes the
  arrival time. ``worker="subprocess"`` (default) runs it as its own process
  (:mod:`bench.peers.rmqdelay_worker`), the way ``rmqdelay worker`` is deployed;
  ``worker="inproc"`` runs it on this event loop (``Worker.running``).
* ``teardown()`` stops the worker, closes the publisher and destroys the prefix's topology.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from bench.common import DEFAULT_AMQP_URL, Record, now_ms
from bench.peers.base import Arrivals, Item, unique_prefix
from bench.peers.rmqdelay_worker import HDR_DUE, HDR_PUB, death_hops
from rmqdelay import (
    AsyncPublisher,
    Context,
    Publisher,
    PublishResult,
    Settings,
    TopologyManager,
    Worker,
    format_ms,
)

log = logging.getLogger(__name__)

DESTINATION = "bench"
PUBLISHERS = ("async", "sync")
WORKERS = ("subprocess", "inproc", "aiopika")
"""``aiopika`` is a diagnostic only: a bare aio-pika consumer instead of the Worker."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    import ctypes
    import signal

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


class RmqdelayPeer:
    """rmqdelay under a private prefix; see the module docstring."""

    supports_delay = True

    def __init__(
        self,
        url: str = DEFAULT_AMQP_URL,
        queue_type: str = "quorum",
        *,
        radix: int = 16,
        resolution_ms: int = 10,
        named_tiers: Sequence[str] = (),
        max_delay: str | None = None,
        publisher: str = "async",
        worker: str = "subprocess",
        concurrency: int = 64,
        prefetch: int | None = 256,
        window: int = 1000,
        body_bytes: int = 100,
        worker_log_level: str = "WARNING",
        label: str | None = None,
        journal: bool = True,
        journal_linger_ms: int | None = None,
        held: bool = False,
        lean: bool = False,
        hold_window: str | None = None,
    ) -> None:
        if publisher not in PUBLISHERS:
            raise ValueError(f"publisher must be one of {PUBLISHERS}")
        if worker not in WORKERS:
            raise ValueError(f"worker must be one of {WORKERS}")
        if lean and not held:
            raise ValueError("lean needs held: only a held layout leaves low tiers unused")
        self.prefix = unique_prefix("rmqdelay")
        self.settings_kwargs: dict[str, Any] = {
            "url": url,
            "prefix": self.prefix,
            "resolution": f"{resolution_ms}ms",
            "radix": radix,
            "named_tiers": list(named_tiers),
            "max_delay": max_delay,
            "positions": None,
            "queue_type": queue_type,
            "destinations": [],
            "connection_name": self.prefix,
            "schedule_journal": journal,
            **({} if journal_linger_ms is None else {"journal_linger": f"{journal_linger_ms}ms"}),
            "held_destinations": [DESTINATION] if held else [],
            **({} if hold_window is None else {"hold_window": hold_window}),
        }
        self.settings = Settings(**self.settings_kwargs)  # validates now; creates nothing
        self.radix, self.resolution_ms = radix, resolution_ms
        self.named_tiers = list(named_tiers)
        self.queue_type = queue_type
        self.held, self.lean = held, lean
        self.publisher_kind, self.worker_kind = publisher, worker
        self.concurrency, self.prefetch, self.window = concurrency, prefetch, window
        self.worker_log_level = worker_log_level
        self.body = b"x" * body_bytes
        named = "+named " + ",".join(named_tiers) if named_tiers else ""
        self.name = label or (
            f"rmqdelay-r{radix}{'-named' if named_tiers else ''}-{publisher}-{queue_type}"
            + ("-held" if held else "")
            + ("-lean" if lean else "")
            + ("" if hold_window is None else f"-{hold_window}")
        )
        layout = self.settings_layout()
        self.description = (
            f"rmqdelay {_version()} (this project): radix {radix}{named}, resolution "
            f"{format_ms(resolution_ms)}, {queue_type} tier queues, journal "
            f"{'on' if journal else 'off'}"
            f"{'' if journal_linger_ms is None else f', journal_linger {journal_linger_ms} ms'} "
            f"({len(layout.tiers)} tiers, {len(layout.positions)} "
            f"positions), topology applied by rmqdelay.TopologyManager. "
            + (_held_words(layout, lean) if held else "")
            + "Published with "
            + (
                "rmqdelay.AsyncPublisher (aio-pika)"
                if publisher == "async"
                else "rmqdelay.Publisher (pika, one thread)"
            )
            + f".publish_many (pipelined confirms, window {window}, mandatory, persistent). "
            f"Drained by the real rmqdelay.Worker (async handler, concurrency {concurrency}, "
            f"prefetch {prefetch or 'the Worker default'}, log level {worker_log_level}) "
            + (
                "in its own process (like `rmqdelay worker`)."
                if worker == "subprocess"
                else "on the publisher's event loop."
            )
        )
        self.arrivals = Arrivals()
        self.hops_total = 0
        self.published_total = 0
        self.hops_hist: Counter[int] = Counter()
        self.death_hops_total = 0
        self.death_hops_count = 0
        self.cleanup_errors: list[str] = []
        self._apub: AsyncPublisher | None = None
        self._spub: Publisher | None = None
        self._exec: ThreadPoolExecutor | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._err_reader: asyncio.Task[None] | None = None
        self._stderr_tail: list[str] = []
        self._worker_cm: Any = None
        self._topology_applied = False
        self._torn_down = False

    def settings_layout(self) -> Any:
        return self.settings.layout

    def unused_tiers(self) -> list[str]:
        """Tier queues a held destination's messages never enter: those whose TTL is no
        multiple of the hold window (its low digits are rounded away; at the window's own
        position, the digits that are no multiple of its divisor, 2 x 16**2: the odd ones)."""
        layout = self.settings_layout()
        return [t.queue for t in layout.tiers if t.units % layout.hold_units]

    # ------------------------------------------------------------------ lifecycle

    async def setup(self) -> None:
        try:
            self._topology_applied = True  # destroy even a half-applied topology
            await asyncio.to_thread(self._apply)
            if self.publisher_kind == "async":
                self._apub = await AsyncPublisher(self.settings, window=self.window).connect()
            else:
                self._exec = ThreadPoolExecutor(1, thread_name_prefix=f"{self.prefix}-pub")
                loop = asyncio.get_running_loop()
                self._spub = await loop.run_in_executor(self._exec, self._sync_connect)
            if self.worker_kind == "subprocess":
                await self._start_subprocess()
            elif self.worker_kind == "inproc":
                await self._start_inproc()
            else:
                await self._start_aiopika()
        except BaseException:
            await self.teardown()
            raise

    async def apply_only(self) -> None:
        """The topology alone, no publisher or worker (``teardown()`` destroys it): what
        idle tier queues cost the broker."""
        self._topology_applied = True
        await asyncio.to_thread(self._apply)

    def _apply(self) -> None:
        with TopologyManager(self.settings) as manager:
            manager.apply([DESTINATION])
        if self.lean:
            self._delete_unused()

    def _delete_unused(self) -> None:
        """What a layout made for held destinations only would not declare (their
        bindings go with them; ``destroy`` skips what is missing)."""
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(self.settings_kwargs["url"]))
        try:
            channel = connection.channel()
            for queue in self.unused_tiers():
                channel.queue_delete(queue)
        finally:
            connection.close()

    def _sync_connect(self) -> Publisher:
        return Publisher(self.settings, window=self.window).connect()

    async def _start_subprocess(self) -> None:
        argv = [
            sys.executable, "-m", "bench.peers.rmqdelay_worker", json.dumps(self.settings_kwargs),
            "--destination", DESTINATION,
            "--concurrency", str(self.concurrency),
            "--log-level", self.worker_log_level,
            *(["--prefetch", str(self.prefetch)] if self.prefetch else []),
        ]  # fmt: skip
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            preexec_fn=_die_with_parent,
            limit=1 << 20,
        )
        self._err_reader = asyncio.create_task(self._read_stderr())
        assert self._proc.stdout is not None
        line = await asyncio.wait_for(self._proc.stdout.readline(), 60)
        if line.strip() != b"READY":
            await asyncio.sleep(0.2)
            raise RuntimeError(
                f"rmqdelay worker did not start ({line!r}): " + " | ".join(self._stderr_tail[-8:])
            )
        self._reader = asyncio.create_task(self._read_stdout())

    async def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        stream = self._proc.stdout
        while True:
            line = await stream.readline()
            if not line:
                return
            parts = line.split()
            if len(parts) != 6:
                continue  # READY / DONE
            mid, pub, due, received, hops, _attempt = parts
            self.death_hops_total += int(hops)
            self.death_hops_count += 1
            self.arrivals.add(Record(mid.decode(), int(due), int(received), int(pub)))

    async def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        while True:
            line = await self._proc.stderr.readline()
            if not line:
                return
            self._stderr_tail = [*self._stderr_tail[-49:], line.decode(errors="replace").rstrip()]

    async def _start_inproc(self) -> None:
        app = Worker(self.settings)

        @app.handler(DESTINATION, max_attempts=1)
        async def on_message(body: bytes, ctx: Context) -> None:
            received = time.time_ns() // 1_000_000
            headers = ctx.headers
            self.death_hops_total += death_hops(headers)
            self.death_hops_count += 1
            self.arrivals.add(
                Record(
                    ctx.message_id,
                    int(headers.get(HDR_DUE, -1)),
                    received,
                    int(headers.get(HDR_PUB, -1)),
                )
            )

        self._worker_cm = app.running(
            self.settings, concurrency=self.concurrency, prefetch=self.prefetch
        )
        await self._worker_cm.__aenter__()

    async def _start_aiopika(self) -> None:
        import aio_pika

        self._consumer_conn = await aio_pika.connect(self.settings.url.get_secret_value())
        channel = await self._consumer_conn.channel()
        await channel.set_qos(prefetch_count=self.prefetch or self.concurrency)
        layout = self.settings_layout()
        queue = await channel.get_queue(layout.work_queue(DESTINATION), ensure=False)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            received = time.time_ns() // 1_000_000
            headers = message.headers or {}
            self.death_hops_total += death_hops(headers)
            self.death_hops_count += 1
            pub, due = headers.get(HDR_PUB, -1), headers.get(HDR_DUE, -1)
            assert isinstance(pub, int) and isinstance(due, int)
            self.arrivals.add(Record(str(message.message_id), due, received, pub))
            await message.ack()

        await queue.consume(on_message)

    # ------------------------------------------------------------------ protocol

    def _requests(self, batch: Sequence[Item]) -> list[dict[str, Any]]:
        requests = []
        for mid, delay_ms in batch:
            published = now_ms()
            requests.append(
                {
                    "destination": DESTINATION,
                    "body": self.body,
                    "delay": timedelta(milliseconds=max(0, delay_ms)),
                    "message_id": mid,
                    "headers": {HDR_PUB: published, HDR_DUE: published + max(0, delay_ms)},
                }
            )
        return requests

    def _count(self, results: list[PublishResult]) -> None:
        for result in results:
            self.hops_total += result.hops
            self.hops_hist[result.hops] += 1
        self.published_total += len(results)

    async def publish(self, batch: Sequence[Item]) -> None:
        if not batch:
            return
        if self._apub is not None:
            self._count(await self._apub.publish_many(self._requests(batch)))
            return
        assert self._spub is not None and self._exec is not None, "setup() first"
        spub = self._spub

        def send() -> list[PublishResult]:
            # Timestamps taken in the publishing thread, right before the client call.
            return spub.publish_many(self._requests(batch))

        self._count(await asyncio.get_running_loop().run_in_executor(self._exec, send))

    async def drain(self, expected_ids: Collection[str], timeout: float) -> list[Record]:
        records = await self.arrivals.wait_for(expected_ids, timeout)
        if (
            self._proc is not None
            and self._proc.returncode is not None
            and len(records) < len(expected_ids)
        ):
            raise RuntimeError(
                f"rmqdelay worker exited with {self._proc.returncode}: "
                + " | ".join(self._stderr_tail[-8:])
            )
        return records

    def cpu_pids(self) -> dict[str, int]:
        """Processes of this design besides the broker and this one (for CPU accounting)."""
        return {"worker": self._proc.pid} if self._proc is not None else {}

    @property
    def mean_hops(self) -> float | None:
        return self.hops_total / self.published_total if self.published_total else None

    def reset_counters(self) -> None:
        self.hops_total = self.published_total = 0
        self.death_hops_total = self.death_hops_count = 0
        self.hops_hist.clear()
        self.arrivals.duplicates = 0

    def counters(self) -> dict[str, Any]:
        return {
            "published": self.published_total,
            "mean_hops": None if self.mean_hops is None else round(self.mean_hops, 4),
            "hops_histogram": {str(k): v for k, v in sorted(self.hops_hist.items())},
            "mean_x_death_hops": (
                round(self.death_hops_total / self.death_hops_count, 4)
                if self.death_hops_count
                else None
            ),
            "x_death_hops_total": self.death_hops_total,
            "x_death_count": self.death_hops_count,
            "duplicates": self.arrivals.duplicates,
        }

    async def teardown(self) -> None:
        if self._torn_down:
            return
        self._torn_down = True
        await self._stop_worker()
        if self._apub is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._apub.close(), 10)
        if self._spub is not None and self._exec is not None:
            spub = self._spub
            with contextlib.suppress(Exception):
                await asyncio.get_running_loop().run_in_executor(self._exec, spub.close)
        if self._exec is not None:
            self._exec.shutdown(wait=False)
        if self._topology_applied:
            for attempt, pause in enumerate((2.0, 5.0, 15.0, None), 1):
                try:
                    await asyncio.to_thread(self._destroy)
                    break
                except Exception as exc:  # a busy shared broker: try again, then report
                    if pause is None:
                        self.cleanup_errors.append(f"destroy {self.prefix} ({attempt}x): {exc!r}")
                    else:
                        await asyncio.sleep(pause)
        for err in self.cleanup_errors:
            log.warning("%s cleanup: %s", self.prefix, err)

    def _destroy(self) -> None:
        with TopologyManager(self.settings) as manager:
            manager.destroy([DESTINATION], force=True)

    async def _stop_worker(self) -> None:
        conn = getattr(self, "_consumer_conn", None)
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 10)
        if self._worker_cm is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._worker_cm.__aexit__(None, None, None), 40)
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 40)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for task in (self._reader, self._err_reader):
            if task is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(task, 5)


def _held_words(layout: Any, lean: bool) -> str:
    unused = sum(1 for t in layout.tiers if t.units % layout.hold_units)
    return (
        f"Destination held (Settings(held_destinations=[{DESTINATION!r}])): publishers round "
        f"each delay down to the hold window {format_ms(layout.hold_ms)}, so the messages skip "
        "the digits below it and reach the work queue up to that early; the Worker holds each "
        "unacked until its rmqdelay-due-at. "
        + (
            f"Lean: the {unused} tier queues below the window (unused when held) are deleted "
            "after apply. "
            if lean
            else ""
        )
    )


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("rmqdelay")
    except Exception:
        return "?"
