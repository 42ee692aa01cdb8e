"""What the schedule journal costs and guarantees, measured side by side in one run.

    python -m bench.journal                      # everything, the figures the README shows
    python -m bench.journal --only rate,lead     # parts: rate, list, lead, linger, aside

- ``rate``: ``Publisher.publish_many`` with the journal on and off, alternating rounds into
  two prefixes of the same layout; the median of each and their ratio.
- ``list``: ``scheduled list`` (the Python call and the CLI) over N journal records.
- ``lead``: the smallest lead, cancel confirmed to due time, at which a running worker
  honoured every one of 1,000 cancels (batches of 1,000 messages due at one instant).
- ``linger``: ``AsyncPublisher.publish_many`` called as the e2e workload's pacer calls it
  (a task every 5 ms with the messages due to go, 500 a second, delays 1 to 4 s), with
  ``journal_linger`` 0, 5 ms and 20 ms: journal writes a second, and each call's time
  (p50, p99): what the linger saves the broker, and what it costs a publish.
- ``aside``: a worker's checkpoint at ``--aside-pending`` pending (bodies journaled),
  written as a running worker writes it, in a thread (as before) and in a process of its
  own (:func:`rmqdelay.amqp.checkpoints.write_in_child`), alternating: each write's time,
  and how late the writing process's event loop woke meanwhile (a 5 ms timer, p50 / p99 /
  max): what every delivery in hand waits out.

Each part cleans up its prefixes. Results go to ``bench/results/journal.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_AMQP_URL, now_ms
from rmqdelay import Publisher, Settings, TopologyManager, Worker

RESULTS = Path(__file__).resolve().parent / "results" / "journal.json"
BODY = b"x" * 100


def _settings(url: str, tag: str, **extra: Any) -> Settings:
    options: dict[str, Any] = {"max_delay": "2h", "connection_name": f"bench-{tag}", **extra}
    return Settings(url=url, prefix=f"bench-journal-{tag}-{uuid.uuid4().hex[:6]}", **options)


def _apply(settings: Settings, destinations: list[str]) -> None:
    with TopologyManager(settings) as manager:
        manager.apply(destinations)


def _destroy(settings: Settings) -> None:
    with TopologyManager(settings) as manager:
        manager.destroy(force=True)


# ------------------------------------------------------------------ rate


def _publish_rate(settings: Settings, count: int) -> float:
    requests = [
        {"destination": "rate", "body": BODY, "delay": 600 + (i * 3000) % 3000}
        for i in range(count)
    ]
    with Publisher(settings) as publisher:
        started = time.perf_counter()
        publisher.publish_many(requests)
        return count / (time.perf_counter() - started)


def measure_rate(url: str, count: int, repeats: int) -> dict[str, Any]:
    on, off = _settings(url, "on"), _settings(url, "off", schedule_journal=False)
    for s in (on, off):
        _apply(s, ["rate"])
    rates: dict[str, list[float]] = {"on": [], "off": []}
    try:
        _publish_rate(on, min(count, 2000))  # warm both paths once
        _publish_rate(off, min(count, 2000))
        for _ in range(repeats):
            rates["off"].append(_publish_rate(off, count))
            rates["on"].append(_publish_rate(on, count))
    finally:
        for s in (on, off):
            _destroy(s)
    result: dict[str, Any] = {
        "count": count,
        "repeats": repeats,
        "on_msgs_per_s": statistics.median(rates["on"]),
        "off_msgs_per_s": statistics.median(rates["off"]),
        "runs": rates,
    }
    result["ratio"] = result["on_msgs_per_s"] / result["off_msgs_per_s"]
    print(
        f"rate: journal on {result['on_msgs_per_s']:,.0f} msgs/s, off "
        f"{result['off_msgs_per_s']:,.0f} msgs/s, ratio {result['ratio']:.2f} "
        f"(publish_many of {count}, median of {repeats})"
    )
    return result


# ------------------------------------------------------------------ linger


async def _paced(settings: Settings, rate: int, seconds: float) -> dict[str, Any]:
    """Publish as the e2e pacer does; each call's time, and the journal's writes a second."""
    import random

    from rmqdelay import AsyncPublisher

    rng = random.Random(7)
    times: list[float] = []
    total = int(rate * seconds)
    before = await _journal_writes(settings)  # what topology apply wrote
    async with AsyncPublisher(settings) as publisher:

        async def call(requests: list[dict[str, Any]]) -> None:
            began = time.perf_counter()
            await publisher.publish_many(requests)
            times.append((time.perf_counter() - began) * 1000)

        tasks, sent, started = [], 0, time.perf_counter()
        while sent < total:
            due = min(total, int((time.perf_counter() - started) * rate))
            requests = [
                {"destination": "linger", "body": BODY, "delay": rng.uniform(1, 4)}
                for _ in range(sent, due)
            ]
            sent = due
            if requests:
                tasks.append(asyncio.create_task(call(requests)))
            await asyncio.sleep(0.005)
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - started
    writes = await _journal_writes(settings) - before
    times.sort()
    return {
        "messages": total,
        "calls": len(times),
        "wall_s": round(wall, 2),
        "writes_per_s": round(writes / wall, 1),
        "call_p50_ms": round(times[len(times) // 2], 1),
        "call_p99_ms": round(times[int(len(times) * 0.99)], 1),
    }


async def _journal_writes(settings: Settings) -> int:
    """Stream messages in the journal (each write is one): its last offset, plus one."""
    import aio_pika

    from rmqdelay.amqp.journal import stream_end
    from rmqdelay.core.journal.records import journal_name

    connection = await aio_pika.connect(settings.url.get_secret_value())
    try:
        return await stream_end(connection, journal_name(settings.layout)) + 1
    finally:
        await connection.close()


def measure_linger(url: str, rate: int, seconds: float) -> dict[str, Any]:
    result: dict[str, Any] = {"rate": rate, "seconds": seconds}
    for linger in ("0", "5ms", "20ms"):
        settings = _settings(url, f"linger{linger}", journal_linger=linger)
        _apply(settings, ["linger"])
        try:
            got = asyncio.run(_paced(settings, rate, seconds))
        finally:
            _destroy(settings)
        result[linger] = got
        print(
            f"linger {linger}: {got['writes_per_s']:g} journal writes/s for {rate} msgs/s; "
            f"publish_many p50 {got['call_p50_ms']} ms, p99 {got['call_p99_ms']} ms "
            f"({got['calls']} calls)"
        )
    return result


# ------------------------------------------------------------------ list


def measure_list(url: str, records: int, repeats: int) -> dict[str, Any]:
    settings = _settings(url, "list")
    _apply(settings, ["listed"])
    try:
        with Publisher(settings) as publisher:
            for base in range(0, records, 10_000):
                n = min(10_000, records - base)
                publisher.publish_many(
                    {"destination": "listed", "body": BODY, "delay": 3600 + (i % 600)}
                    for i in range(n)
                )
        python_s, cli_s = [], []
        env = {
            **os.environ,
            "RMQDELAY_URL": settings.url.get_secret_value(),
            "RMQDELAY_PREFIX": settings.prefix,
            "RMQDELAY_MAX_DELAY": "2h",
        }
        rmqdelay = str(Path(sys.executable).with_name("rmqdelay"))
        for _ in range(repeats):
            with Publisher(settings) as publisher:
                started = time.perf_counter()
                found = publisher.list_scheduled()
                python_s.append(time.perf_counter() - started)
            assert len(found) == records, f"listed {len(found)} of {records}"
            started = time.perf_counter()
            subprocess.run(
                [rmqdelay, "scheduled", "list", "--json", "--limit", "10"],
                env=env,
                check=True,
                capture_output=True,
            )
            cli_s.append(time.perf_counter() - started)
    finally:
        _destroy(settings)
    result = {
        "records": records,
        "python_s": statistics.median(python_s),
        "cli_s": statistics.median(cli_s),
    }
    print(
        f"list: {records:,} records read and folded in {result['python_s']:.2f} s "
        f"(Python call), {result['cli_s']:.2f} s (CLI, start-up included), median of {repeats}"
    )
    return result


# ------------------------------------------------------------------ lead


def _cancel_trial(settings: Settings, app_calls: list[str], lead_ms: int, n: int) -> dict[str, Any]:
    """Publish ``n`` messages due at one instant; cancel them all ``lead_ms`` before."""
    app_calls.clear()
    due = datetime.now(timezone.utc) + timedelta(seconds=3)
    with Publisher(settings) as publisher:
        sent = publisher.publish_many(
            {"destination": "lead", "body": BODY, "at": due} for _ in range(n)
        )
    ids = [r.message_id for r in sent]
    due_ms = sent[0].due_at_ms
    # start the cancel so that it is confirmed about lead_ms before the due time: a cancel
    # of n ids takes a while itself, so measure it once and start that much earlier
    with Publisher(settings) as publisher:
        start_at = due_ms - lead_ms - _cancel_cost_ms.get(n, 0)
        time.sleep(max(0.0, (start_at - now_ms()) / 1000))
        started = now_ms()
        results = publisher.cancel(*ids)
        confirmed = now_ms()
    _cancel_cost_ms[n] = confirmed - started
    time.sleep(max(0.0, (due_ms - now_ms()) / 1000) + 2.0)
    called = len(set(app_calls) & set(ids))
    outcome = {
        "target_lead_ms": lead_ms,
        "lead_ms": due_ms - confirmed,
        "cancelled": sum(r.outcome == "cancelled" for r in results),
        "honoured": n - called,
        "messages": n,
    }
    print(
        f"lead: cancel confirmed {outcome['lead_ms']} ms before the due time: "
        f"{outcome['honoured']} of {n} honoured"
    )
    return outcome


_cancel_cost_ms: dict[int, int] = {}


def measure_lead(url: str, leads: list[int], n: int) -> dict[str, Any]:
    settings = _settings(url, "lead")
    _apply(settings, ["lead"])
    calls: list[str] = []
    app = Worker(settings)

    @app.handler("lead")
    def handle(body: bytes, ctx: Any) -> None:
        calls.append(ctx.message_id)

    loop = asyncio.new_event_loop()
    runner = app.runner(settings, concurrency=16, prefetch=500)
    thread = threading.Thread(target=loop.run_until_complete, args=(runner.run(),), daemon=True)
    thread.start()
    trials = []
    try:
        deadline = time.monotonic() + 30
        while not runner.ready.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        _cancel_trial(settings, calls, 1000, n)  # calibrates the cost of a cancel of n ids
        for lead in leads:
            trials.append(_cancel_trial(settings, calls, lead, n))
    finally:
        loop.call_soon_threadsafe(runner.stop)
        thread.join(30)
        _destroy(settings)
    ahead = [t for t in trials if t["lead_ms"] >= 0]
    behind = [t for t in trials if t["lead_ms"] < 0]
    result = {
        "messages": n,
        "trials": trials,
        "smallest_lead_all_honoured_ms": min(
            (t["lead_ms"] for t in ahead if t["honoured"] == n), default=None
        ),
        "every_cancel_before_due_honoured": all(t["honoured"] == n for t in ahead),
        "after_due_honoured": [(t["lead_ms"], t["honoured"]) for t in behind],
    }
    print(
        f"lead: confirmed before the due time: {len(ahead)} trials, all honoured: "
        f"{result['every_cancel_before_due_honoured']}, smallest lead "
        f"{result['smallest_lead_all_honoured_ms']} ms; after it: {result['after_due_honoured']}"
    )
    return result


# ------------------------------------------------------------------ aside


async def _aside_round(settings: Settings, how: str, tag: str) -> dict[str, Any]:
    from rmqdelay.amqp.checkpoints import write_checkpoint, write_in_child
    from rmqdelay.amqp.journal import read_once
    from rmqdelay.core.journal.checkpoint import GENESIS, Mark
    from rmqdelay.core.journal.reading import latest

    found = read_once(settings, latest(settings.layout, 10))
    after = found.latest.id if isinstance(found, Mark) else GENESIS.id
    if how == "thread":
        write = asyncio.to_thread(write_checkpoint, settings, writer=f"bench-{tag}")
    else:
        write = asyncio.to_thread(write_in_child, settings, f"bench-{tag}", after)
    task = asyncio.ensure_future(write)
    lags: list[float] = []
    started = time.perf_counter()
    while not task.done():
        tick = time.perf_counter()
        await asyncio.sleep(0.005)
        lags.append((time.perf_counter() - tick - 0.005) * 1000)
    took = time.perf_counter() - started
    written = task.result()
    assert written.outcome == "written", written
    lags.sort()
    return {
        "how": how,
        "write_s": round(took, 2),
        "lag_p50_ms": round(lags[len(lags) // 2], 1),
        "lag_p99_ms": round(lags[int(len(lags) * 0.99)], 1),
        "lag_max_ms": round(lags[-1], 1),
        "checkpoint_bytes": written.pointer.bytes if written.pointer else None,
    }


def measure_aside(url: str, pending: int, repeats: int) -> dict[str, Any]:
    settings = _settings(url, "aside")
    _apply(settings, ["aside"])
    try:
        with Publisher(settings) as publisher:
            for start in range(0, pending, 10_000):
                publisher.publish_many(
                    {"destination": "aside", "body": BODY, "delay": f"{3600 + i % 3000}s"}
                    for i in range(start, min(pending, start + 10_000))
                )
        first = asyncio.run(_aside_round(settings, "thread", "first"))  # folds the journal
        print(f"aside: {pending:,} pending, the first checkpoint: {first}")
        rounds = [
            asyncio.run(_aside_round(settings, how, f"{how}{n}"))
            for n in range(repeats)
            for how in ("thread", "process")
        ]
    finally:
        _destroy(settings)
    result: dict[str, Any] = {"pending": pending, "rounds": rounds}
    for how in ("thread", "process"):
        mine = [r for r in rounds if r["how"] == how]
        result[how] = {
            k: statistics.median(r[k] for r in mine)
            for k in ("write_s", "lag_p50_ms", "lag_p99_ms", "lag_max_ms")
        }
        print(f"aside: {how}: {result[how]} (medians of {len(mine)})")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--only", default="rate,list,lead")
    parser.add_argument("--count", type=int, default=20_000, help="messages per rate round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records", type=int, default=100_000, help="journal records to list")
    parser.add_argument("--leads", default="500,200,100,50,20,10,5", help="target leads, ms")
    parser.add_argument("--lead-messages", type=int, default=1000)
    parser.add_argument("--linger-rate", type=int, default=500, help="linger: publishes/s")
    parser.add_argument("--linger-seconds", type=float, default=8.0)
    parser.add_argument("--aside-pending", type=int, default=200_000)
    args = parser.parse_args(argv)
    parts = set(args.only.split(","))
    results: dict[str, Any] = {"when": datetime.now(timezone.utc).isoformat()}
    if RESULTS.exists():
        results = {**json.loads(RESULTS.read_text()), **results}
    if "rate" in parts:
        results["rate"] = measure_rate(args.url, args.count, args.repeats)
    if "list" in parts:
        results["list"] = measure_list(args.url, args.records, args.repeats)
    if "lead" in parts:
        leads = [int(x) for x in args.leads.split(",")]
        results["lead"] = measure_lead(args.url, leads, args.lead_messages)
    if "linger" in parts:
        results["linger"] = measure_linger(args.url, args.linger_rate, args.linger_seconds)
    if "aside" in parts:
        results["aside"] = measure_aside(args.url, args.aside_pending, args.repeats)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
