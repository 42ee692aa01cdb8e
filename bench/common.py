"""Shared measurement helpers for the benchmark suite.

Everything runs on one machine, so every timestamp is wall-clock epoch milliseconds taken
with :func:`now_ms` (``time.time_ns() // 1_000_000``) in whichever process observes the
event; producer and consumer clocks are the same clock.

A peer produces one :class:`Record` per delivered message. :func:`lateness_stats` turns a
list of them into p50/p99/max lateness and an early count; :func:`median_of` folds repeated
runs; :func:`machine_info` and :func:`broker_info` describe where the figures came from.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: ``BENCH_AMQP_URL``, else ``RMQDELAY_URL`` (what ``make bench`` exports), else the local broker.
DEFAULT_AMQP_URL = (
    os.environ.get("BENCH_AMQP_URL")
    or os.environ.get("RMQDELAY_URL")
    or "amqp://guest:guest@127.0.0.1:5672/"
)


def masked(command: Iterable[str]) -> list[str]:
    """A recorded command line with every broker URL's password masked: results files
    are committed, and no password is ever written out."""
    from rmqdelay import mask_url

    return [mask_url(a) if a.startswith(("amqp://", "amqps://")) else a for a in command]


def now_ms() -> int:
    """Epoch milliseconds (integer), the one clock every record uses."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Record:
    """One delivered message, as seen by the consumer.

    ``published_at_ms``: just before the publisher handed the message to its client library.
    ``due_at_ms``: ``published_at_ms + requested delay`` (the *requested* delay, before any
    rounding the design applies, so rounding shows up as lateness).
    ``received_at_ms``: when the consumer callback saw the message (or the poller popped it).
    """

    message_id: str
    due_at_ms: int
    received_at_ms: int
    published_at_ms: int

    @property
    def lateness_ms(self) -> int:
        """Positive = late, negative = early."""
        return self.received_at_ms - self.due_at_ms

    @property
    def early(self) -> bool:
        return self.received_at_ms < self.due_at_ms

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (p in 0..100)."""
    if not sorted_values:
        return math.nan
    if p <= 0:
        return float(sorted_values[0])
    rank = math.ceil(p / 100.0 * len(sorted_values))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


@dataclass(frozen=True, slots=True)
class LatenessStats:
    count: int
    missing: int
    early: int
    min_ms: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def lateness_stats(records: Iterable[Record], expected: int | None = None) -> LatenessStats:
    """p50/p99/max lateness (nearest rank), early count, and missing = expected - received."""
    recs = list(records)
    values = sorted(float(r.lateness_ms) for r in recs)
    n = len(values)
    return LatenessStats(
        count=n,
        missing=max(0, (expected if expected is not None else n) - n),
        early=sum(1 for r in recs if r.early),
        min_ms=values[0] if values else math.nan,
        p50_ms=percentile(values, 50),
        p99_ms=percentile(values, 99),
        max_ms=values[-1] if values else math.nan,
        mean_ms=statistics.fmean(values) if values else math.nan,
    )


# ---------------------------------------------------------------- rates and timing


def rate_per_s(count: int, seconds: float) -> float:
    """Messages per second; NaN when nothing was timed."""
    return count / seconds if seconds > 0 else math.nan


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds`` (monotonic, perf_counter)."""

    def __init__(self) -> None:
        self._start = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start


def delivery_rate(records: Sequence[Record]) -> float:
    """End-to-end throughput: messages / (last received - first published), per second."""
    if not records:
        return math.nan
    first = min(r.published_at_ms for r in records)
    last = max(r.received_at_ms for r in records)
    return rate_per_s(len(records), (last - first) / 1000.0)


def due_delivery_rate(records: Sequence[Record]) -> float:
    """Delivered per second: messages / (last received - first due), per second.

    For a design without delays (``due = published``) this is :func:`delivery_rate`.
    Once messages fall due faster than a design delivers them, it is that design's
    delivery capacity; below that, it is the offered rate.
    """
    if not records:
        return math.nan
    first = min(r.due_at_ms for r in records)
    last = max(r.received_at_ms for r in records)
    return rate_per_s(len(records), max(1, last - first) / 1000.0)


#: The lateness quantiles kept per design (percent): every 0.5 % and a finer tail.
QUANTILE_GRID: tuple[float, ...] = tuple(
    [i / 2 for i in range(0, 198)] + [99.0 + i / 10 for i in range(0, 11)]
)


def quantiles(values: Iterable[float], grid: Sequence[float] = QUANTILE_GRID) -> list[float]:
    """Nearest-rank quantiles of ``values`` at each percent of ``grid`` (for CDF plots)."""
    ordered = sorted(values)
    return [percentile(ordered, p) for p in grid]


def median_of(runs: Sequence[Any]) -> Any:
    """Median of repeated runs.

    * numbers -> their median;
    * mappings -> a dict with, per key, the median of the numeric values (recursing into
      nested mappings) and the first run's value for anything non-numeric.
    """
    if not runs:
        raise ValueError("median_of needs at least one run")
    first = runs[0]
    if isinstance(first, Mapping):
        out: dict[str, Any] = {}
        for key, value in first.items():
            column = [r[key] for r in runs if isinstance(r, Mapping) and key in r]
            if isinstance(value, bool) or value is None:
                out[key] = value
            elif isinstance(value, (int, float)) and all(
                isinstance(v, (int, float)) for v in column
            ):
                out[key] = statistics.median(column)
            elif isinstance(value, Mapping):
                out[key] = median_of(column)
            else:
                out[key] = value
        out["runs"] = len(runs)
        return out
    return statistics.median(runs)


# ---------------------------------------------------------------- machine and broker


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_mb() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_mb": _mem_total_mb(),
        "python": sys.version.split()[0],
        "python_impl": platform.python_implementation(),
        "platform": platform.platform(),
    }


def rss_kb() -> int:
    """Current resident set size of this process, from /proc/self/status (VmRSS)."""
    try:
        with open("/proc/self/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource  # fallback: peak, not current

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (and its waited-for children), from /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        # fields[11..14] = utime, stime, cutime, cstime (counted from after the comm field)
        return sum(int(v) for v in fields[11:15]) / ticks
    except (OSError, ValueError, IndexError):
        return None


def broker_pid(url: str | None = None) -> int | None:
    """The pid of the local RabbitMQ node (``beam.smp``) that listens on ``url``'s port
    ($RMQDELAY_URL by default): this machine may run several nodes."""
    from urllib.parse import urlsplit

    port = urlsplit(url or os.environ.get("RMQDELAY_URL", DEFAULT_AMQP_URL)).port or 5672
    inodes = _listening_inodes(port)
    beams = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm", encoding="ascii") as fh:
                if fh.read().strip() != "beam.smp":
                    continue
            beams.append(int(entry))
            for fd in os.listdir(f"/proc/{entry}/fd"):
                if os.readlink(f"/proc/{entry}/fd/{fd}") in inodes:
                    return int(entry)
        except OSError:
            continue
    return beams[0] if len(beams) == 1 else None


def _listening_inodes(port: int) -> set[str]:
    """``socket:[inode]`` of every TCP socket listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                next(fh)
                for line in fh:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        found.add(f"socket:[{fields[9]}]")
        except OSError:
            continue
    return found


class CpuMeter:
    """CPU seconds used by named processes over a block: ``{"broker": s, "client": s, ...}``.

    The broker is shared: its figure includes whatever else it did meanwhile.
    """

    def __init__(self, pids: Mapping[str, int | None]) -> None:
        self.pids = {name: pid for name, pid in pids.items() if pid}
        self.start: dict[str, float | None] = {}
        self.wall_start = 0.0
        self.result: dict[str, Any] = {}

    def __enter__(self) -> CpuMeter:
        self.start = {name: proc_cpu_seconds(pid) for name, pid in self.pids.items()}
        self.start["machine"] = machine_cpu_seconds()
        self.wall_start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self.wall_start
        out: dict[str, Any] = {"wall_s": round(wall, 3)}
        ends = {name: proc_cpu_seconds(pid) for name, pid in self.pids.items()}
        ends["machine"] = machine_cpu_seconds()
        for name, end in ends.items():
            begin = self.start.get(name)
            out[f"{name}_cpu_s"] = None if end is None or begin is None else round(end - begin, 3)
        self.result = out


@dataclass(frozen=True)
class Settled:
    """What a process spent until it went quiet, and its rate then (CPU s per s)."""

    cpu_s: float
    wall_s: float
    rate: float


SETTLE_WINDOW_S = 1.0
SETTLE_MAX_S = 10.0
SETTLE_MARGIN = 0.002
"""CPU s per s: a window within this of the one before it is as quiet as the broker gets."""


async def settle(pid: int | None, max_s: float = SETTLE_MAX_S) -> Settled | None:
    """Wait until a process goes quiet: :data:`SETTLE_WINDOW_S` windows until one uses no
    more CPU than the one before it (within :data:`SETTLE_MARGIN`), or ``max_s``.

    A broker keeps working for seconds after a run's last message (Raft snapshots, segment
    writes, a stream's chunks): before a run this keeps the previous run's tail out of it,
    after a run it is that run's own, and its last window is the broker's idle rate.
    """
    import asyncio

    if pid is None or (start := proc_cpu_seconds(pid)) is None:
        return None
    began, last, previous = time.perf_counter(), start, None
    while True:
        await asyncio.sleep(SETTLE_WINDOW_S)
        now = proc_cpu_seconds(pid)
        if now is None:
            return None
        rate, last = (now - last) / SETTLE_WINDOW_S, now
        wall = time.perf_counter() - began
        quiet = previous is not None and rate <= previous + SETTLE_MARGIN
        if quiet or wall >= max_s:
            return Settled(cpu_s=now - start, wall_s=wall, rate=rate)
        previous = rate


async def idle_cpu_rate(pid: int | None, seconds: float = 0.5) -> float | None:
    """CPU seconds per second a process uses while we send it nothing (its background)."""
    import asyncio

    if pid is None:
        return None
    start = proc_cpu_seconds(pid)
    await asyncio.sleep(seconds)
    end = proc_cpu_seconds(pid)
    return None if start is None or end is None else (end - start) / seconds


def machine_cpu_seconds() -> float | None:
    """Busy CPU seconds of the whole machine (all cores), from /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            parts = fh.readline().split()[1:]
        values = [int(v) for v in parts]
        busy = sum(values) - values[3] - (values[4] if len(values) > 4 else 0)  # - idle, iowait
        return busy / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None


def _decode(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


async def broker_info(url: str = DEFAULT_AMQP_URL) -> dict[str, Any]:
    """Broker product/version from the AMQP connection's server_properties."""
    import aio_pika

    conn = await aio_pika.connect(url)
    try:
        props = conn.transport.connection.server_properties  # type: ignore[union-attr]
        return {
            "product": _decode(props.get("product")),
            "version": _decode(props.get("version")),
            "platform": _decode(props.get("platform")),
        }
    finally:
        await conn.close()


def machine_load(window_s: float = 3.0) -> dict[str, Any]:
    """How busy the whole machine was over the last ``window_s`` seconds (others' jobs move
    the figures): taken just before each workload."""
    start = machine_cpu_seconds()
    time.sleep(window_s)
    end = machine_cpu_seconds()
    cores = os.cpu_count() or 1
    busy = None if start is None or end is None else round((end - start) / window_s / cores * 100)
    return {
        "window_s": window_s,
        "busy_percent": busy,
        "loadavg": [round(v, 2) for v in os.getloadavg()],
    }


class Management:
    """The bench's own management API client (the package's is not public): the API named
    by ``RMQDELAY_MANAGEMENT_URL``, else the AMQP host on :15672, with the AMQP URL's user."""

    def __init__(self, amqp_url: str, timeout: float = 30.0) -> None:
        import base64
        from urllib.parse import unquote, urlsplit

        amqp = urlsplit(amqp_url)
        api = os.environ.get("RMQDELAY_MANAGEMENT_URL", "").split(",")[0].strip()
        self.base = api.rstrip("/") or f"http://{amqp.hostname or 'localhost'}:15672"
        user, password = unquote(amqp.username or "guest"), unquote(amqp.password or "guest")
        self._auth = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.vhost = unquote(amqp.path[1:]) if len(amqp.path) > 1 else "/"
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """``method`` on ``/api/{path}`` (with ``body`` as JSON); its JSON decoded (None for
        an empty answer)."""
        import json
        import urllib.request

        headers = {"Authorization": f"Basic {self._auth}", "X-Reason": "rmqdelay bench"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(
            f"{self.base}/api/{path}", data=data, method=method, headers=headers
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def get(self, path: str) -> Any:
        return self.call("GET", path)
