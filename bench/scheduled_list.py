"""``rmqdelay scheduled list`` over a big journal, against a raw read of the same stream.

    python -m bench.scheduled_list                   # 100,000 pending, 3 rounds
    python -m bench.scheduled_list --messages 20000 --repeats 5

Fills a fresh prefix's journal with ``--messages`` pending messages (``publish_many``,
delays of an hour, so none falls due), then times in fresh processes, with each one's
peak RSS (``os.wait4``), in alternating rounds after one untimed warm-up round:

- ``raw``: a pika script (public API only) that appends a marker record to the
  journal, consumes the stream from its first offset with the prefetch and batched acks
  a stream needs, and counts lines until its marker comes back: what reading the
  journal costs a client before any decoding. ``raw json`` also ``json.loads`` each line;
  ``raw list`` does what ``--json`` does, the plain way: it parses each line, keeps each
  copy (a tombstone removes the copies it names), sorts those still ahead by due time
  and id, and prints each as a JSON line (``json.dumps``), into a file as the others.
- ``table``: ``rmqdelay scheduled list`` into a file (not a terminal: plain columns);
- ``json``: ``rmqdelay scheduled list --json``;
- ``limit``: ``rmqdelay scheduled list --limit 20`` (soonest first: the whole journal is
  read, only 20 rows are printed).

The warm-up round checks the output: every message listed once, 20 rows for --limit.
Prints medians and ratios to ``raw``; writes ``bench/results/list.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
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

from bench.common import (
    DEFAULT_AMQP_URL,
    broker_info,
    machine_info,
    machine_load,
    masked,
    now_ms,
)
from rmqdelay import Publisher, Settings, TopologyManager

RESULTS = Path(__file__).resolve().parent / "results" / "list.json"
DESTINATION = "listed"
LIMIT = 20

#: The reference: read the journal stream with pika's public API, no rmqdelay code.
#: A stream has no end to ask for, so, as rmqdelay does, append a marker record and read
#: until it comes back (docs/protocol.md: the journal's records).
RAW = """\
import json, os, sys, time, uuid
import pika
mode = sys.argv[2]
marker = "marker-" + str(uuid.uuid4())
connection = pika.BlockingConnection(pika.URLParameters(os.environ["RMQDELAY_URL"]))
channel = connection.channel()
channel.confirm_delivery()
line = json.dumps({"v": 1, "k": "marker", "id": marker, "t": int(time.time() * 1000)})
channel.basic_publish(sys.argv[1], "", line.encode(), mandatory=True)
channel.basic_qos(prefetch_count=2000)
needle = json.dumps(marker).encode()
lines = 0
unacked = 0
copies = {}
for method, _properties, body in channel.consume(
    sys.argv[1], arguments={"x-stream-offset": "first"}
):
    unacked += 1
    if unacked >= 500:
        channel.basic_ack(method.delivery_tag, multiple=True)
        unacked = 0
    split = body.split(b"\\n")
    lines += len(split)
    if mode == "json":
        for text in split:
            json.loads(text)
    elif mode == "list":
        for text in split:
            record = json.loads(text)
            if record["k"] == "scheduled":
                copies[record["id"], record["due"]] = record
            elif record["k"] == "cancelled":
                for due in (*record.get("c", ()), record.get("due")):
                    copies.pop((record["id"], due), None)
    if needle in body:
        break
connection.close()
if mode != "list":
    print(lines)
    sys.exit()
now = int(time.time() * 1000)
pending = sorted(
    (r for (_id, due), r in copies.items() if due > now), key=lambda r: (r["due"], r["id"])
)
dumps = json.dumps
sys.stdout.write("".join(
    dumps(
        {"message_id": r["id"], "destination": r["d"], "due_at_ms": r["due"],
         "attempt": r.get("a", 1), "body_size": r.get("n", 0), "headers": r.get("h", {})},
        separators=(",", ":"),
    ) + "\\n"
    for r in pending
))
"""


def prepare(url: str, name: str = "list") -> tuple[Settings, dict[str, str]]:
    """A fresh prefix (``bench-{name}-...``) with its topology for :data:`DESTINATION`,
    and the environment the timed commands run with (its settings)."""
    settings = Settings(
        url=url,
        prefix=f"bench-{name}-{uuid.uuid4().hex[:6]}",
        max_delay="2h",
        connection_name="bench",
    )
    with TopologyManager(settings) as manager:
        manager.apply([DESTINATION])
    env = {
        **os.environ,
        "RMQDELAY_URL": url,
        "RMQDELAY_PREFIX": settings.prefix,
        "RMQDELAY_MAX_DELAY": "2h",
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return settings, env


def fill(settings: Settings, messages: int) -> float:
    """Publish ``messages`` pending messages; the seconds it took."""
    started = time.perf_counter()
    with Publisher(settings) as publisher:
        for base in range(0, messages, 10_000):
            publisher.publish_many(
                {"destination": DESTINATION, "body": b"x" * 100, "delay": 3600 + i % 600}
                for i in range(min(10_000, messages - base))
            )
    return time.perf_counter() - started


#: Runs a command and says its wall time and peak RSS on its last stderr line. A child
#: of the bench itself would not do: Linux carries the parent's peak RSS into a forked
#: child's (through exec), so no command would read below the bench's own; this launcher
#: is a small process, and what it starts gets its own figure.
LAUNCH = """\
import os, sys, time
started = time.perf_counter()
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)
_pid, status, usage = os.wait4(pid, 0)
elapsed = time.perf_counter() - started
sys.stderr.write(f"\\nlaunch: {elapsed} {usage.ru_maxrss}\\n")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Run ``argv`` to its end, its output into a file (as ``> file`` would): wall
    seconds, peak RSS in MiB, and its stdout."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        done = subprocess.run(
            [sys.executable, "-c", LAUNCH, *argv], env=env, stdout=out, stderr=err, check=False
        )
        err.seek(0)
        said = err.read()
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:4])} exited {done.returncode}: {said[-800:]}")
        elapsed, peak_kb = said.rsplit("launch: ", 1)[1].split()
        out.seek(0)
        return float(elapsed), int(peak_kb) / 1024, out.read()


def commands(python: str, rmqdelay: str, stream: str) -> dict[str, list[str]]:
    listing = [rmqdelay, "scheduled", "list"]
    return {
        "raw": [python, "-c", RAW, stream, "count"],
        "raw json": [python, "-c", RAW, stream, "json"],
        "raw list": [python, "-c", RAW, stream, "list"],
        "table": listing,
        "json": [*listing, "--json"],
        "limit": [*listing, "--limit", str(LIMIT)],
    }


def check(name: str, out: str, messages: int) -> None:
    """The warm-up round's output is the whole schedule (or its first ``LIMIT``)."""
    lines = out.splitlines()
    if name in ("json", "raw list"):
        ids = {json.loads(line)["message_id"] for line in lines}
        assert len(lines) == len(ids) == messages, f"--json listed {len(lines)} of {messages}"
    elif name == "table":
        assert len(lines) == messages + 3, f"the table has {len(lines)} lines for {messages}"
    elif name == "limit":
        assert len(lines) == LIMIT + 3, f"--limit {LIMIT} printed {len(lines)} lines"
    else:
        assert int(out) >= messages, f"the raw read saw {out.strip()} lines"


def measure(url: str, messages: int, repeats: int) -> dict[str, Any]:
    settings, env = prepare(url)
    todo = commands(
        sys.executable,
        str(Path(sys.executable).with_name("rmqdelay")),
        f"{settings.prefix}.schedule",
    )
    times: dict[str, list[float]] = {name: [] for name in todo}
    rss: dict[str, list[float]] = {name: [] for name in todo}
    try:
        fill_s = fill(settings, messages)
        print(f"list: {messages:,} pending published in {fill_s:.1f} s", file=sys.stderr)
        for name, argv in todo.items():  # warm-up: caches, and the output checked
            check(name, run(argv, env)[2], messages)
        for _ in range(repeats):
            for name, argv in todo.items():
                elapsed, peak, _out = run(argv, env)
                times[name].append(round(elapsed, 3))
                rss[name].append(round(peak, 1))
    finally:
        with TopologyManager(settings) as manager:
            manager.destroy(force=True)
    reference = statistics.median(times["raw"])
    return {
        name: {
            "median_s": round(statistics.median(runs), 3),
            "runs_s": runs,
            "peak_rss_mib": max(rss[name]),
            "ratio_to_raw": round(statistics.median(runs) / reference, 2),
        }
        for name, runs in times.items()
    } | {"fill_s": round(fill_s, 1)}


def write_results(
    workload: str,
    command: list[str],
    url: str,
    out: Path,
    load_before: dict[str, Any],
    params: dict[str, Any],
    results: dict[str, Any],
) -> None:
    """Say the load after; write the workload's JSON (machine, broker, load, params);
    a URL in ``command`` is written masked (no password in a results file)."""
    command = masked(command)
    load_after = [round(v, 2) for v in os.getloadavg()]
    print(f"load average before {load_before['loadavg']}, after {load_after}")
    doc = {
        "workload": workload,
        "generated_at_ms": now_ms(),
        "command": command,
        "machine": machine_info(),
        "broker": asyncio.run(broker_info(url)),
        "load_before": load_before,
        "load_after": {"loadavg": load_after},
        "params": params,
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")


def parse_args(
    argv: list[str] | None,
    module: str,
    doc: str,
    messages: int,
    out: Path,
    fill: tuple[str, ...] = (),
) -> argparse.Namespace:
    """``--url``, ``--messages``, ``--repeats``, ``--out``: this bench's and
    :mod:`bench.schedule_index`'s, each with its own defaults; ``--fill`` when ``fill``
    names its choices (the first is the default)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--messages", type=int, default=messages)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=out)
    if fill:
        parser.add_argument("--fill", choices=fill, default=fill[0])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, "bench.scheduled_list", __doc__ or "", 100_000, RESULTS)
    load_before = machine_load(2.0)
    results = measure(args.url, args.messages, args.repeats)
    print(f"\nscheduled list of {args.messages:,} pending, median of {args.repeats}:")
    for name, row in results.items():
        if isinstance(row, dict):
            print(
                f"  {name:<8} {row['median_s']:>6.2f} s  {row['ratio_to_raw']:>5.2f} x raw  "
                f"peak RSS {row['peak_rss_mib']:.0f} MiB"
            )
    write_results(
        "list",
        ["python", "-m", "bench.scheduled_list", *(argv or [])],
        args.url,
        args.out,
        load_before,
        {"messages": args.messages, "repeats": args.repeats, "limit": LIMIT},
        results,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
