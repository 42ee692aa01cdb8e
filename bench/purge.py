"""Selective purge at scale: ``python -m bench.purge``.

    python -m bench.purge                       # 1,000,000 pending, purge 100,000
    python -m bench.purge --pending 100000      # a quicker look

A fresh prefix; ``pending`` records written raw to the journal as :mod:`bench.history`
fills it (500 to a stream message, confirmed, with checkpoints as a running worker
writes them), spread evenly over 10 destinations (``purge-0`` ... ``purge-9``) and 10
tenants (the header ``tenant``, ``t0`` ... ``t9``, crossing the destinations), due in
the next 1 to 24 hours. The messages are not in the tiers: a purge reads the journal and
writes tombstones, never the tiers. Then, each ``rmqdelay`` command in a fresh process
(:mod:`bench.history_probe`: its peak RSS and the bytes it read), in this order:

- ``count``: ``cancel --destination purge-0 --dry-run --json``, ``--repeats`` times;
- ``one id``: ``cancel ID`` of one pending message (the reference: a cancel of one);
- ``by destination``: ``cancel --destination purge-0 --yes --json``: a tenth;
- ``by header``: ``cancel --header tenant=t1 --yes --json``: a tenth, across the other
  destinations (less those of ``purge-0`` already gone);
- then ``cancel --destination purge-0 --dry-run`` again, which must count 0.

Prints each time with the messages it cancelled, and their rate; writes
``bench/results/purge.json``. The topology is deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_AMQP_URL, machine_load, now_ms
from bench.history import Cell, Filler
from bench.scheduled_list import write_results
from rmqdelay import Settings, TopologyManager

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "purge.json"
SPREAD = 10
CHUNK = 100_000


def line(n: int, now: int) -> str:
    due = now + 3_600_000 + (n * 7919 % 82_800) * 1000
    return (
        f'{{"v":1,"k":"scheduled","id":"p{n}","d":"purge-{n % SPREAD}","due":{due},'
        f'"a":1,"n":100,"t":{now},"h":{{"tenant":"t{n // SPREAD % SPREAD}"}}}}'
    )


def fill(cell: Cell) -> None:
    started = time.perf_counter()
    filler = Filler(cell)
    try:
        now = now_ms()
        for start in range(0, cell.pending, CHUNK):
            stop = min(cell.pending, start + CHUNK)
            filler.records([line(n, now) for n in range(start, stop)])
    finally:
        filler.close()
    cell.fill_s = time.perf_counter() - started


def run(cell: Cell, *argv: str) -> dict[str, Any]:
    """``rmqdelay ARGV`` in a fresh process: wall seconds, peak RSS, what it printed."""
    report = Path(tempfile.mkstemp(prefix="bench-purge-", suffix=".json")[1])
    report.unlink()
    env = {**cell.env, "BENCH_PROBE": str(report)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "bench.history_probe", *argv],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"purge: {' '.join(argv)} exited {done.returncode}: {done.stderr[-800:]}")
    said = json.loads(report.read_text(encoding="utf-8"))
    report.unlink()
    printed = done.stdout.strip().splitlines()
    answer = json.loads(printed[-1]) if printed and printed[-1].startswith("{") else {}
    return {
        "s": round(took, 3),
        "peak_rss_mib": round(said["peak_rss_kb"] / 1024, 1),
        "read_mb": round(said["read_bytes"] / 1e6, 1),
        "answer": answer,
    }


def measure(url: str, pending: int, repeats: int) -> dict[str, Any]:
    settings = Settings(url=url, prefix=f"bench-purge-{uuid.uuid4().hex[:6]}")
    env = {**os.environ, "RMQDELAY_URL": url, "RMQDELAY_PREFIX": settings.prefix}
    cell = Cell(0, pending, settings, env)
    with TopologyManager(settings) as manager:
        manager.apply([f"purge-{d}" for d in range(SPREAD)])
    try:
        fill(cell)
        print(
            f"purge: {pending:,} pending written in {cell.fill_s:.0f} s, "
            f"{cell.checkpoints} checkpoints",
            file=sys.stderr,
        )
        count = [
            run(cell, "cancel", "-d", "purge-0", "--dry-run", "--json") for _ in range(repeats)
        ]
        one = run(cell, "cancel", f"p{SPREAD * 7 + 3}", "--json")
        by_destination = run(cell, "cancel", "-d", "purge-0", "--yes", "--json")
        by_header = run(cell, "cancel", "--header", "tenant=t1", "--yes", "--json")
        after = run(cell, "cancel", "-d", "purge-0", "--dry-run", "--json")
    finally:
        with TopologyManager(settings) as manager:
            manager.destroy(force=True)
    if after["answer"].get("messages") != 0:
        raise SystemExit(f"purge: purge-0 still counts {after['answer']} after its purge")
    expected = pending // SPREAD
    cancelled = by_destination["answer"]["cancelled"]
    if cancelled != expected:
        raise SystemExit(f"purge: cancelled {cancelled} of purge-0, not {expected}")
    return {
        "pending": pending,
        "fill_s": round(cell.fill_s, 1),
        "checkpoints": cell.checkpoints,
        "count_s": statistics.median(r["s"] for r in count),
        "count_runs_s": [r["s"] for r in count],
        "counted": count[0]["answer"]["messages"],
        "one_id_s": one["s"],
        "by_destination": by_destination,
        "by_header": by_header,
        "after_count": after["answer"]["messages"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.purge", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    load_before = machine_load(2.0)
    result = measure(args.url, args.pending, args.repeats)
    for name in ("by_destination", "by_header"):
        row = result[name]
        cancelled = row["answer"]["cancelled"]
        print(
            f"{name:<15} {cancelled:>9,} of {args.pending:,} cancelled in {row['s']:6.2f} s "
            f"({cancelled / row['s']:,.0f} msgs/s), peak RSS {row['peak_rss_mib']:.0f} MiB"
        )
    print(
        f"count (dry run) {result['counted']:>9,} in {result['count_s']:6.2f} s (median of "
        f"{args.repeats}); one id: {result['one_id_s']:.2f} s; after: {result['after_count']}"
    )
    write_results(
        "purge",
        ["python", "-m", "bench.purge", *(argv or [])],
        args.url,
        args.out,
        load_before,
        {"pending": args.pending, "repeats": args.repeats, "spread": SPREAD},
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
