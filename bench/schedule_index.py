"""The dashboard's first page of ``scheduled`` against ``rmqdelay scheduled list --limit 50``.

    python -m bench.schedule_index                      # 1,000,000 pending, 3 rounds
    python -m bench.schedule_index --messages 20000 --repeats 5

Fills a fresh prefix's journal with ``--messages`` pending messages (``--fill publish``:
the ``list`` workload's filler, ``publish_many``, delays of an hour; ``--fill journal``:
their journal records alone, see :func:`fill_journal`), starts an
:class:`~rmqdelay.dashboard.follow.StoreFollower` in this process and waits until
it has read the journal (a running dashboard). A checkpoint is written after the fill
(as a running worker writes one), so a fresh start reads it, not the whole journal. It
then times, in alternating rounds after one untimed warm-up round that checks the
answers:

- ``limit``: ``rmqdelay scheduled list --limit 50`` in a fresh process (the reference:
  what answers "the first 50" today; it reads and folds the whole journal);
- ``cold``: a fresh process that starts a follower, waits until it has read the journal
  and asks the first page (a dashboard just started); its own split (read, page) too;
- ``warm``: the first page asked of the follower already running (what a running
  dashboard does for each request), soonest first; ``warm newest`` newest first;
- ``warm fresh``: ``caught_up()`` (a marker appended and read back: everything written
  before is in) and then the first page;
- ``http``: ``GET /api/scheduled?limit=50`` of ``rmqdelay dashboard`` started before the
  rounds (its own follower; ``dashboard.first_page_s``: how long after its start it
  first answered).

Fresh processes are timed with their peak RSS (:func:`bench.scheduled_list.run`). Prints
medians and ratios to ``limit``; writes ``bench/results/index.json`` (or ``--out``).
The journal and topology are deleted after.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import machine_load, now_ms
from bench.scheduled_list import DESTINATION, fill, parse_args, prepare, run, write_results
from rmqdelay import Settings, TopologyManager
from rmqdelay.dashboard.pages import Order

RESULTS = Path(__file__).resolve().parent / "results" / "index.json"
LIMIT = 50
WARM_CALLS = 20
"""Page queries per round of each warm case; the round's figure is their median."""

#: A dashboard started now: connect, read the journal into the index, answer a page.
COLD = """\
import asyncio, json, sys, time
started = time.perf_counter()
from rmqdelay import Settings
from rmqdelay.amqp.connections import connect_async
from rmqdelay.dashboard.follow import StoreFollower
from rmqdelay.dashboard.pages import PageQuery
from rmqdelay.dashboard.store import ScheduleStore

async def main():
    settings = Settings()
    connection = await connect_async(settings, "index")
    follower = await StoreFollower(connection, settings, ScheduleStore()).start()
    await follower.caught_up(timeout=1200)
    read = time.perf_counter()
    page = follower.store.page(PageQuery(limit=int(sys.argv[1])), time.time_ns() // 10**6)
    done = time.perf_counter()
    print(json.dumps({"rows": len(page.rows), "total": page.total,
                      "read_s": read - started, "page_s": done - read}))
    await follower.close()
    await connection.close()

asyncio.run(main())
"""


def fill_journal(settings: Settings, messages: int) -> float:
    """Append the journal records ``messages`` publishes would write (as :func:`fill`
    publishes them: delays of an hour, 100-byte bodies), without the messages: both sides
    read only the journal, and a million messages in quorum tiers on the shared broker
    once left it not answering AMQP handshakes. The seconds it took."""
    from rmqdelay.amqp.connections import connect_blocking
    from rmqdelay.amqp.journal import run_journal
    from rmqdelay.core.journal import reading as journal_reading
    from rmqdelay.core.journal.records import JournalRecord
    from rmqdelay.core.publishing.templates import new_message_id

    started = time.perf_counter()
    connection = connect_blocking(settings, "bench-fill")
    try:
        for base in range(0, messages, 10_000):
            now = now_ms()
            records = [
                JournalRecord(
                    "scheduled",
                    new_message_id(),
                    DESTINATION,
                    now + (3600 + i % 600) * 1000,
                    body_size=100,
                    recorded_at_ms=now,
                )
                for i in range(base, min(base + 10_000, messages))
            ]
            flow = journal_reading.append(settings.layout, records)
            run_journal(flow, connection, lambda: connection)
    finally:
        connection.close()
    return time.perf_counter() - started


def _destroy(settings: Settings) -> None:
    """Delete the bench's topology; if the broker cannot be reached, say what is left
    (a million records) instead of hiding why the bench stopped."""
    from rmqdelay.errors import RmqDelayError

    try:
        with TopologyManager(settings) as manager:
            manager.destroy(force=True)
    except RmqDelayError as exc:
        print(f"index: {settings.prefix}.* NOT deleted ({exc}): delete it", file=sys.stderr)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as answer:
        body: bytes = answer.read()
        return body


def _first_answer(url: str, limit_s: float) -> float:
    """Seconds until ``url`` first answers 200 (the dashboard starting: its first read)."""
    started = time.perf_counter()
    while True:
        try:
            _get(url)
            return time.perf_counter() - started
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.perf_counter() - started > limit_s:
                raise
            time.sleep(0.2)


def _http(url: str) -> float:
    """Median seconds of ``WARM_CALLS`` GETs of the first page of the running dashboard."""
    times = []
    for _ in range(WARM_CALLS):
        started = time.perf_counter()
        page = json.loads(_get(url))
        times.append(time.perf_counter() - started)
        assert len(page["rows"]) == LIMIT, f"the API's page has {len(page['rows'])} rows"
    return statistics.median(times)


def _median(runs: list[float]) -> float:
    return statistics.median(runs) if runs else float("nan")


async def _warm(follower: Any, order: Order, fresh: bool) -> tuple[float, int]:
    """Median seconds of ``WARM_CALLS`` first-page answers, and the page's total."""
    from rmqdelay.dashboard.pages import PageQuery

    times: list[float] = []
    total = 0
    for _ in range(WARM_CALLS):
        started = time.perf_counter()
        if fresh:
            await follower.caught_up(timeout=60)
        page = follower.store.page(PageQuery(order=order, limit=LIMIT), time.time_ns() // 10**6)
        times.append(time.perf_counter() - started)
        assert len(page.rows) == LIMIT, f"the warm page has {len(page.rows)} rows"
        total = page.total
    return statistics.median(times), total


async def measure(url: str, messages: int, repeats: int, how: str) -> dict[str, Any]:
    from rmqdelay.amqp.checkpoints import write_checkpoint
    from rmqdelay.amqp.connections import connect_async
    from rmqdelay.dashboard.follow import StoreFollower
    from rmqdelay.dashboard.store import ScheduleStore

    settings, env = prepare(url, "index")
    rmqdelay = str(Path(sys.executable).with_name("rmqdelay"))
    limit_argv = [rmqdelay, "scheduled", "list", "--limit", str(LIMIT)]
    cold_argv = [sys.executable, "-c", COLD, str(LIMIT)]
    processes = {"limit": limit_argv, "cold": cold_argv}
    times: dict[str, list[float]] = {
        name: [] for name in ("limit", "cold", "warm", "warm newest", "warm fresh", "http")
    }
    port = _free_port()
    page_url = f"http://127.0.0.1:{port}/api/scheduled?limit={LIMIT}"
    dashboard: subprocess.Popen[bytes] | None = None
    http_first_s = float("nan")
    rss: dict[str, list[float]] = {"limit": [], "cold": []}
    cold_split: dict[str, list[float]] = {"read_s": [], "page_s": []}
    connection = None
    follower = None
    try:
        filler = fill if how == "publish" else fill_journal
        fill_s = await asyncio.to_thread(filler, settings, messages)
        what = "published" if how == "publish" else "journal records written"
        print(f"index: {messages:,} pending {what} in {fill_s:.1f} s", file=sys.stderr)
        started = time.perf_counter()
        written = await asyncio.to_thread(write_checkpoint, settings, writer="bench")
        checkpoint_s = time.perf_counter() - started
        print(f"index: checkpoint {written.outcome} in {checkpoint_s:.1f} s", file=sys.stderr)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        connection = await connect_async(settings, "bench-index")
        follower = await StoreFollower(connection, settings, ScheduleStore()).start()
        await follower.caught_up(timeout=1200)
        follow_s = time.perf_counter() - started
        follow_rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
        print(f"index: the running follower read them in {follow_s:.1f} s", file=sys.stderr)
        # `rmqdelay dashboard` (its HTTP API): started now, its first page once it has
        # read the journal, then timed in the rounds
        dashboard = subprocess.Popen(
            [rmqdelay, "dashboard", "--port", str(port), "--state", ":memory:"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        http_first_s = await asyncio.to_thread(_first_answer, page_url, 1200)
        print(f"index: the dashboard answered first after {http_first_s:.1f} s", file=sys.stderr)
        # warm-up round: the answers checked
        out = (await asyncio.to_thread(run, limit_argv, env))[2]
        assert len(out.splitlines()) == LIMIT + 3, f"--limit printed {len(out.splitlines())}"
        said = json.loads((await asyncio.to_thread(run, cold_argv, env))[2])
        assert said["rows"] == LIMIT and said["total"] == messages, said
        assert (await _warm(follower, "soonest", False))[1] == messages
        for _ in range(repeats):
            for name, argv in processes.items():
                elapsed, peak, out = await asyncio.to_thread(run, argv, env)
                times[name].append(round(elapsed, 3))
                rss[name].append(round(peak, 1))
                if name == "cold":
                    said = json.loads(out)
                    for part in cold_split:
                        cold_split[part].append(round(said[part], 4))
            warm_cases: tuple[tuple[str, Order, bool], ...] = (
                ("warm", "soonest", False),
                ("warm newest", "newest", False),
                ("warm fresh", "soonest", True),
            )
            for name, order, fresh in warm_cases:
                times[name].append(round((await _warm(follower, order, fresh))[0], 6))
            times["http"].append(round(await asyncio.to_thread(_http, page_url), 6))
    finally:
        if dashboard is not None:
            dashboard.terminate()
            dashboard.wait(30)
        if follower is not None:
            await follower.close()
        if connection is not None:
            await connection.close()
        _destroy(settings)
    reference = _median(times["limit"])
    results: dict[str, Any] = {
        name: {
            "median_s": round(_median(runs), 6),
            "runs_s": runs,
            "ratio_to_limit": round(_median(runs) / reference, 7),
            **({"peak_rss_mib": max(rss[name])} if name in rss else {}),
        }
        for name, runs in times.items()
    }
    results["cold"] |= {
        "read_s": round(_median(cold_split["read_s"]), 3),
        "page_s": round(_median(cold_split["page_s"]), 6),
    }
    results["dashboard"] = {"first_page_s": round(http_first_s, 1)}
    results["follower"] = {"read_s": round(follow_s, 1), "rss_growth_mib": round(follow_rss)}
    results["fill_s"] = round(fill_s, 1)
    results["checkpoint_s"] = round(checkpoint_s, 1)
    results["fill"] = how
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(
        argv,
        "bench.schedule_index",
        __doc__ or "",
        1_000_000,
        RESULTS,
        fill=("publish", "journal"),
    )
    load_before = machine_load(2.0)
    results = asyncio.run(measure(args.url, args.messages, args.repeats, args.fill))
    print(f"\nfirst page of {args.messages:,} pending, median of {args.repeats}:")
    for name, row in results.items():
        if isinstance(row, dict) and "median_s" in row:
            rss = f"  peak RSS {row['peak_rss_mib']:.0f} MiB" if "peak_rss_mib" in row else ""
            print(
                f"  {name:<12} {row['median_s'] * 1000:>10.3f} ms  "
                f"{row['ratio_to_limit']:>8.4f} x limit{rss}"
            )
    cold = results["cold"]
    print(f"  cold split: read {cold['read_s']:.2f} s, page {cold['page_s'] * 1000:.3f} ms")
    write_results(
        "index",
        ["python", "-m", "bench.schedule_index", *(argv or [])],
        args.url,
        args.out,
        load_before,
        {
            "messages": args.messages,
            "repeats": args.repeats,
            "limit": LIMIT,
            "warm_calls": WARM_CALLS,
            "fill": args.fill,
        },
        results,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
